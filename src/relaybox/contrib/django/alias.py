"""Which of Django's databases relaybox uses."""

from __future__ import annotations

__all__ = ["database_alias"]


def database_alias() -> str:
    """The Django database relaybox runs on: ``settings.RELAYBOX_DATABASE``, default
    ``"default"``."""
    from django.conf import settings

    return str(getattr(settings, "RELAYBOX_DATABASE", "default"))
