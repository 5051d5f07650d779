"""relaybox's migrations applied over a *synchronous* SQLAlchemy ``Connection`` in the
caller's transaction: the same files and the same ``relaybox_migrations`` records as
:meth:`Store.migrate`, so a host framework's migration (Django's ``manage.py
migrate``) and ``relaybox migrate`` agree on what is applied."""

from __future__ import annotations

import time

from sqlalchemy import Connection, text

from relaybox.store.backend import load_migrations

__all__ = ["latest_migration", "migrate_sync", "migrations_applied_sync"]

_FLOAT = {"postgresql": "DOUBLE PRECISION", "sqlite": "REAL"}
_BACKEND = {"postgresql": "postgres", "sqlite": "sqlite"}


def _backend(conn: Connection) -> str:
    name = conn.dialect.name
    if name not in _BACKEND:
        raise ValueError(f"relaybox runs on PostgreSQL or SQLite, not {name}")
    return _BACKEND[name]


def latest_migration(backend: str) -> int:
    """The highest migration version relaybox ships for ``backend``."""
    return max(v for v, _, _ in load_migrations(backend))


def migrations_applied_sync(conn: Connection) -> set[int]:
    """The versions recorded in ``relaybox_migrations`` (none before the first)."""
    from sqlalchemy import inspect

    if not inspect(conn).has_table("relaybox_migrations"):
        return set()
    return {r[0] for r in conn.execute(text("SELECT version FROM relaybox_migrations"))}


def migrate_sync(conn: Connection, upto: int | None = None) -> list[str]:
    """Apply relaybox's migrations up to version ``upto`` (all when ``None``) that
    ``relaybox_migrations`` does not record, in ``conn``'s transaction; return their
    names. Concurrent migrators wait for each other (PostgreSQL: the advisory lock
    :meth:`Store.migrate` takes)."""
    backend = _backend(conn)
    if backend == "postgres":
        conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('relaybox_migrate'))"))
    conn.execute(
        text(
            "CREATE TABLE IF NOT EXISTS relaybox_migrations (version INTEGER PRIMARY KEY,"
            f" name TEXT NOT NULL, applied_at {_FLOAT[conn.dialect.name]} NOT NULL)"
        )
    )
    done = migrations_applied_sync(conn)
    applied: list[str] = []
    for version, name, statements in load_migrations(backend):
        if version in done or (upto is not None and version > upto):
            continue
        for statement in statements:
            conn.exec_driver_sql(statement)
        conn.execute(
            text("INSERT INTO relaybox_migrations (version, name, applied_at) VALUES (:v, :n, :t)"),
            {"v": version, "n": name, "t": time.time()},
        )
        applied.append(f"{version:04d}_{name}")
    return applied
