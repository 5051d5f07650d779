"""relaybox inside a Django project.

``INSTALLED_APPS += ["relaybox.contrib.django"]``, ``settings.RELAYBOX`` (a dict of
relaybox settings, or the dotted path of a ``Relaybox`` of the project), ``manage.py
migrate``, then ``path("webhooks/", include("relaybox.contrib.django.urls"))``.
relaybox uses the database ``DATABASES[settings.RELAYBOX_DATABASE]`` (default
``"default"``); synchronous handlers run inside ``transaction.atomic()`` on Django's
connection, and :func:`publish` writes in the caller's ``atomic()`` block.
"""

from __future__ import annotations

from typing import Any

from relaybox.contrib.django.alias import database_alias
from relaybox.contrib.django.project import get_box, publish, reset_box

__all__ = ["box", "database_alias", "get_box", "publish", "reset_box"]


def __getattr__(name: str) -> Any:
    if name == "box":  # ``from relaybox.contrib.django import box``
        return get_box()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
