"""The store: one object per area of statements over one backend.

A backend (:class:`~relaybox.store.backend.Backend`) owns an SQLAlchemy 2 async
engine (aiosqlite / asyncpg). Every query it runs is a named block of its SQL file
(``sql/<backend>.sql``), executed as driver SQL on the connection of the current
transaction, so the handler's ``AsyncConnection`` and relaybox's own statements
share one transaction.

:class:`Store` holds the backend (:attr:`Store.db`) and one object per area, each
holding that backend: ``store.inbox`` (:class:`~relaybox.store.inbox.InboxStore`),
``store.outbox``, ``store.dispatch``, ``store.credentials``, ``store.catalog``,
``store.flow``, ``store.erasure``, ``store.history``, ``store.keys``,
``store.retention``, ``store.silence``, ``store.sessions``, ``store.operator``,
``store.partitions``.
A method is named for what it does within its area: one that began with the area's
name lost it there (``store.inbox.claim``, ``store.erasure.get``,
``store.keys.backfill``); the others kept theirs (``store.outbox.endpoint_create``).
The methods that take a ``conn`` run inside a transaction the caller opened with
:meth:`Store.transaction`.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from relaybox.store.backend import Backend, load_migrations
from relaybox.store.credentials import CredentialsStore
from relaybox.store.dispatch import DispatchStore
from relaybox.store.erasure import ErasureStore
from relaybox.store.history import HistoryStore
from relaybox.store.inbox import InboxStore
from relaybox.store.keys_store import KeysStore
from relaybox.store.operator import OperatorStore
from relaybox.store.outbox import OutboxStore
from relaybox.store.outbox_catalog import CatalogStore
from relaybox.store.outbox_flow import FlowStore
from relaybox.store.partitions_store import PartitionsStore
from relaybox.store.retention import RetentionStore
from relaybox.store.sessions import SessionStore
from relaybox.store.silence import SilenceStore
from relaybox.store.sync import SyncStore, sync_store

__all__ = ["Store"]


class Store:
    """The areas of statements over one backend. The backends' stores
    (:class:`~relaybox.store.postgres.PostgresStore`,
    :class:`~relaybox.store.sqlite.SQLiteStore`) build their backend and the areas
    that backend runs its own way (``inbox``, ``dispatch``)."""

    def __init__(
        self,
        db: Backend,
        *,
        inbox: InboxStore,
        dispatch: type[DispatchStore],
        keys: type[KeysStore] = KeysStore,
        partitions: type[PartitionsStore] = PartitionsStore,
    ) -> None:
        self.db = db
        self.inbox = inbox
        self.credentials = CredentialsStore(db)
        self.outbox = OutboxStore(db, self.credentials)
        self.dispatch = dispatch(db, self.outbox)
        self.catalog = CatalogStore(db)
        self.flow = FlowStore(db)
        self.erasure = ErasureStore(db)
        self.history = HistoryStore(db)
        self.keys = keys(db)
        self.partitions = partitions(db, self.keys)
        self.retention = RetentionStore(db)
        self.silence = SilenceStore(db)
        self.sessions = SessionStore(db)
        self.operator = OperatorStore(db)
        self._sync: SyncStore | None = None

    @property
    def backend(self) -> str:
        """``sqlite`` or ``postgres``."""
        return self.db.backend

    @property
    def url(self) -> str:
        return self.db.url

    @property
    def engine(self) -> AsyncEngine:
        return self.db.engine

    # -- lifecycle --------------------------------------------------------------

    async def close(self) -> None:
        if self._sync is not None:
            self._sync.close()
        await self.db.close()

    @property
    def sync(self) -> SyncStore:
        """The synchronous side of this store (:mod:`relaybox.store.sync`): the same
        statements over a sync ``Connection``, and a sync engine of its own made on
        first use."""
        if self._sync is None:
            self._sync = sync_store(self.db)
        return self._sync

    def connect(self) -> AbstractAsyncContextManager[AsyncConnection]:
        """A connection with an open transaction, committed on success."""
        return self.db.connect()

    transaction = connect

    async def migrate(self) -> list[str]:
        """Apply the migrations not yet applied; return their names."""
        applied: list[str] = []
        async with self.connect() as conn:
            await self.db.lock_migrations(conn)
            await conn.exec_driver_sql(
                "CREATE TABLE IF NOT EXISTS relaybox_migrations (version INTEGER PRIMARY KEY,"
                f" name TEXT NOT NULL, applied_at {self.db.float_type} NOT NULL)"
            )
            done = {
                r[0] for r in await conn.exec_driver_sql("SELECT version FROM relaybox_migrations")
            }
            for version, name, statements in load_migrations(self.backend):
                if version in done:
                    continue
                for statement in statements:
                    await conn.exec_driver_sql(statement)
                await conn.exec_driver_sql(self.db.insert_migration_sql(), (version, name, _now()))
                applied.append(f"{version:04d}_{name}")
        return applied

    async def schema_version(self) -> tuple[int, int]:
        """(applied, latest known) migration versions; applied is 0 on an empty database
        and is reported as the highest version below which every migration is applied
        (a database missing 0003 but carrying 0005 is not up to date)."""
        known = sorted(v for v, _, _ in load_migrations(self.backend))
        async with self.connect() as conn:
            if not await self._has_migrations_table(conn):
                return (0, known[-1])
            done = {
                r[0] for r in await conn.exec_driver_sql("SELECT version FROM relaybox_migrations")
            }
        applied = 0
        for version in known:
            if version not in done:
                break
            applied = version
        return (applied, known[-1])

    async def _has_migrations_table(self, conn: AsyncConnection) -> bool:
        """Whether ``migrate`` ever ran (other errors must surface, not read as 0)."""
        from sqlalchemy import inspect

        return bool(
            await conn.run_sync(lambda sync: inspect(sync).has_table("relaybox_migrations"))
        )

    # -- ad hoc reads -------------------------------------------------------------

    async def fetch_all(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Rows of an ad-hoc read as dicts (tests and operator tools)."""
        async with self.connect() as conn:
            result = await conn.exec_driver_sql(sql, tuple(params))
            return [dict(r._mapping) for r in result]


def _now() -> float:
    import time

    return time.time()
