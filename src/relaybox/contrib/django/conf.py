"""``settings.RELAYBOX`` → the project's ``Relaybox``."""

from __future__ import annotations

import os
from typing import Any

from django.conf import settings
from django.utils.module_loading import import_string

from relaybox.app import Relaybox
from relaybox.config import Settings, load_settings
from relaybox.contrib.django.errors import ImproperlyConfigured
from relaybox.errors import ConfigurationError

__all__ = ["build_box", "follow_database"]


def build_box() -> Relaybox:
    """The box named or described by ``settings.RELAYBOX``:

    - a dict: relaybox settings, as in ``relaybox.toml`` (``sources``, ``worker``,
      ``outbound``…), under the ``RELAYBOX_*`` environment variables as a
      ``relaybox.toml`` is (``RELAYBOX_DATABASE_URL`` aside: the database is
      Django's); ``migrate`` defaults to ``"check"`` (``manage.py migrate`` creates
      the tables);
    - a string: the dotted path of a ``Relaybox`` (or of a function returning one)
      defined in the project.

    Either way its database is Django's (``RELAYBOX_DATABASE``, see
    :func:`follow_database`) and its synchronous transactions are ``atomic()`` blocks
    on Django's connection."""
    from relaybox.contrib.django.alias import database_alias
    from relaybox.contrib.django.db import sync_transaction

    configured: Any = getattr(settings, "RELAYBOX", {})
    if isinstance(configured, str):
        try:
            obj = import_string(configured)
        except ImportError as exc:
            raise ImproperlyConfigured(f"settings.RELAYBOX = {configured!r}: {exc}") from None
        box = obj() if callable(obj) and not isinstance(obj, Relaybox) else obj
        if not isinstance(box, Relaybox):
            raise ImproperlyConfigured(
                f"settings.RELAYBOX = {configured!r} is a {type(box).__name__}, not a Relaybox"
            )
    elif isinstance(configured, dict):
        options = dict(configured)
        if "database_url" in options:
            raise ImproperlyConfigured(
                "settings.RELAYBOX: relaybox uses Django's database; name its alias with "
                "settings.RELAYBOX_DATABASE instead of database_url"
            )
        options.setdefault("migrate", "check")
        try:
            box = Relaybox(settings=_settings(options))
        except ConfigurationError as exc:
            raise ImproperlyConfigured(f"settings.RELAYBOX: {exc}") from None
    else:
        raise ImproperlyConfigured(
            "settings.RELAYBOX must be a dict of relaybox settings or the dotted path "
            f"of a Relaybox, not {type(configured).__name__}"
        )

    def provider() -> Any:
        return sync_transaction(database_alias())

    box.sync_transaction = provider
    return box


def follow_database(box: Relaybox, using: str) -> None:
    """Point ``box`` at the database ``DATABASES[using]`` names now, if that is not
    the one it uses (first use, a test runner's test database): its connections to
    the other one are closed first."""
    from relaybox.contrib.django.db import async_database_url
    from relaybox.contrib.django.portal import close_box

    url = async_database_url(using)
    if box.settings.database_url != url:
        close_box(box)
        box.settings = box.settings.model_copy(update={"database_url": url})


def _settings(options: dict[str, Any]) -> Settings:
    """``options`` under the environment's ``RELAYBOX_*`` variables, as a
    ``relaybox.toml`` is; not ``RELAYBOX_DATABASE_URL`` (Django's database is used)."""
    env = {k: v for k, v in os.environ.items() if k != "RELAYBOX_DATABASE_URL"}
    return load_settings(env=env, given=options)
