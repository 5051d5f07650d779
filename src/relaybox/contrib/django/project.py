"""The project's box: built once from ``settings.RELAYBOX`` on Django's database
(:func:`get_box`), forgotten by :func:`reset_box`, and :func:`publish` in the
caller's ``transaction.atomic()`` block."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from relaybox.contrib.django.alias import database_alias

if TYPE_CHECKING:
    from relaybox.app import Relaybox

__all__ = ["get_box", "publish", "reset_box"]

_lock = threading.RLock()
_box: Relaybox | None = None


def get_box() -> Relaybox:
    """The project's ``Relaybox``, built once from ``settings.RELAYBOX``: its
    database is Django's, its synchronous transactions are Django's ``atomic()``."""
    global _box
    from relaybox.contrib.django.conf import build_box, follow_database

    with _lock:
        if _box is None:
            _box = build_box()
        follow_database(_box, database_alias())
        return _box


def reset_box() -> None:
    """Forget the box built from the settings, its connections closed (the next
    :func:`get_box` builds a new one from ``settings.RELAYBOX``)."""
    global _box
    with _lock:
        if _box is not None:
            from relaybox.contrib.django.portal import close_box

            close_box(_box)
        _box = None


def publish(
    event_type: str,
    data: Any,
    *,
    tenant: str,
    idempotency_key: str | None = None,
    **options: Any,
) -> Any:
    """Publish an outbound event in the caller's ``transaction.atomic()`` block, on
    Django's connection: its message and outbox rows commit with the application's
    change or roll back with it, and the dispatcher delivers them once committed.
    Options and answer (the message) as :meth:`Relaybox.publish_sync`."""
    from relaybox.contrib.django.db import connection

    box = get_box()
    with connection(database_alias()) as conn:
        return box.publish_sync(
            conn, event_type, data, tenant=tenant, idempotency_key=idempotency_key, **options
        )
