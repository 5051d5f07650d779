"""PostgreSQL backend (asyncpg): many receivers and workers on one database.

Claims use ``FOR NO KEY UPDATE SKIP LOCKED``: rows another worker holds are passed
over, and the weaker lock still lets the quarantine's foreign key reference a row
that a worker is processing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import math
import re
import time
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Sequence
from typing import Any, ClassVar, TypedDict, Unpack

import asyncpg
import asyncpg.transaction
import structlog
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from relaybox.log import short_error
from relaybox.store import keys, keys_index, partitions
from relaybox.store._drivers import FoldedTransaction as _FoldedTransaction
from relaybox.store._drivers import adapted as _adapted
from relaybox.store._drivers import (
    adopt,
    asyncpg_of,
    begin_has_listeners,
    discard_if_closed,
    open_transaction,
)
from relaybox.store._drivers import driver as _driver
from relaybox.store._drivers import plain as _plain
from relaybox.store.backend import Backend
from relaybox.store.base import Store
from relaybox.store.dispatch import DispatchStore, leased_delivery
from relaybox.store.dispatch_rows import Leased, LeaseRequest, attempt_columns
from relaybox.store.inbox import InboxStore
from relaybox.store.inbox_rows import (
    AcceptOutcome,
    Claim,
    Listener,
    NewDelivery,
    NewOperation,
    OutboxRow,
)
from relaybox.store.keys_store import KeysStore
from relaybox.store.operator import DatabaseHealth
from relaybox.store.outbox import OutboxStore
from relaybox.store.outbox_rows import MessageBody, SecretOpener, Target, with_extras
from relaybox.store.partitions_store import PartitionsStore

__all__ = [
    "PostgresBackend",
    "PostgresDispatch",
    "PostgresInbox",
    "PostgresOptions",
    "PostgresPartitions",
    "PostgresStore",
]

log = structlog.get_logger("relaybox.store")


def async_url(url: str) -> str:
    """``postgresql://…`` (any driver spelling) → the asyncpg dialect URL."""
    u = make_url(url)
    return u.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)


class PostgresOptions(TypedDict, total=False):
    """The options of :class:`PostgresBackend` (and of :class:`PostgresStore`, which
    hands them over), each left out for its default there."""

    pool_size: int
    max_overflow: int
    connect_timeout: float
    raw_pool_size: int
    pool_timeout: float
    idle_in_transaction_timeout: float


class PostgresBackend(Backend):
    """PostgreSQL under asyncpg: SQLAlchemy's engine for handlers and the general
    statements, and asyncpg pools of relaybox's own for its hot paths."""

    backend: ClassVar[str] = "postgres"
    groups: ClassVar[bool] = True
    starts_at_accept: ClassVar[bool] = True
    close_timeout: float = 10.0
    """Seconds :meth:`close` waits for connections still in use before it closes them."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 10,
        max_overflow: int = 10,
        connect_timeout: float = 5,
        raw_pool_size: int = 8,
        pool_timeout: float = 10,
        idle_in_transaction_timeout: float = 20,
    ) -> None:
        super().__init__(url)
        self._raw_pool: asyncpg.Pool | None = None
        self._start_pool: asyncpg.Pool | None = None
        self._generic_pool: asyncpg.Pool | None = None
        self._pool_lock = asyncio.Lock()
        self._wakes: set[str] = set()  # channels to NOTIFY about committed rows
        # This process's listeners per channel, woken by wake() directly.
        self._listening: dict[str, weakref.WeakSet[asyncio.Event]] = {}
        self._waker: asyncio.Task[None] | None = None
        self._releasing: set[asyncio.Task[None]] = set()  # connections going back (_borrow)
        # Per pool, connections whose last use ended cleanly, with when it ended (_borrow).
        self._idle: dict[asyncpg.Pool, list[tuple[asyncpg.Connection, float]]] = {}
        self._waiting: Counter[asyncpg.Pool] = Counter()  # uses waiting in pool.acquire()
        self._raw_pool_size = raw_pool_size
        # Connections on which the statements of _PREPARED are prepared.
        self._prepared: weakref.WeakSet[asyncpg.Connection] = weakref.WeakSet()
        # Kinds of keys whose backfill has finished, and when each other was last read.
        self._keys_done: set[str] = set()
        self._keys_checked: dict[str, float] = {}
        self._connect_timeout = connect_timeout
        self._pool_timeout = pool_timeout
        # Every session of ours: the server ends one left idle inside a transaction
        # (a handler stuck after a statement, a frozen process) and its row locks go.
        self.session_settings: dict[str, str] = {"application_name": "relaybox"}
        if idle_in_transaction_timeout > 0:
            ms = max(1, round(idle_in_transaction_timeout * 1000))
            self.session_settings["idle_in_transaction_session_timeout"] = str(ms)
        self.engine = create_async_engine(
            async_url(url),
            pool_size=pool_size,
            max_overflow=max_overflow,
            pool_timeout=pool_timeout,
            connect_args={
                "timeout": connect_timeout,
                "command_timeout": 60,
                "server_settings": dict(self.session_settings),
            },
        )

    async def lock_migrations(self, conn: AsyncConnection) -> None:
        await conn.exec_driver_sql("SELECT pg_advisory_xact_lock(hashtext('relaybox_migrate'))")

    def insert_migration_sql(self) -> str:
        return "INSERT INTO relaybox_migrations (version, name, applied_at) VALUES ($1, $2, $3)"

    async def raw_pool(self) -> asyncpg.Pool:
        """asyncpg pool for relaybox's own hot paths (accept): no SQLAlchemy layer,
        prepared statements cached per connection. Handlers keep SQLAlchemy."""
        async with self._pool_lock:  # two first callers must not create two pools
            if self._raw_pool is None:
                self._raw_pool = await self._create_pool({})
        return self._raw_pool

    async def generic_pool(self) -> asyncpg.Pool:
        """Connections with generic plans forced, for hot batch statements with array
        parameters: the group-commit accept, the dispatcher's lease and records. With
        arrays PostgreSQL otherwise plans every execution anew (a custom plan looks
        cheaper for a small batch): that planning cost more backend CPU than the
        batch's inserts (bench/README.md). Their generic plans reach the big tables
        through indexes even on a young database (tests/store/test_plans.py checks it).

        Bitmap scans are off here: these statements probe a few rows by key, where a
        plain index scan is as cheap, and a plain index scan marks the dead entries it
        passes, which a bitmap scan reads again on every execution until the next
        vacuum. The lease counts a lane's live leases in relaybox_outbox_leases, whose
        rows live for one attempt: planned on its empty table, the count was a bitmap
        scan over every dead lease of the lane (~300 a lane mid-run), and PostgreSQL
        spent 326-348 µs per delivery instead of 207 µs (`bench dispatch`)."""
        async with self._pool_lock:
            if self._generic_pool is None:
                self._generic_pool = await self._create_pool(
                    {"plan_cache_mode": "force_generic_plan", "enable_bitmapscan": "off"}
                )
        return self._generic_pool

    async def start_pool(self) -> asyncpg.Pool:
        """Connections with ``synchronous_commit`` off, for the worker's claims,
        attempt-start marks and hold renewals (and the wake-ups' NOTIFY) only.

        Generic plans are forced here too: each of these statements is planned once per
        connection. Left to choose, PostgreSQL planned the claim anew for every call (its
        generic plan looked dearer), and with time partitions that planning, over every
        partition and each of its indexes, cost more than the claim's work and grew with
        the partitions kept: at 31 partitions a claim of 128 rows took 2.4 times the
        backend CPU of one table's, 1.1 times planned once (bench/README.md, "The fixed
        cost of a partitioned statement"). Their generic plans probe ids and the due
        index even on a young or analyzed database (tests/store/test_plans.py)."""
        async with self._pool_lock:
            if self._start_pool is None:
                self._start_pool = await self._create_pool(
                    {"synchronous_commit": "off", "plan_cache_mode": "force_generic_plan"}
                )
        return self._start_pool

    @contextlib.asynccontextmanager
    async def borrow(self, pool: asyncpg.Pool) -> AsyncIterator[asyncpg.Connection]:
        """A connection of ``pool`` for one use, most often without asyncpg's acquire
        and release (~65 µs of CPU together, more than a statement's round trip of ~43
        µs; the accept, the lease, the claims and the wake-ups borrow one for each
        statement, bench/README.md): a use that ends cleanly leaves its connection in
        this store's idle list for the next (:meth:`_keep`).

        A use that raised (cancelled, connection lost, statement refused) hands its
        connection back to the pool, which cleans up after each. That release is a
        task the caller does not wait for: asyncpg's ``Pool.release`` shields it in a
        task of its own, and the caller would go on three passes of the event loop
        later (~4 ms a lease on a busy dispatcher). :meth:`close` waits for them."""
        conn = await self.take(pool)
        try:
            yield conn
        except BaseException:
            self.give_back(pool, conn)
            raise
        self.keep(pool, conn)

    async def take(self, pool: asyncpg.Pool) -> asyncpg.Connection:
        """The idle connection of ``pool`` used last, or one from the pool."""
        idle = self._idle.setdefault(pool, [])
        while idle:
            conn = idle.pop()[0]
            if _reusable(conn):
                return conn
            self.give_back(pool, conn)  # lost while idle: the pool opens another
        self._waiting[pool] += 1
        try:  # TimeoutError past pool_timeout: the HTTP surfaces answer 503
            return await pool.acquire(timeout=self._pool_timeout)
        finally:
            self._waiting[pool] -= 1

    def keep(self, pool: asyncpg.Pool, conn: asyncpg.Connection) -> None:
        """After a clean use: ``conn`` waits in the idle list, unless a use waits for the
        pool (every connection is out: it goes there) or it closed or kept a
        transaction open; the idle connection unused for :data:`IDLE_KEEP` seconds goes
        back to the pool (and every one when the store closes)."""
        if self._waiting[pool] or not _reusable(conn):
            self.give_back(pool, conn)
            return
        idle = self._idle.setdefault(pool, [])
        now = time.monotonic()
        idle.append((conn, now))
        if idle[0][1] < now - IDLE_KEEP:
            self.give_back(pool, idle.pop(0)[0])

    def give_back(self, pool: asyncpg.Pool, conn: asyncpg.Connection) -> None:
        task = asyncio.get_running_loop().create_task(pool.release(conn))
        self._releasing.add(task)
        task.add_done_callback(self._released)

    def _released(self, task: asyncio.Task[None]) -> None:
        self._releasing.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("connection_release_failed", error=short_error(exc))

    async def _create_pool(self, settings: dict[str, str]) -> asyncpg.Pool:
        return await asyncpg.create_pool(
            dsn(self.url),
            min_size=1,
            max_size=self._raw_pool_size,
            timeout=self._connect_timeout,
            command_timeout=60,
            server_settings={**self.session_settings, **settings},
            # These connections never LISTEN, SET or leave a transaction open, so
            # the default reset (one more round trip per release) buys nothing.
            reset=_no_reset,
        )

    @contextlib.asynccontextmanager
    async def ddl_connection(self) -> AsyncIterator[asyncpg.Connection]:
        """A connection of its own for DDL (its session settings and advisory lock die
        with it), outside every pool."""
        conn = await asyncpg.connect(dsn(self.url), timeout=10)
        try:
            yield conn
        finally:
            await conn.close()

    async def health(self) -> DatabaseHealth:
        """The open transactions of this database's other sessions and the dead rows of
        relaybox's tables, in one transaction (:class:`DatabaseHealth`)."""
        async with self.connect() as conn:
            result = await conn.exec_driver_sql(self.q["health_open_transactions"])
            transactions = [dict(r._mapping) for r in result]
            result = await conn.exec_driver_sql(self.q["health_table_rows"])
            tables = [dict(r._mapping) for r in result]
        return DatabaseHealth(transactions=transactions, tables=tables)

    async def close(self) -> None:
        if self._waker is not None:
            with contextlib.suppress(Exception):
                await self._waker
        for pool, idle in self._idle.items():
            for conn, _ in idle:
                self.give_back(pool, conn)
        self._idle.clear()
        if self._releasing:
            await asyncio.gather(*self._releasing, return_exceptions=True)
        pools = (self._raw_pool, self._start_pool, self._generic_pool)
        await asyncio.gather(*(self._close_pool(pool) for pool in pools if pool is not None))
        self._raw_pool = self._start_pool = self._generic_pool = None
        await super().close()

    async def _close_pool(self, pool: asyncpg.Pool) -> None:
        """asyncpg's close waits for every connection to come back: one held by a task
        that never gives it back (destroyed while holding it, or still running after
        the app's shutdown) would keep the close, and the process's exit, waiting
        forever. After ``close_timeout`` seconds the pool is terminated instead
        (asyncpg does so when its close is cancelled), which closes the connections
        still out."""
        in_use = pool.get_size() - pool.get_idle_size()
        try:
            await asyncio.wait_for(pool.close(), self.close_timeout)
        except TimeoutError:
            log.warning("store_close_timed_out", seconds=self.close_timeout, in_use=in_use)

    async def keys_complete(self, conn: asyncpg.Connection, kind: str) -> bool:
        """Whether the backfill of ``kind``'s keys has finished (then every stored row's
        key is in its keys table). Read again at most every few seconds until it has;
        once it has, for good."""
        if kind in self._keys_done:
            return True
        now = time.monotonic()
        if now < self._keys_checked.get(kind, -math.inf) + _KEYS_RECHECK:
            return False
        self._keys_checked[kind] = now
        if await conn.fetchval(self.q["keys_backfill_finished"], kind):
            self._keys_done.add(kind)
            return True
        return False

    async def prepare(self, conn: AsyncConnection) -> asyncpg.Connection:
        """The asyncpg connection under ``conn``, with the statements of
        :data:`_PREPARED` prepared on it (once per connection, before its first
        transaction: two round trips in its life), so that the BEGIN and COMMIT
        messages that carry them run ``EXECUTE`` instead of parsing and planning
        them again for every transaction."""
        con = asyncpg_of(await _adapted(conn))
        if con in self._prepared or con.is_in_transaction():
            return con
        there = {r[0] for r in await con.fetch(_PREPARED_THERE)}
        missing = [
            f"PREPARE relaybox_{name}({types}) AS {self.q[name]}"
            for name, types in _PREPARED.items()
            if f"relaybox_{name}" not in there
        ]
        if missing:
            await con.execute(";".join(missing))
        self._prepared.add(con)
        return con

    def literal_sql(self, con: asyncpg.Connection, name: str, params: Sequence[Any]) -> str:
        """Statement ``name`` for a simple-query message: ``EXECUTE`` of its prepared
        form where ``con`` has it, else its text; the parameters as literals."""
        if con in self._prepared:
            return f"EXECUTE relaybox_{name}({','.join(map(_literal, params))})"
        return _inline(self.q[name], params)

    async def begin_with(self, conn: AsyncConnection, sql: str) -> str:
        """BEGIN and ``sql`` (literals only) in one message; ``sql``'s status. In a
        transaction SQLAlchemy already began (or an adapted connection we do not
        fold), just ``sql``."""
        adapted = await _adapted(conn)
        await discard_if_closed(conn, adapted)
        try:
            if open_transaction(adapted) is not None or not _plain(adapted):
                driver = await _driver(conn)
                return str(await driver.execute(sql))
            tx = _FoldedTransaction(asyncpg_of(adapted))
            try:
                return await tx.begin_with(sql)
            finally:
                if tx.started:  # also when the statement failed: SQLAlchemy's ROLLBACK ends it
                    adopt(adapted, tx)
        except asyncpg.InvalidSQLStatementNameError:
            # Something deallocated relaybox's statements (DISCARD ALL): prepare them
            # again before the next transaction.
            self._prepared.discard(asyncpg_of(adapted))
            raise

    @contextlib.asynccontextmanager
    async def event_transaction(self, conn: AsyncConnection) -> AsyncIterator[None]:
        """One event's transaction, begun without a greenlet hop: SQLAlchemy's side of
        ``begin()`` does no I/O here (the asyncpg dialect's ``do_begin`` does nothing;
        :meth:`inbox_begin` sends the BEGIN), so it runs as a plain call. The handler
        sees ``conn`` in its transaction as with ``conn.begin()`` (its own ``begin()``
        fails the same way); commit and rollback go through SQLAlchemy."""
        sync = conn.sync_connection
        adapted = await _adapted(conn)
        if (
            sync is None
            or conn.in_transaction()
            or open_transaction(adapted) is not None
            or not _plain(adapted)
            or begin_has_listeners(sync)  # its BEGIN may run SQL: it needs the greenlet
        ):
            async with conn.begin():
                yield
            return
        sync.begin()
        try:
            yield
        except BaseException:
            await conn.rollback()
            raise
        try:
            await conn.commit()
        except BaseException:
            # A COMMIT that failed (its statements found the transaction aborted, say)
            # leaves SQLAlchemy's transaction open: end it, so the connection is usable.
            with contextlib.suppress(Exception):
                await conn.rollback()
            raise

    async def before_commit(self, conn: AsyncConnection, sql: str) -> None:
        """``sql`` (literals only) sent with the COMMIT when relaybox began the
        transaction (one round trip for both); now, on its own, otherwise."""
        adapted = await _adapted(conn)
        tx = open_transaction(adapted)
        if isinstance(tx, _FoldedTransaction) and tx.started:
            tx.before_commit(sql)
            return
        driver = await _driver(conn)
        await driver.execute(sql)

    async def rows(self, conn: AsyncConnection, name: str, params: Sequence[Any] = ()) -> list[Any]:
        """relaybox's own statements run on the asyncpg connection beneath ``conn``, in
        the same transaction, with asyncpg's prepared-statement cache: ~18 µs of CPU a
        statement against ~60 µs through SQLAlchemy (bench/README.md). Handlers have
        ``ctx.conn`` (SQLAlchemy) and ``ctx.driver`` (this connection)."""
        driver = await _driver(conn)
        rows: list[Any] = await driver.fetch(self.q[name], *params)
        return rows

    async def listen(self, channel: str, wake: asyncio.Event) -> Listener | None:
        """LISTEN on a connection of its own (outside every pool)."""
        try:
            conn = await asyncpg.connect(dsn(self.url), timeout=self._connect_timeout)
            await conn.add_listener(f"relaybox_{channel}", lambda *_: wake.set())
            self._listening.setdefault(channel, weakref.WeakSet()).add(wake)
        except Exception as exc:  # polling still finds the rows
            log.warning("listen_failed", channel=channel, error=short_error(exc))
            return None
        listener: Listener = conn
        return listener

    async def notify(self, conn: AsyncConnection, channel: str) -> None:
        """NOTIFY ``channel``'s listeners when ``conn``'s transaction commits. Sent with
        the COMMIT when relaybox's own transaction object holds it (its statements
        began the transaction, as in ``publish``): one round trip less a publish
        (bench/README.md, the levers table); as a statement of its own
        otherwise (PostgreSQL delivers one per transaction and channel either way)."""
        sql = self.q[f"notify_{channel}"]
        tx = open_transaction(await _adapted(conn))
        if isinstance(tx, _FoldedTransaction) and tx.started:
            tx.before_commit(sql, once=True)
            return
        await conn.exec_driver_sql(sql)

    def wake(self, channel: str) -> None:
        """NOTIFY after COMMIT, coalesced: one statement at a time per process, on the
        ``synchronous_commit=off`` pool, names every channel woken meanwhile. A NOTIFY
        inside a data transaction takes a database-wide lock from its COMMIT until
        the WAL flush ends, so notifying COMMITs never share a flush (bench/README.md:
        backends queued on it, 2.6 on average, in the process benchmark). If this
        process dies before the NOTIFY, the listeners' polling finds the rows. This
        process's own listeners (a receiver and a worker in one process) are woken at
        once, without waiting for the NOTIFY's round trip."""
        for event in self._listening.get(channel, ()):
            event.set()  # this process's listeners at once, without the round trip
        self._wakes.add(channel)
        if self._waker is None or self._waker.done():
            self._waker = asyncio.get_running_loop().create_task(self._send_wakes())

    async def _send_wakes(self) -> None:
        while self._wakes:
            channels, self._wakes = sorted(self._wakes), set()
            try:
                pool = await self.start_pool()
                async with self.borrow(pool) as conn:
                    await conn.execute(self.q["notify_channels"], channels)
            except Exception as exc:  # polling finds the rows
                log.warning("notify_failed", channels=channels, error=short_error(exc))

    async def copy_event_keys(self, conn: AsyncConnection, page: Sequence[Any]) -> None:
        await self.rows(conn, "event_keys_insert", keys.event_key_columns(page))

    async def copy_message_keys(self, conn: AsyncConnection, page: Sequence[Any]) -> None:
        await self.rows(conn, "message_keys_insert", keys.message_key_columns(page))

    async def copy_operation_keys(self, conn: AsyncConnection, page: Sequence[Any]) -> None:
        await self.rows(conn, "operation_keys_insert", keys.operation_key_columns(page))

    @contextlib.asynccontextmanager
    async def maintenance_try_lock(self) -> AsyncIterator[bool]:
        """One maintenance runner across every process: ``pg_try_advisory_lock`` on a
        connection of its own, outside every pool (a pooled connection would carry the
        session lock to its next user). Closing that connection releases the lock
        even if the unlock is never reached (the process died)."""
        conn = await asyncpg.connect(dsn(self.url), timeout=10)
        try:
            got = bool(await conn.fetchval(self.q["ops_maintenance_try_lock"]))
            try:
                yield got
            finally:
                if got:
                    await conn.fetchval(self.q["ops_maintenance_unlock"])
        finally:
            await conn.close()

    def mapping(self, row: Any) -> Any:
        return row  # an asyncpg Record reads by column name


class PostgresInbox(InboxStore):
    """The inbox on PostgreSQL: the accept on the raw driver, claims and start marks on
    the ``synchronous_commit=off`` pool, and groups of events in one transaction."""

    db: PostgresBackend

    def __init__(self, db: PostgresBackend) -> None:
        super().__init__(db)
        self.db = db

    async def start(self, ids: Sequence[int], now: float) -> dict[int, int]:
        pool = await self.db.start_pool()
        async with self.db.borrow(pool) as conn:
            rows = await conn.fetch(self.db.q["inbox_start"], list(ids), now)
        return {r[0]: r[1] for r in rows}

    async def keep_hold(self, ids: Sequence[int], held: Sequence[float], until: float) -> None:
        pool = await self.db.start_pool()  # synchronous_commit off: a hold, not an outcome
        async with self.db.borrow(pool) as conn:
            await conn.execute(self.db.q["inbox_keep_hold"], list(ids), list(held), until)

    async def accept(self, batch: Sequence[NewDelivery]) -> list[AcceptOutcome]:
        """Group commit on the raw driver: the batch insert is one autocommit
        statement; only keys that already existed need a second, transactional step
        (look up the stored fingerprint, quarantine a conflicting newcomer)."""
        # Rows go in key order: two batches inserting the same keys in different orders
        # would each wait for the other's row locks (a deadlock fails both batches).
        order = sorted(range(len(batch)), key=lambda i: batch[i].key)
        in_order = [batch[i] for i in order]
        outcomes = await self._accept_sorted(in_order)
        result: list[AcceptOutcome] = [outcomes[0]] * len(batch)
        for position, i in enumerate(order):
            result[i] = outcomes[position]
        return result

    def row_error(self, exc: BaseException) -> bool:
        """Also the server's refusals of a value: data exceptions (SQLSTATE class 22,
        such as a NUL in text), integrity violations (23) and program limits (54, such
        as an index entry over its size)."""
        if isinstance(exc, asyncpg.PostgresError):
            return str(getattr(exc, "sqlstate", "") or "")[:2] in _ROW_ERROR_CLASSES
        return super().row_error(exc)

    async def warm_accept(self, connections: int) -> None:
        """The accept's pool opened with ``connections`` connections (one per committer)
        and its statement prepared and planned on each, by running it for an empty
        batch (it inserts nothing). Otherwise the first requests after a start wait
        for the connections to open one by one under load: the p99 of the first 3 s
        under wrk was 55-73 ms without this, 11-16 ms with it (bench/README.md)."""
        pool = await self.db.generic_pool()
        held = [await self.db.take(pool) for _ in range(min(connections, self.db._raw_pool_size))]
        try:
            for conn in held:
                columns = _columns([])
                await conn.fetch(
                    self.db.q["inbox_accept_fast"], *columns[:11], [], 0.0, [], *columns[11:]
                )
        except BaseException:
            for conn in held:
                self.db.give_back(pool, conn)
            raise
        for conn in held:
            self.db.keep(pool, conn)  # for the accept's next uses (_borrow)

    async def _accept_sorted(self, batch: Sequence[NewDelivery]) -> list[AcceptOutcome]:
        now = max(d.received_at for d in batch)
        pool = await self.db.generic_pool()
        async with self.db.borrow(pool) as conn:
            if not await self.db.keys_complete(conn, "event"):
                await self._adopt_event_keys(conn, batch)  # keys of rows stored before 0027
            try:
                rows = await self._accept_rows(conn, batch, now)
            except asyncpg.UniqueViolationError:
                # The inbox's old UNIQUE event key refused a row: an old row whose key
                # is not in the keys table (expired there, the backfill being done).
                await self._adopt_event_keys(conn, batch)
                rows = await self._accept_rows(conn, batch, now)
            inserted = {(r[1], r[2], r[3]): r[0] for r in rows if r[5]}
            held = [d.held_until for d in batch]
            if inserted and (
                held.count(None) == len(held)
                or any(d.held_until is None and d.key in inserted for d in batch)
            ):  # rows for any worker (those this process's worker took need no claim)
                self.db.wake("inbox")
            stored = {(r[1], r[2], r[3]): (r[0], int(r[4])) for r in rows}
            missing = {d.key: d for d in batch if d.key not in stored}
            if missing:  # committed by a concurrent inserter after this statement began
                digests = {keys.event_digest(*k): k for k in sorted(missing)}
                found = await conn.fetch(self.db.q["event_keys_get"], list(digests))
                stored.update({digests[bytes(r[0])]: (r[1], int(r[2])) for r in found})
            outcomes = self._classify(batch, inserted, stored)
            quarantined = [
                (d, o.inbox_id)
                for d, o in zip(batch, outcomes, strict=True)
                if o.status == "quarantined"
            ]
            if quarantined:
                async with conn.transaction():
                    for d, inbox_id in quarantined:
                        row = d.quarantine_row(inbox_id)
                        await conn.execute(self.db.q["quarantine_lock"], *row[1:4])
                        await conn.execute(self.db.q["quarantine_insert"], *row)
                        if d.subject is not None:  # found by an erasure, whatever its age
                            await conn.execute(
                                self.db.q["subject_index"], d.subject, "inbox", str(inbox_id)
                            )
            return outcomes

    async def _accept_rows(
        self, conn: asyncpg.Connection, batch: Sequence[NewDelivery], now: float
    ) -> list[Any]:
        """``inbox_accept_fast`` (or its ``_subjects`` form) for ``batch``."""
        held = [d.held_until for d in batch]
        subjects = [d.subject for d in batch]
        traces = [d.traceparent for d in batch]
        columns = _columns(batch)
        if subjects.count(None) == len(subjects):
            return list(
                await conn.fetch(
                    self.db.q["inbox_accept_fast"], *columns[:11], held, now, traces, *columns[11:]
                )
            )
        return list(
            await conn.fetch(
                self.db.q["inbox_accept_fast_subjects"],
                *columns[:11],
                held,
                now,
                traces,
                *columns[11:],
                subjects,
            )
        )

    async def _adopt_event_keys(
        self, conn: asyncpg.Connection, batch: Sequence[NewDelivery]
    ) -> None:
        """Copy the keys of the inbox rows stored under ``batch``'s event keys before
        the keys table had them (one autocommit statement each way)."""
        wanted = sorted({d.key for d in batch})
        rows = await conn.fetch(
            self.db.q["event_keys_old_rows"],
            [k[0] for k in wanted],
            [k[1] for k in wanted],
            [k[2] for k in wanted],
        )
        if rows:
            await conn.fetchval(self.db.q["event_keys_insert"], *keys.event_key_columns(rows))

    async def claim(
        self, *, now: float, limit: int, max_attempts: int, hold: float, start: int = 0
    ) -> Claim:
        # A hold, like the start marks: on the synchronous_commit=off pool. The first
        # durable COMMIT after it (an event's completion) flushes the WAL up to it; a
        # database crash before that loses only holds, whose rows are claimed again.
        pool = await self.db.start_pool()
        async with self.db.borrow(pool) as conn:  # one statement: its own transaction
            rows = await conn.fetch(self.db.q["inbox_claim"], now, limit, hold, max_attempts, start)
        return Claim.from_rows(rows)

    async def begin(
        self, conn: AsyncConnection, inbox_id: int, *, attempt: int, now: float
    ) -> bool:
        """BEGIN and the completion in one round trip (simple query protocol, the
        parameters as literals: integers and floats only)."""
        con = await self.db.prepare(conn)
        sql = self.db.literal_sql(con, "inbox_begin_done", (inbox_id, now, attempt))
        return await self.db.begin_with(conn, sql) == "UPDATE 1"

    async def lock_group(
        self,
        conn: AsyncConnection,
        started: Sequence[tuple[int, int]],
        *,
        now: float,
        claims: Sequence[NewOperation] = (),
    ) -> bool:
        """The first statement of a group's transaction, sent with its BEGIN (one round
        trip): a short ``lock_timeout`` for the transaction, then the rows locked if
        each is still pending at the attempt given ((id, attempt) pairs), and the
        ``claims`` inserted as business keys. False when a row did not match or a
        key was not inserted (the caller rolls back)."""
        con = await self.db.prepare(conn)
        ids, attempts = [i for i, _ in started], [a for _, a in started]
        rows = [(c.business_key, c.fingerprint, c.inbox_id, c.source, c.tenant) for c in claims]
        columns = _literal_columns(rows, 5)
        digests = [keys.operation_digest(c.business_key) for c in claims]
        codes = [keys.operation_fingerprint(c.fingerprint) for c in claims]
        scopes = [keys.scope_of(c.source or "") for c in claims]
        days = [keys.day_of(now)] * len(claims)
        params = (ids, attempts, digests, codes, scopes, days, *columns, now)
        sql = self.db.literal_sql(con, "inbox_lock_group", params)
        status = await self.db.begin_with(conn, _GROUP_LOCK_TIMEOUT + sql)
        return bool(status == f"SELECT {len(started) + len(claims)}")

    async def savepoint(self, conn: AsyncConnection, *, release: bool, again: bool = True) -> None:
        """A group's savepoint around one event's handler; ``release``: the previous
        event's first, in the same round trip; ``again=False``: only that."""
        driver = await _driver(conn)
        await driver.execute(
            (_RELEASE_SAVEPOINT + ";" if release else "") + (_SAVEPOINT if again else "")
        )

    async def rollback_to_savepoint(self, conn: AsyncConnection) -> None:
        driver = await _driver(conn)
        await driver.execute("ROLLBACK TO SAVEPOINT relaybox_event")

    async def finish_group_on_commit(
        self,
        conn: AsyncConnection,
        done: Sequence[int],
        claimed: Sequence[tuple[int, int]],
        outbox: Sequence[OutboxRow] = (),
        *,
        now: float,
        released: Sequence[str] = (),
    ) -> None:
        """With a group's COMMIT (one round trip): its handlers' outbox rows, its
        succeeded rows (locked by :meth:`inbox_lock_group`) completed, the next
        group's start marks ((id, attempts as claimed) pairs; counted only while still
        pending so), and the business keys it claimed that no handler asked for
        released."""
        con = asyncpg_of(await _adapted(conn))
        parts = [self._outbox_rows_sql(con, outbox, now)] if outbox else []
        if released:
            digests = [keys.operation_digest(k) for k in released]
            parts.append(
                self.db.literal_sql(
                    con, "operations_release", (digests, [k.encode() for k in released])
                )
            )
        if done:
            parts.append(self.db.literal_sql(con, "inbox_complete", (list(done), now)))
        if claimed:
            parts.append(
                self.db.literal_sql(
                    con,
                    "inbox_start_next_group",
                    ([i for i, _ in claimed], [a for _, a in claimed], now),
                )
            )
        if not parts:
            return
        # The group's short lock_timeout was for its handlers: a start mark must not
        # fail the COMMIT it rides on (and with it the group) for a lock wait.
        await self.db.before_commit(conn, ";".join(["SET LOCAL lock_timeout = 0", *parts]))

    async def start_on_commit(
        self, conn: AsyncConnection, inbox_id: int, *, attempts: int, now: float
    ) -> None:
        """Rides on the COMMIT itself (one round trip for both) when relaybox began the
        transaction; a separate statement otherwise."""
        con = asyncpg_of(await _adapted(conn))
        await self.db.before_commit(
            conn, self.db.literal_sql(con, "inbox_start_next", (inbox_id, now, attempts))
        )

    async def outbox_insert_rows(
        self, conn: AsyncConnection, rows: Sequence[OutboxRow], *, now: float
    ) -> None:
        """Handlers' outbox rows, with the COMMIT when relaybox began the transaction
        (no round trip of their own)."""
        if rows:
            con = asyncpg_of(await _adapted(conn))
            await self.db.before_commit(conn, self._outbox_rows_sql(con, rows, now))

    def _outbox_rows_sql(
        self, con: asyncpg.Connection, rows: Sequence[OutboxRow], now: float
    ) -> str:
        """One INSERT for ``rows``, its texts written as hex (literals for the simple
        query protocol: nothing a handler passes can become SQL)."""
        return self.db.literal_sql(con, "outbox_insert_rows", (*_literal_columns(rows, 5), now))

    async def insert(
        self, conn: AsyncConnection, batch: Sequence[NewDelivery]
    ) -> list[AcceptOutcome]:
        now = max(d.received_at for d in batch)
        cols = _columns(batch)
        raw = await _driver(conn)
        if not await self.db.keys_complete(raw, "event"):
            rows_before = await raw.fetch(
                self.db.q["event_keys_old_rows"],
                [d.source for d in batch],
                [d.account for d in batch],
                [d.event_id for d in batch],
            )
            if rows_before:
                columns = keys.event_key_columns(rows_before)
                await raw.fetchval(self.db.q["event_keys_insert"], *columns)
        new_rows: Iterable[Sequence[Any]] = await conn.exec_driver_sql(
            self.db.q["inbox_insert_batch"],
            (*cols[:11], now, [d.traceparent for d in batch], *cols[11:]),
        )
        inserted = {(r[1], r[2], r[3]): r[0] for r in new_rows}
        counts = Counter(d.key for d in batch)
        wanted = sorted(k for k in counts if k not in inserted or counts[k] > 1)
        existing: dict[tuple[str, str, str], tuple[int, int]] = {}
        if wanted:
            digests = {keys.event_digest(*k): k for k in wanted}
            rows: Iterable[Sequence[Any]] = await conn.exec_driver_sql(
                self.db.q["event_keys_get"], (list(digests),)
            )
            existing = {digests[bytes(r[0])]: (r[1], int(r[2])) for r in rows}
        outcomes = self._classify(batch, inserted, existing)
        for d, o in zip(batch, outcomes, strict=True):
            if d.subject is not None and o.status in ("accepted", "ignored"):
                await conn.exec_driver_sql(
                    self.db.q["subject_index"], (d.subject, "inbox", str(o.inbox_id))
                )
            if o.status == "quarantined":
                row = d.quarantine_row(o.inbox_id)
                await conn.exec_driver_sql(self.db.q["quarantine_lock"], row[1:4])
                await conn.exec_driver_sql(self.db.q["quarantine_insert"], row)
                if d.subject is not None:  # found by an erasure, whatever its age
                    await conn.exec_driver_sql(
                        self.db.q["subject_index"], (d.subject, "inbox", str(o.inbox_id))
                    )
        if any(o.status == "accepted" for o in outcomes):
            await self.db.notify(conn, "inbox")
        return outcomes

    @staticmethod
    def _classify(
        batch: Sequence[NewDelivery],
        inserted: dict[tuple[str, str, str], int],
        existing: dict[tuple[str, str, str], tuple[int, int]],
    ) -> list[AcceptOutcome]:
        """The first delivery of an inserted key with the stored content is the new row;
        every other one is compared with the stored key's fingerprint digest.
        (``existing`` may hold the inserted rows too, with the digest that was stored.)"""
        claimed: set[tuple[str, str, str]] = set()
        outcomes = []
        for d in batch:
            fp = keys.fingerprint_digest(d.fingerprint)
            if d.key in inserted and d.key not in claimed:
                row = existing.get(d.key)
                if row is None or row[1] == fp:
                    claimed.add(d.key)
                    status = "ignored" if d.ignored else "accepted"
                    outcomes.append(AcceptOutcome(status, inserted[d.key]))  # type: ignore[arg-type]
                    continue
            inbox_id, stored_fp = existing[d.key]
            same = stored_fp == fp
            outcomes.append(AcceptOutcome("duplicate" if same else "quarantined", inbox_id))
        return outcomes


class PostgresDispatch(DispatchStore):
    """The dispatcher's lease in one statement (``outbox_lease``)."""

    db: PostgresBackend

    def __init__(self, db: PostgresBackend, outbox: OutboxStore) -> None:
        super().__init__(db, outbox)
        self.db = db

    lease_records: ClassVar[bool] = True

    async def outbox_lease(self, request: LeaseRequest, open_secrets: SecretOpener) -> Leased:
        """Every step of the lease in one autocommit statement (``outbox_lease``), on
        :meth:`generic_pool`: one round trip, no BEGIN / COMMIT. The same statement
        first records ``request.sent``, so that a finished attempt's slot is leased
        again without a record round trip in between; ``request.slots`` 0 only
        records."""
        fair = request.fair
        sent = attempt_columns(request.sent)  # their dispatcher: request.owner
        tenants = list(fair.held)
        pool = await self.db.generic_pool()
        async with self.db.borrow(pool) as conn:
            leased = await conn.fetch(
                self.db.q["outbox_lease"],
                request.now,
                request.slots,
                list(request.channels),
                request.owner,
                request.until,
                sent.id,
                sent.lease_token,
                sent.attempt,
                sent.endpoint_id,
                sent.started,
                sent.duration,
                sent.status_code,
                sent.error,
                sent.response,
                list(request.ahead),
                request.factor,
                fair.cap,
                fair.rows,
                tenants,
                [fair.held[t] for t in tenants],
                sent.headers,
            )
        written: set[tuple[int, int]] = set()
        if leased and leased[0]["recorded"] is not None:
            written = set(zip(leased[0]["recorded"], leased[0]["tokens"], strict=True))
        allowed: dict[str, int] = {}
        deadline = request.deadline
        # An endpoint's columns come with its first row (rows are in id order); None:
        # the endpoint no longer exists.
        targets: dict[str, Target | None] = {}
        deliveries = []
        for r in leased:
            if r["id"] is None:
                continue  # nothing leased: the one row carries what was recorded
            endpoint_id = r["endpoint_id"]
            target = None
            if endpoint_id is not None:
                if endpoint_id in targets:
                    target = targets[endpoint_id]
                elif r["url"] is not None:
                    schedule = r["schedule"]
                    opened, locked = open_secrets(r["secrets"] or ())
                    target = targets[endpoint_id] = Target(
                        id=endpoint_id,
                        tenant=r["endpoint_tenant"],
                        url=r["url"],
                        signature=r["signature"],
                        timeout=r["timeout"],
                        schedule=tuple(json.loads(schedule)) if schedule else None,
                        secrets=opened,
                        locked=locked,
                    )
                    if not r["trace_context"]:
                        target = targets[endpoint_id] = dataclasses.replace(
                            target, trace_context=False
                        )
                    if r["headers"] or r["credentials"] or r["failing_level"]:
                        target = targets[endpoint_id] = with_extras(
                            target, r["headers"], r["credentials"], r["failing_level"], open_secrets
                        )
                else:
                    targets[endpoint_id] = None
            message_id = r["message_id"]
            body = r["body"]
            message = (
                MessageBody(
                    message_id, r["event_type"], body.encode(), r["sequence"], r["traceparent"]
                )
                if message_id is not None and body is not None
                else None
            )
            delivery = leased_delivery(r, deadline, message, target)
            deliveries.append(delivery)
            allowed[delivery.lane] = r["allowed"]  # type: ignore[index]
        return Leased(deliveries, written, allowed)


class PostgresKeys(KeysStore):
    """The keys on PostgreSQL: the tables' indexes by day built and dropped
    ``CONCURRENTLY`` on a DDL connection (:mod:`relaybox.store.keys_index`)."""

    db: PostgresBackend

    def __init__(self, db: PostgresBackend) -> None:
        super().__init__(db)
        self.db = db

    async def day_indexes(self) -> dict[keys.KeyKind, bool]:
        async with self.db.ddl_connection() as conn:
            state = await keys_index.postgres_state(conn, self.db.q)
        return {k: bool(v) for k, v in state.items()}

    async def keep_day_indexes(self, wanted: Collection[keys.KeyKind]) -> dict[keys.KeyKind, bool]:
        async with self.db.ddl_connection() as conn:
            state = await keys_index.postgres_keep(
                conn,
                self.db.q,
                wanted,
                lock=self.db.q["keys_day_index_lock"],
                unlock=self.db.q["keys_day_index_unlock"],
            )
        return {k: bool(v) for k, v in state.items()}


class PostgresPartitions(PartitionsStore):
    """Time partitions of the history tables (:mod:`relaybox.store.partitions`), run on
    a DDL connection of their own."""

    db: PostgresBackend

    def __init__(self, db: PostgresBackend, keys: KeysStore) -> None:
        super().__init__(db, keys)
        self.db = db

    async def tables(self) -> set[str]:
        async with self.db.ddl_connection() as conn:
            return await partitions.partitioned(conn, self.db.q)

    async def convert(
        self, period: str, *, before_switch: Callable[[str, str], Any] | None = None
    ) -> list[str]:
        for kind in ("event", "message", "outbox"):
            # the UNIQUE keys of the inbox, the messages and the outbox go: every old
            # row's key first
            while not (await self.keys.backfill(kind, limit=10_000)).finished:
                pass
        async with self.db.ddl_connection() as conn:
            return await partitions.convert(conn, self.db.q, period, before_switch=before_switch)

    async def maintain(
        self,
        period: str,
        *,
        ahead: int = 3,
        drop: partitions.Drop | None = None,
        before_drop: Callable[[str, str], Any] | None = None,
    ) -> partitions.MaintainResult:
        async with self.db.ddl_connection() as conn:
            return await partitions.maintain(
                conn, self.db.q, period, ahead=ahead, drop=drop, before_drop=before_drop
            )


class PostgresStore(Store):
    """The store on PostgreSQL (:class:`PostgresBackend`); the options
    (:class:`PostgresOptions`) are the backend's."""

    db: PostgresBackend

    def __init__(self, url: str, **options: Unpack[PostgresOptions]) -> None:
        db = PostgresBackend(url, **options)
        super().__init__(
            db,
            inbox=PostgresInbox(db),
            dispatch=PostgresDispatch,
            keys=PostgresKeys,
            partitions=PostgresPartitions,
        )
        self.db = db


_ROW_ERROR_CLASSES = ("22", "23", "54")

IDLE_KEEP = 30.0
"""Seconds a connection waits unused in a store's idle list (``_borrow``) before it
goes back to its asyncpg pool, which closes it after its own inactive lifetime."""

_PARAM = re.compile(r"\$(\d+)")
_TEMPLATES: dict[str, tuple[list[str], list[int]]] = {}


def _inline(sql: str, params: Sequence[Any]) -> str:
    """``sql`` with ``$n`` replaced by literals (:func:`_literal`), for the simple query
    protocol."""
    template = _TEMPLATES.get(sql)
    if template is None:
        split = _PARAM.split(sql)
        template = _TEMPLATES[sql] = (split[0::2], [int(n) - 1 for n in split[1::2]])
    texts, slots = template
    out = [texts[0]]
    for text, slot in zip(texts[1:], slots, strict=True):
        out.append(_literal(params[slot]))
        out.append(text)
    return "".join(out)


def _literal_columns(rows: Sequence[Sequence[Any]], width: int) -> list[list[Any]]:
    """``rows`` as one list per column for :func:`_literal`: texts as UTF-8 bytes (hex
    in the SQL, decoded there), integers and ``None`` as they are."""
    columns: list[list[Any]] = [[] for _ in range(width)]
    for row in rows:
        for column, value in zip(columns, row, strict=True):
            column.append(value.encode() if type(value) is str else value)
    return columns


def _literal(value: int | float | list[int] | list[bytes | None] | list[Any]) -> str:
    """A parameter as a SQL literal. Only integers, finite floats, lists of integers
    and lists of bytes (as hex, or NULL for ``None``): nothing a caller passes can
    become SQL."""
    if type(value) is int:
        return str(value)
    if type(value) is float and math.isfinite(value):
        return repr(value)
    if type(value) is list and all(type(v) is int for v in value):
        return f"'{{{','.join(map(str, value))}}}'"
    if type(value) is list and all(v is None or type(v) is bytes for v in value):
        # bytes as hex text ('{"6869",NULL}'): the SQL decodes them
        items = ("NULL" if v is None else f'"{bytes(v).hex()}"' for v in value)
        return "'{" + ",".join(items) + "}'"
    raise TypeError(f"not inlined: {type(value).__name__}")


_PREPARED = {
    "inbox_begin_done": "bigint, float8, integer",
    "inbox_start_next": "bigint, float8, integer",
    "inbox_lock_group": (
        "bigint[], bigint[], text[], bigint[], bigint[], integer[], "
        "text[], text[], bigint[], text[], text[], float8"
    ),
    "operations_release": "text[], text[]",
    "inbox_complete": "bigint[], float8",
    "inbox_start_next_group": "bigint[], bigint[], float8",
    "outbox_insert_rows": "text[], text[], text[], text[], bigint[], float8",
}
"""The worker's statements that ride in its BEGIN and COMMIT messages (simple query
protocol, one round trip each), with their parameters' types: prepared once per
connection, then run by ``EXECUTE``. As literal text PostgreSQL parsed and planned
each for every transaction: 1.7-2.1 ms of a group's two messages against 1.1 ms
prepared (bench/README.md). Like asyncpg's own prepared statements they live in the
session: a pooler in transaction mode would need its session mode."""
_PREPARED_THERE = "SELECT name FROM pg_prepared_statements WHERE name LIKE 'relaybox\\_%'"


_SAVEPOINT = "SAVEPOINT relaybox_event"
_RELEASE_SAVEPOINT = "RELEASE SAVEPOINT relaybox_event"
_KEYS_RECHECK = 5.0
"""Seconds between two reads of whether a backfill of keys has finished."""
_GROUP_LOCK_TIMEOUT = "SET LOCAL lock_timeout = '50ms';"
"""A group's handlers hold every event's row locks until its COMMIT: a group waiting
longer than this for another's (a deadlock, or a long handler) falls back to one
transaction per event, where nothing times out."""


def _reusable(conn: asyncpg.Connection) -> bool:
    """Open and outside a transaction. A pool's connection that closed is handed back
    to its pool by asyncpg itself, after which asking it anything raises."""
    try:
        return not conn.is_closed() and not conn.is_in_transaction()
    except asyncpg.InterfaceError:
        return False


async def _no_reset(_conn: asyncpg.Connection) -> None:
    return None


def _columns(batch: Sequence[NewDelivery]) -> list[list[Any]]:
    """The batch as one array per column, for ``unnest``: the inbox row's 11, then the
    event key's digest, fingerprint digest and scope (:mod:`relaybox.store.keys`)."""
    return [
        [d.source for d in batch],
        [d.account for d in batch],
        [d.event_id for d in batch],
        [d.event_type for d in batch],
        [d.tenant for d in batch],
        [d.fingerprint for d in batch],
        [d.payload for d in batch],
        [d.headers for d in batch],
        [d.version for d in batch],
        ["ignored" if d.ignored else "pending" for d in batch],
        [d.received_at for d in batch],
        [keys.event_digest(*d.key) for d in batch],
        [keys.fingerprint_digest(d.fingerprint) for d in batch],
        [keys.scope_of(d.source) for d in batch],
    ]


def dsn(url: str) -> str:
    """``postgresql+asyncpg://…`` → a plain DSN for ``asyncpg.connect`` (LISTEN)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
