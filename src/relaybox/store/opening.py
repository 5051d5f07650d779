"""Opening a store: the backend a database URL names (SQLite or PostgreSQL)."""

from __future__ import annotations

from relaybox.errors import ConfigurationError
from relaybox.store.base import Store

__all__ = ["check_database_url", "open_store"]


def open_store(url: str, *, worker_chains: int | None = None, **options: object) -> Store:
    """A store for ``url``: ``sqlite:///path/to/file.db`` or ``postgresql://…``.

    ``worker_chains``: connections the worker's chains hold at once while their events
    run. A pooled backend (PostgreSQL) sizes its pool for them and for the other roles
    besides, unless ``pool_size`` is given; SQLite has one connection either way
    (``pool_size``, ``max_overflow`` and ``idle_in_transaction_timeout`` are ignored
    there)."""
    scheme = check_database_url(url)
    if scheme == "sqlite":
        from relaybox.store.sqlite import SQLiteStore

        options.pop("pool_size", None)
        options.pop("max_overflow", None)
        options.pop("idle_in_transaction_timeout", None)
        return SQLiteStore(url, **options)  # type: ignore[arg-type]
    if scheme in ("postgresql", "postgres"):
        from relaybox.store.postgres import PostgresStore

        if worker_chains is not None:
            options.setdefault("pool_size", max(10, worker_chains + 2))

        return PostgresStore(url.replace("postgres://", "postgresql://", 1), **options)  # type: ignore[arg-type]
    raise AssertionError(scheme)  # check_database_url refused it


def check_database_url(url: str) -> str:
    """The backend of ``url`` (``sqlite`` or ``postgresql``), or
    :class:`ConfigurationError` naming what is wrong with it."""
    scheme = url.split(":", 1)[0].split("+", 1)[0].lower()
    if scheme == "sqlite":
        return "sqlite"
    if scheme in ("postgresql", "postgres"):
        return scheme
    raise ConfigurationError(
        f"unsupported database URL scheme {scheme!r}: use sqlite:///file.db or postgresql://…"
    )
