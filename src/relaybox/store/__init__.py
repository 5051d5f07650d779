"""Storage backends behind one interface: SQLite (default) and PostgreSQL."""

from __future__ import annotations

from relaybox.errors import ConfigurationError
from relaybox.store.base import (
    AcceptOutcome,
    Claim,
    InboxEvent,
    NewDelivery,
    OutboxRow,
    Stats,
    Store,
)

__all__ = [
    "AcceptOutcome",
    "Claim",
    "InboxEvent",
    "NewDelivery",
    "OutboxRow",
    "Stats",
    "Store",
    "open_store",
]


def open_store(url: str, **options: object) -> Store:
    """A store for ``url``: ``sqlite:///path/to/file.db`` or ``postgresql://…``."""
    scheme = url.split(":", 1)[0].split("+", 1)[0].lower()
    if scheme == "sqlite":
        from relaybox.store.sqlite import SQLiteStore

        return SQLiteStore(url, **options)  # type: ignore[arg-type]
    if scheme in ("postgresql", "postgres"):
        from relaybox.store.postgres import PostgresStore

        return PostgresStore(url.replace("postgres://", "postgresql://", 1), **options)  # type: ignore[arg-type]
    raise ConfigurationError(
        f"unsupported database URL scheme {scheme!r}: use sqlite:///file.db or postgresql://…"
    )
