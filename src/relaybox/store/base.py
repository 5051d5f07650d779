"""The store interface shared by the SQLite and PostgreSQL backends.

A backend owns an SQLAlchemy 2 async engine (aiosqlite / asyncpg). Every query it
runs is a named block of its SQL file (``sql/<backend>.sql``), executed as driver
SQL on the connection of the current transaction, so the handler's
``AsyncConnection`` and relaybox's own statements share one transaction.

Methods are noun-then-verb (``inbox_accept``, ``inbox_claim``); the ones that take a
``conn`` run inside a transaction the caller opened with :meth:`Store.transaction`.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from importlib import resources
from typing import Any, ClassVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from relaybox.store import keys, partitions
from relaybox.store.credentials import CredentialsStore
from relaybox.store.dispatch import DispatchStore
from relaybox.store.erasure import ErasureStore
from relaybox.store.history import HistoryStore
from relaybox.store.inbox_rows import (
    AcceptOutcome,
    Claim,
    InboxEvent,
    Listener,
    NewDelivery,
    Stats,
)
from relaybox.store.keys_store import KeysStore
from relaybox.store.operator import OperatorStore
from relaybox.store.outbox import OutboxStore
from relaybox.store.outbox_catalog import CatalogStore
from relaybox.store.outbox_flow import FlowStore
from relaybox.store.processing import Processing
from relaybox.store.retention import RetentionStore
from relaybox.store.sessions import SessionStore
from relaybox.store.silence import SilenceStore
from relaybox.store.sync import SyncStore, sync_store

__all__ = ["OutboxRow", "Store", "load_queries"]


_BLOCK = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def load_queries(backend: str) -> dict[str, str]:
    """Named SQL blocks of ``sql/<backend>.sql`` and ``sql/<backend>_<area>.sql``
    (one file per area: core, outbound, ordering, operations), comment lines dropped.
    A name defined twice is an error."""
    folder = resources.files("relaybox.store").joinpath("sql")
    queries: dict[str, str] = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if not re.fullmatch(rf"{backend}(_\w+)?\.sql", entry.name):
            continue
        parts = _BLOCK.split(entry.read_text())
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in queries:
                raise RuntimeError(f"query {name!r} is defined twice ({entry.name})")
            lines = [ln for ln in body.splitlines() if not ln.lstrip().startswith("--")]
            queries[name] = "\n".join(lines).strip()
    return queries


def load_migrations(backend: str) -> list[tuple[int, str, list[str]]]:
    """(version, name, statements) for every migration file of ``backend``, in order."""
    folder = resources.files("relaybox.store").joinpath(f"migrations/{backend}")
    found = []
    for entry in folder.iterdir():
        m = re.fullmatch(r"(\d{4})_(\w+)\.sql", entry.name)
        if not m:
            continue
        body = "\n".join(
            ln for ln in entry.read_text().splitlines() if not ln.lstrip().startswith("--")
        )
        statements = [s.strip() for s in body.split(";") if s.strip()]
        found.append((int(m.group(1)), m.group(2), statements))
    return sorted(found)


class Store(
    CredentialsStore,
    ErasureStore,
    HistoryStore,
    KeysStore,
    OperatorStore,
    OutboxStore,
    RetentionStore,
    DispatchStore,
    SilenceStore,
    FlowStore,
    CatalogStore,
    SessionStore,
    Processing,
):
    """Base class of the backends. Subclasses set ``backend`` and build ``engine``."""

    backend: ClassVar[str]
    float_type: ClassVar[str] = "DOUBLE PRECISION"
    engine: AsyncEngine
    url: str

    def __init__(self) -> None:
        self.q = load_queries(self.backend)
        self._sync: SyncStore | None = None

    # -- lifecycle --------------------------------------------------------------

    async def close(self) -> None:
        if self._sync is not None:
            self._sync.close()
        await self.engine.dispose()

    @property
    def sync(self) -> SyncStore:
        """The synchronous side of this store (:mod:`relaybox.store.sync`): the same
        statements over a sync ``Connection``, and a sync engine of its own made on
        first use."""
        if self._sync is None:
            self._sync = sync_store(self)
        return self._sync

    async def warm_accept(self, connections: int) -> None:
        """Open what the accept path uses before the first request needs it (the
        PostgreSQL store: its connections, its statement prepared on each). Nothing
        to do here."""

    @asynccontextmanager
    async def connect(self) -> AsyncIterator[AsyncConnection]:
        """A connection with an open transaction, committed on success."""
        async with self.engine.connect() as conn, conn.begin():
            yield conn

    transaction = connect

    async def migrate(self) -> list[str]:
        """Apply the migrations not yet applied; return their names."""
        applied: list[str] = []
        async with self.connect() as conn:
            await self._lock_migrations(conn)
            await conn.exec_driver_sql(
                "CREATE TABLE IF NOT EXISTS relaybox_migrations (version INTEGER PRIMARY KEY,"
                f" name TEXT NOT NULL, applied_at {self.float_type} NOT NULL)"
            )
            done = {
                r[0] for r in await conn.exec_driver_sql("SELECT version FROM relaybox_migrations")
            }
            for version, name, statements in load_migrations(self.backend):
                if version in done:
                    continue
                for statement in statements:
                    await conn.exec_driver_sql(statement)
                await conn.exec_driver_sql(self._sql_insert_migration(), (version, name, _now()))
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

    async def _lock_migrations(self, conn: AsyncConnection) -> None:
        """Serialise concurrent migrators (PostgreSQL: advisory lock)."""

    def _sql_insert_migration(self) -> str:
        raise NotImplementedError

    # -- time partitions (PostgreSQL; relaybox.store.partitions) -------------------

    async def partitions_tables(self) -> set[str]:
        """The history tables partitioned by time (none on SQLite)."""
        return set()

    async def partitions_convert(
        self, period: str, *, before_switch: Callable[[str, str], Any] | None = None
    ) -> list[str]:
        """Partition the history tables by ``period`` (``day``, ``week``): PostgreSQL
        only (:func:`relaybox.store.partitions.convert`)."""
        raise NotImplementedError("time partitions need PostgreSQL")

    async def partitions_maintain(
        self,
        period: str,
        *,
        ahead: int = 3,
        drop: partitions.Drop | None = None,
        before_drop: Callable[[str, str], Any] | None = None,
    ) -> partitions.MaintainResult:
        """Partitions made ahead and old ones dropped (PostgreSQL; nothing here)."""
        return partitions.MaintainResult()

    # -- accept -----------------------------------------------------------------

    async def inbox_accept(self, batch: Sequence[NewDelivery]) -> list[AcceptOutcome]:
        """Insert a batch in one transaction, committed once (group commit).
        See :meth:`inbox_insert` for the outcomes."""
        async with self.connect() as conn:
            return await self.inbox_insert(conn, batch)

    async def inbox_insert(
        self, conn: AsyncConnection, batch: Sequence[NewDelivery]
    ) -> list[AcceptOutcome]:
        """Insert deliveries in the caller's transaction.

        For each delivery: ``accepted`` (a new row), ``duplicate`` (the key exists
        with the same fingerprint: nothing changes), ``quarantined`` (the key exists
        with another fingerprint: the newcomer is stored apart), or ``ignored``
        (a new row recorded as ignored). Raises on any database error: the caller
        answers 503 to the deliveries of the batch (see :meth:`row_error`).
        """
        raise NotImplementedError

    def row_error(self, exc: BaseException) -> bool:
        """Whether ``exc``, raised by :meth:`inbox_accept`, comes from what a row
        holds (a value the driver cannot encode, or the database refuses) rather
        than from the database being unreachable: the acceptor then commits the
        batch's rows apart, so that only the refused one fails. Here: values that
        could not be converted (``UnicodeEncodeError`` is a ``ValueError``)."""
        return isinstance(exc, ValueError | TypeError)

    # -- reads --------------------------------------------------------------------

    async def inbox_get(self, inbox_id: int) -> InboxEvent | None:
        async with self.connect() as conn:
            row = (await conn.exec_driver_sql(self.q["inbox_get"], (inbox_id,))).first()
        return InboxEvent.from_row(row) if row else None

    async def inbox_get_by_key(self, source: str, account: str, event_id: str) -> InboxEvent | None:
        async with self.connect() as conn:
            row = (
                await conn.exec_driver_sql(self.q["inbox_get_by_key"], (source, account, event_id))
            ).first()
        return InboxEvent.from_row(row) if row else None

    async def fetch_all(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Rows of an ad-hoc read as dicts (tests and operator tools)."""
        async with self.connect() as conn:
            result = await conn.exec_driver_sql(sql, tuple(params))
            return [dict(r._mapping) for r in result]

    async def stats(self) -> Stats:
        counts: dict[tuple[str, str | None], int] = {}
        oldest: float | None = None
        async with self.connect() as conn:
            rows: Iterable[Sequence[Any]] = await conn.exec_driver_sql(self.q["stats_inbox"])
            for status, reason, n, old in rows:
                counts[(status, reason)] = n
                if old is not None:
                    oldest = old if oldest is None else min(oldest, old)
            quarantined = (await conn.exec_driver_sql(self.q["stats_quarantine"])).scalar_one()

        def total(status: str) -> int:
            return sum(n for (s, _), n in counts.items() if s == status)

        return Stats(
            pending=total("pending"),
            done=total("done"),
            ignored=total("ignored"),
            dead_invalid=counts.get(("dead", "invalid"), 0),
            dead_exhausted=counts.get(("dead", "exhausted"), 0),
            dead_other=total("dead")
            - counts.get(("dead", "invalid"), 0)
            - counts.get(("dead", "exhausted"), 0),
            quarantined=quarantined,
            oldest_pending_at=oldest,
        )

    # -- processing -----------------------------------------------------------------

    async def rows(self, conn: AsyncConnection, name: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run the named query in ``conn``'s transaction; rows support ``row[i]`` and
        ``row["column"]``. Backends may run it below SQLAlchemy (same transaction)."""
        result = await conn.exec_driver_sql(self.q[name], tuple(params))
        return list(result.all()) if result.returns_rows else []

    async def first(self, conn: AsyncConnection, name: str, params: Sequence[Any] = ()) -> Any:
        found = await self.rows(conn, name, params)
        return found[0] if found else None

    def _ids(self, ids: Sequence[int]) -> Any:
        """How a list of ids is passed to the driver."""
        return list(ids)

    async def inbox_claim(
        self, *, now: float, limit: int, max_attempts: int, hold: float, start: int = 0
    ) -> Claim:
        """Phase 1 of processing, its own short transaction: hold up to ``limit`` due
        rows back ``hold`` seconds, and dead-letter the ones whose attempts were used up
        by workers that died. ``start``: how many of them (the first due, suspects
        excepted) the worker starts at once, whose attempts the claim counts
        (PostgreSQL; SQLite counts none here: its worker runs a claim as one batch)."""
        async with self.connect() as conn:
            rows = await self.rows(conn, "inbox_claim", (now, limit, hold, max_attempts))
        return Claim.from_rows(rows)

    async def inbox_keep_hold(
        self, ids: Sequence[int], held: Sequence[float], until: float
    ) -> None:
        """Renew the hold of a live worker's claimed rows not finished yet (PostgreSQL,
        ``inbox_keep_hold``). SQLite: nothing to do; a batch runs in one write
        transaction, which no other claimer passes."""

    async def inbox_start(self, ids: Sequence[int], now: float) -> dict[int, int]:
        """Count an attempt on ``ids`` as they start, in its own short transaction
        (durable before any handler runs); return each row's attempt number."""
        async with self.connect() as conn:
            rows = await self.rows(conn, "inbox_start", (self._ids(ids), now))
        return {r[0]: r[1] for r in rows}

    async def inbox_begin(
        self, conn: AsyncConnection, inbox_id: int, *, attempt: int, now: float
    ) -> bool:
        """The first statement of one event's own transaction (``conn`` has begun and
        sent nothing yet): mark the row done, under its row lock, if it is still
        pending at ``attempt``; the handler's failure rolls the mark back. Returns
        whether the row is this worker's to process."""
        return bool(await self.rows(conn, "inbox_begin_done", (inbox_id, now, attempt)))

    def event_transaction(self, conn: AsyncConnection) -> AbstractAsyncContextManager[Any]:
        """One event's own transaction on ``conn``, committed on success; its first
        statement is :meth:`inbox_begin`."""
        return conn.begin()

    async def inbox_start_on_commit(
        self, conn: AsyncConnection, inbox_id: int, *, attempts: int, now: float
    ) -> None:
        """Count the attempt of the event that starts after ``conn``'s transaction, in
        that transaction (last statement before COMMIT): counted only if it commits,
        and only while the row is still pending at ``attempts`` (as claimed). The
        next :meth:`inbox_begin` with ``attempts + 1`` tells whether it was."""
        await self.rows(conn, "inbox_start_next", (inbox_id, now, attempts))

    async def inbox_lock(self, conn: AsyncConnection, ids: Sequence[int]) -> list[InboxEvent]:
        """Phase 2: lock claimed rows still pending, until the caller's COMMIT."""
        return [
            InboxEvent.from_row(r) for r in await self.rows(conn, "inbox_lock", (self._ids(ids),))
        ]

    async def inbox_complete(self, conn: AsyncConnection, ids: Sequence[int], now: float) -> None:
        await self.rows(conn, "inbox_complete", (self._ids(ids), now))

    async def inbox_retry_later(
        self, conn: AsyncConnection, inbox_id: int, *, at: float, error: str, now: float
    ) -> None:
        await self.rows(conn, "inbox_retry_later", (inbox_id, at, error, now))

    async def inbox_kill(
        self, conn: AsyncConnection, inbox_id: int, *, reason: str, error: str, now: float
    ) -> None:
        await self.rows(conn, "inbox_kill", (inbox_id, reason, error, now))

    async def attempt_insert(
        self,
        conn: AsyncConnection,
        *,
        inbox_id: int,
        attempt: int,
        outcome: str,
        error: str | None,
        worker: str,
        started_at: float,
        finished_at: float,
    ) -> None:
        await self.rows(
            conn,
            "attempt_insert",
            (inbox_id, attempt, outcome, error, worker, started_at, finished_at),
        )

    async def operation_insert(
        self,
        conn: AsyncConnection,
        *,
        business_key: str,
        fingerprint: str,
        inbox_id: int | None,
        source: str | None,
        tenant: str | None,
        now: float,
    ) -> tuple[bool, str]:
        """Insert a business key; return (created, stored fingerprint)."""
        key, row = keys.operation_params(business_key, fingerprint, inbox_id, source, tenant, now)
        if self.backend == "postgres":
            found = await self.first(conn, "operation_insert", (*key, *row))
            keyed, created = bool(found[0]), bool(found[1])
        else:
            keyed = await self.first(conn, "operation_insert", key) is not None
            created = keyed and await self.first(conn, "operation_record", row) is not None
        if created:
            return True, fingerprint
        existing = await self.first(conn, "operation_get", (key[0], business_key))
        stored, fix = keys.operation_stored(fingerprint, keyed=keyed, found=existing)
        if fix is not None:
            await self.rows(conn, "operation_key_fix", (key[0], fix))
        return False, stored

    async def outbox_insert(
        self,
        conn: AsyncConnection,
        *,
        channel: str,
        key: str,
        payload: str,
        tenant: str | None,
        inbox_id: int | None,
        now: float,
    ) -> int | None:
        """Record an outgoing action; ``None`` when (channel, key) already exists."""
        row = await self.first(
            conn, "outbox_insert", (channel, key, payload, tenant, inbox_id, now)
        )
        return row[0] if row else None

    async def outbox_insert_rows(
        self, conn: AsyncConnection, rows: Sequence[OutboxRow], *, now: float
    ) -> None:
        """Handlers' outbox rows ``(channel, key, payload, tenant, inbox_id)``, written
        in ``conn``'s transaction before it commits; a (channel, key) that exists is
        left alone."""
        for channel, key, payload, tenant, inbox_id in rows:
            await self.outbox_insert(
                conn,
                channel=channel,
                key=key,
                payload=payload,
                tenant=tenant,
                inbox_id=inbox_id,
                now=now,
            )

    async def notify(self, conn: AsyncConnection, channel: str) -> None:
        """Wake listeners of ``channel`` when the transaction commits (PostgreSQL)."""

    def wake(self, channel: str) -> None:
        """Wake listeners of ``channel`` about rows committed already. Callers that
        commit themselves (accept, the worker) use this rather than :meth:`notify`:
        on PostgreSQL a NOTIFY in a transaction serialises its COMMIT with every other
        notifying COMMIT (a database-wide lock held through the WAL flush)."""

    async def listen(self, channel: str, wake: asyncio.Event) -> Listener | None:
        """Set ``wake`` whenever rows for ``channel`` (``inbox``, ``outbox``) commit.
        Returns something to ``close()``, or ``None`` when listening is not possible:
        callers poll anyway, this only shortens their wait."""
        return None


OutboxRow = tuple[str, str, str, str | None, int]
"""A handler's outbox row: channel, key, payload (JSON text), tenant, inbox id."""


def _now() -> float:
    import time

    return time.time()
