"""SQLite backend (aiosqlite): the embedded default, one process, one writer.

Every transaction starts with ``BEGIN IMMEDIATE`` (SQLAlchemy's documented recipe
for pysqlite/aiosqlite: the driver's own transaction handling is switched off), so
a worker holds the database's write lock from its claim to its COMMIT and no
``SKIP LOCKED`` is needed. WAL with ``synchronous=FULL``: an acknowledged event
survives power loss; group commit, not a weaker sync setting, buys the throughput.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import sqlite3
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine
from sqlalchemy.pool import AsyncAdaptedQueuePool

from relaybox.store import keys
from relaybox.store._commit_watch import CommitWatch
from relaybox.store._drivers import (
    run_on_pooled_sqlite,
    run_on_sqlite_thread,
    sqlite_in_transaction,
)
from relaybox.store.backend import Backend
from relaybox.store.base import Store
from relaybox.store.dispatch import DispatchStore, leased_delivery
from relaybox.store.dispatch_rows import Lane, Leased, LeaseRequest, allocate
from relaybox.store.inbox import InboxStore
from relaybox.store.inbox_rows import AcceptOutcome, Listener, NewDelivery
from relaybox.store.operator import DatabaseHealth
from relaybox.store.outbox_rows import MessageBody, SecretOpener, Target, with_extras

__all__ = ["SQLiteBackend", "SQLiteDispatch", "SQLiteInbox", "SQLiteStore"]


class _TaskListener:
    def __init__(self, task: asyncio.Task[None], store: SQLiteBackend) -> None:
        self._task = task
        self._store = store

    async def close(self) -> None:
        self._task.cancel()
        self._store._unwatch()


def _switch_to_wal(cur: Any, timeout: float) -> None:
    """SQLite does not call its busy handler for a journal-mode change, so a file that
    another connection is writing refuses the switch at once: retry until the busy
    timeout. This runs once, on the first connection to a file not yet in WAL mode
    (the mode is persistent), and blocks only while another writer holds the file."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except Exception as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _checkpoint(db: Any) -> None:
    """``PRAGMA wal_checkpoint(TRUNCATE)`` outside any transaction (it refuses to run
    inside one)."""
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()


class SQLiteBackend(Backend):
    """SQLite under aiosqlite: one pooled connection, BEGIN IMMEDIATE, WAL."""

    backend: ClassVar[str] = "sqlite"
    float_type: ClassVar[str] = "REAL"
    single_writer: ClassVar[bool] = True
    clock_from_database: ClassVar[bool] = False  # one host: its own clock is the database's

    def __init__(
        self, url: str, *, busy_timeout_ms: int = 10_000, pool_timeout: float = 10.0
    ) -> None:
        super().__init__(url)
        u = make_url(url)
        if u.database and u.database != ":memory:":
            Path(u.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        # One connection: SQLite has one writer, and queueing in the pool is cheaper
        # than SQLITE_BUSY retries between connections of the same process.
        self.engine = create_async_engine(
            u.set(drivername="sqlite+aiosqlite"),
            poolclass=AsyncAdaptedQueuePool,
            pool_size=1,
            max_overflow=0,
            # Bounded: when the file cannot be opened, SQLAlchemy's pool does not wake
            # the uses waiting for the connection whose opening failed; they wait this.
            pool_timeout=pool_timeout,
            pool_reset_on_return=None,  # _on_reset instead
        )
        self.wakeups: dict[str, asyncio.Event] = {}
        self._file = (
            Path(u.database).expanduser() if u.database and u.database != ":memory:" else None
        )
        self._watch: asyncio.Task[None] | None = None
        self._watchers = 0

        @event.listens_for(self.engine.sync_engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            # busy_timeout first: switching the journal mode needs the lock and would
            # otherwise fail at once when another process holds it.
            cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
            cur.execute("PRAGMA journal_mode")
            if str(cur.fetchone()[0]).lower() != "wal":
                _switch_to_wal(cur, busy_timeout_ms / 1000)
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @event.listens_for(self.engine.sync_engine, "reset")
        def _on_reset(dbapi_conn: Any, _record: Any, state: Any) -> None:
            # A connection back in the pool is rolled back only when a transaction is
            # still open on it (autocommit mode: only an explicit BEGIN opens one, and
            # SQLAlchemy ends its own before this). The pool's default rolled back
            # every time, a hop to aiosqlite's thread: ~85 µs a checkout, per accepted
            # batch (bench/README.md).
            if state.terminate_only or not state.asyncio_safe:
                return  # closed instead: SQLite rolls back what was open
            if sqlite_in_transaction(dbapi_conn.driver_connection):
                dbapi_conn.rollback()

        @event.listens_for(self.engine.sync_engine, "begin")
        def _on_begin(conn: Any) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    def array(self, ids: Sequence[int]) -> Any:
        return json.dumps(list(ids))

    def insert_migration_sql(self) -> str:
        return "INSERT INTO relaybox_migrations (version, name, applied_at) VALUES (?, ?, ?)"

    def wakeup(self, channel: str) -> asyncio.Event:
        """In-process signal set when rows for ``channel`` were committed."""
        return self.wakeups.setdefault(channel, asyncio.Event())

    async def listen(self, channel: str, wake: asyncio.Event) -> Listener | None:
        """Relay the in-process signal, set by this process's writers at once and by
        other processes' commits to the file within a few milliseconds
        (:class:`~relaybox.store._commit_watch.CommitWatch`, one per process while
        anything listens)."""
        signal = self.wakeup(channel)

        async def relay() -> None:
            while True:
                await signal.wait()
                signal.clear()
                wake.set()

        self._watchers += 1
        if self._file is not None and (self._watch is None or self._watch.done()):
            watch = CommitWatch(self._file, self._commit_seen)
            self._watch = asyncio.create_task(watch.run(), name="relaybox-sqlite-watch")
        return _TaskListener(asyncio.create_task(relay()), self)

    def _commit_seen(self) -> None:
        """Some connection committed to the file: every channel's listeners look (the
        watch cannot tell which table changed)."""
        for signal in self.wakeups.values():
            signal.set()

    def _unwatch(self) -> None:
        self._watchers -= 1
        if self._watchers <= 0 and self._watch is not None:
            self._watch.cancel()
            self._watch = None

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        await super().close()

    async def health(self) -> DatabaseHealth:
        """SQLite shows no other connection's transactions nor dead rows: the file's
        free pages and the write-ahead log's size instead (:class:`DatabaseHealth`)."""
        async with self.connect() as conn:
            row: Any = (await conn.exec_driver_sql(self.q["health_file_pages"])).one()
        pages, free = int(row[0]), int(row[1])
        wal_bytes = None
        if self._file is not None:
            with contextlib.suppress(OSError):
                wal_bytes = await asyncio.to_thread(os.path.getsize, f"{self._file}-wal")
        return DatabaseHealth(
            transactions=[], tables=[], pages=pages, free_pages=free, wal_bytes=wal_bytes
        )

    async def notify(self, conn: AsyncConnection, channel: str) -> None:
        # The only other writer is in this process and waits for our write lock,
        # so setting the signal before COMMIT cannot make it miss the rows.
        self.wakeup(channel).set()

    def wake(self, channel: str) -> None:
        self.wakeup(channel).set()

    async def copy_event_keys(self, conn: AsyncConnection, page: Sequence[Any]) -> None:
        ids, scopes, days, digests, fps = keys.event_key_columns(page)
        rows = list(zip(digests, fps, days, scopes, ids, strict=True))
        await run_on_sqlite_thread(conn, _executemany, self.q["event_keys_insert_one"], rows)

    async def copy_operation_keys(self, conn: AsyncConnection, page: Sequence[Any]) -> None:
        rows = list(zip(*keys.operation_key_columns(page), strict=True))
        await run_on_sqlite_thread(conn, _executemany, self.q["operation_keys_insert_one"], rows)

    async def copy_message_keys(self, conn: AsyncConnection, page: Sequence[Any]) -> None:
        rows = list(zip(*keys.message_key_columns(page), strict=True))
        await run_on_sqlite_thread(conn, _executemany, self.q["message_keys_insert_one"], rows)

    @contextlib.asynccontextmanager
    async def erasing(self, conn: AsyncConnection) -> AsyncIterator[None]:
        """``secure_delete`` on for the batch: the cells and overflow pages its
        UPDATEs free are overwritten with zeros, not left in the file's free space.
        The setting in force before comes back after (it is the connection's)."""
        before = (await conn.exec_driver_sql("PRAGMA secure_delete")).scalar_one()
        await conn.exec_driver_sql("PRAGMA secure_delete = 1")
        try:
            yield
        finally:
            await conn.exec_driver_sql(f"PRAGMA secure_delete = {int(before)}")

    async def checkpoint(self) -> None:
        """Copy the WAL into the database file and truncate it to nothing: the pages
        written before the erasure no longer sit in the WAL. A reader in another
        process can hold the checkpoint back; the next one completes it."""
        await run_on_pooled_sqlite(self.engine, _checkpoint)

    @contextlib.asynccontextmanager
    async def maintenance_try_lock(self) -> AsyncIterator[bool]:
        """Always this process's: SQLite runs one process per database file, each purge
        batch is its own write transaction (BEGIN IMMEDIATE), and purging twice is
        harmless."""
        yield True

    def flag(self, value: bool) -> Any:
        """An integer: SQLite compares a boolean expression's result, an integer."""
        return int(value)


class SQLiteInbox(InboxStore):
    """The inbox on SQLite: the accept's inserts in one hop to the connection's
    thread."""

    db: SQLiteBackend

    def __init__(self, db: SQLiteBackend) -> None:
        super().__init__(db)
        self.db = db
        self._insert_texts: dict[int, str] = {}  # inbox_insert for n rows (_insert_sql)
        self._keys_texts: dict[int, str] = {}  # event_keys_get for n digests (_keys_get_sql)

    INSERT_ROWS: ClassVar[int] = 32
    """Rows an inbox insert statement carries at most (13 parameters each: 416, under
    SQLite's oldest limit of 999 parameters a statement)."""

    def row_error(self, exc: BaseException) -> bool:
        """Also SQLite's refusals of a value (``DataError``, ``IntegrityError``) and of
        a parameter (``InterfaceError``); ``OperationalError`` (locked, I/O, full
        disk) is the database's, not a row's."""
        if isinstance(exc, sqlite3.DataError | sqlite3.IntegrityError | sqlite3.InterfaceError):
            return True
        return super().row_error(exc)

    async def accept(self, batch: Sequence[NewDelivery]) -> list[AcceptOutcome]:
        """Group commit in one hop to the connection's thread: BEGIN IMMEDIATE, every
        insert, COMMIT, without a thread round trip per statement (aiosqlite runs each
        call on its own thread; per-row hops cost more than the inserts)."""
        outcomes = await run_on_pooled_sqlite(self.db.engine, self._accept_sync, batch)
        if any(o.status == "accepted" for o in outcomes):
            self.db.wakeup("inbox").set()
        return outcomes

    def _accept_sync(self, db: Any, batch: Sequence[NewDelivery]) -> list[AcceptOutcome]:
        db.execute("BEGIN IMMEDIATE")
        try:
            outcomes = self._insert_rows(db, batch)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return outcomes

    def _insert_rows(self, db: Any, batch: Sequence[NewDelivery]) -> list[AcceptOutcome]:
        """Insert the deliveries in the open transaction of ``db`` (sqlite3, on the
        connection's own thread): new row, duplicate, or quarantined newcomer. The event
        keys table decides (``relaybox_event_keys``): the batch's stored keys are read
        first (:attr:`INSERT_ROWS` a statement); of the others, the first delivery of
        each key gets its inbox row (:attr:`INSERT_ROWS` a statement) and its key; the
        other deliveries are compared with the stored fingerprint digest, whether or
        not the original row still exists. A row the inbox's own UNIQUE event key
        refuses was stored before the keys table had it (before the backfill, or its
        key expired): its key is copied from it and decides as any other."""
        q = self.db.q
        digests = [keys.event_digest(*d.key) for d in batch]
        fps = [keys.fingerprint_digest(d.fingerprint) for d in batch]
        stored: dict[bytes, tuple[int, int]] = {}
        distinct = list(dict.fromkeys(digests))
        for start in range(0, len(distinct), self.INSERT_ROWS):
            chunk = distinct[start : start + self.INSERT_ROWS]
            for digest, inbox_id, fp in db.execute(self._keys_get_sql(len(chunk)), chunk):
                stored[bytes(digest)] = (inbox_id, int(fp))
        new: dict[bytes, NewDelivery] = {}
        for d, digest in zip(batch, digests, strict=True):
            if digest not in stored and digest not in new:
                new[digest] = d
        fresh = list(new.values())
        inserted: dict[tuple[str, str, str], int] = {}
        for start in range(0, len(fresh), self.INSERT_ROWS):
            part = fresh[start : start + self.INSERT_ROWS]
            values = [
                value
                for d in part
                for value in (
                    d.source,
                    d.account,
                    d.event_id,
                    d.event_type,
                    d.tenant,
                    d.fingerprint,
                    d.payload,
                    d.headers,
                    d.version,
                    "ignored" if d.ignored else "pending",
                    d.received_at,
                    d.received_at,
                    d.received_at,
                    d.traceparent,
                )
            ]
            for inbox_id, source, account, event_id in db.execute(
                self._insert_sql(len(part)), values
            ):
                inserted[source, account, event_id] = inbox_id
        key_rows = []
        for digest, d in new.items():
            inbox_id = inserted.get(d.key)
            if inbox_id is None:  # an old row under this key, without its key
                old = db.execute(q["event_keys_old_row"], d.key).fetchone()
                assert old is not None  # the inbox's UNIQUE event key refused the row
                [[inbox_id], [scope], [day], _, [fp]] = keys.event_key_columns([old])
                stored[digest] = (inbox_id, fp)
            else:
                scope, day = keys.scope_of(d.source), keys.day_of(d.received_at)
                fp = keys.fingerprint_digest(d.fingerprint)
            key_rows.append((digest, fp, day, scope, inbox_id))
        if key_rows:
            db.executemany(q["event_keys_insert_one"], key_rows)
        outcomes: list[AcceptOutcome] = []
        for d, digest, fp in zip(batch, digests, fps, strict=True):
            inbox_id = inserted.pop(d.key, None)  # the key's first row only
            if inbox_id is not None:
                outcomes.append(AcceptOutcome("ignored" if d.ignored else "accepted", inbox_id))
                if d.subject is not None:
                    db.execute(q["subject_index"], (d.subject, "inbox", str(inbox_id)))
                stored[digest] = (inbox_id, fp)
                continue
            inbox_id, stored_fp = stored[digest]
            if stored_fp == fp:
                outcomes.append(AcceptOutcome("duplicate", inbox_id))
                continue
            db.execute(q["quarantine_insert"], d.quarantine_row(inbox_id))
            if d.subject is not None:  # found by an erasure, whatever its age
                db.execute(q["subject_index"], (d.subject, "inbox", str(inbox_id)))
            outcomes.append(AcceptOutcome("quarantined", inbox_id))
        return outcomes

    def _keys_get_sql(self, count: int) -> str:
        """``event_keys_get`` for ``count`` digests (made once per count)."""
        sql = self._keys_texts.get(count)
        if sql is None:
            sql = self.db.q["event_keys_get"].replace("(?)", "(" + ", ".join("?" * count) + ")")
            self._keys_texts[count] = sql
        return sql

    def _insert_sql(self, rows: int) -> str:
        """``inbox_insert`` with its VALUES row repeated ``rows`` times (made once per
        count: at most :attr:`INSERT_ROWS` texts, which sqlite3's statement cache of
        128 keeps prepared)."""
        sql = self._insert_texts.get(rows)
        if sql is None:
            head, _, rest = self.db.q["inbox_insert"].partition("VALUES ")
            row, _, tail = rest.partition(")")
            sql = self._insert_texts[rows] = f"{head}VALUES {', '.join([row + ')'] * rows)}{tail}"
        return sql

    async def insert(
        self, conn: AsyncConnection, batch: Sequence[NewDelivery]
    ) -> list[AcceptOutcome]:
        """The same rows inside the caller's transaction (inline mode)."""
        # The transaction is open: the "begin" event issued BEGIN IMMEDIATE.
        outcomes = await run_on_sqlite_thread(conn, self._insert_rows, batch)
        if any(o.status == "accepted" for o in outcomes):
            self.db.wakeup("inbox").set()
        return outcomes


class SQLiteDispatch(DispatchStore):
    """The dispatcher's lease as a transaction of a few statements."""

    async def outbox_lease(self, request: LeaseRequest, open_secrets: SecretOpener) -> Leased:
        """The steps of PostgreSQL's one statement, one by one in one transaction (one
        writer: no other lease runs meanwhile): the lanes with due rows and room,
        :func:`allocate`'s plan, the rows, the lanes marked served, then what the
        channels need. Records nothing (:attr:`lease_records` is off)."""
        if request.sent:
            raise NotImplementedError("SQLiteStore records no successes in a lease")
        now, fair = request.now, request.fair
        async with self.db.transaction() as conn:
            wanted = (
                now,
                request.slots,
                self.db.array(request.channels),
                fair.cap,
                self.db.array(fair.full()),
            )
            lanes = [
                Lane(**self.db.mapping(r))
                for r in await self.db.rows(conn, "outbox_lease_lanes", wanted)
            ]
            plan = allocate(lanes, request.slots, now, fair)
            if not plan:
                return Leased([], set(), {})
            names = list(plan)
            take = (
                now,
                request.owner,
                request.until,
                self.db.array(names),
                self.db.array([plan[n] for n in names]),
            )
            leased = [
                self.db.mapping(r) for r in await self.db.rows(conn, "outbox_lease_rows", take)
            ]
            if not leased:
                return Leased([], set(), {})
            taken = Counter(r["lane"] or r["channel"] for r in leased)
            served = [lane for lane in lanes if taken[lane.lane]]
            marks = (
                now,
                self.db.array([lane.lane for lane in served]),
                self.db.array([lane.room(now)[1] - taken[lane.lane] for lane in served]),
            )
            await self.db.rows(conn, "lane_mark", marks)
            messages, endpoints = await self._lease_load(conn, leased, now, open_secrets)
        deliveries = sorted(
            (
                leased_delivery(
                    r,
                    request.deadline,
                    messages.get(r["message_id"]),
                    endpoints.get(r["endpoint_id"]),
                )
                for r in leased
            ),
            key=lambda d: d.id,
        )
        return Leased(deliveries, set(), {})

    async def _lease_load(
        self,
        conn: AsyncConnection,
        leased: Sequence[Mapping[str, Any]],
        now: float,
        open_secrets: SecretOpener,
    ) -> tuple[dict[str, MessageBody], dict[str, Target]]:
        message_ids = sorted({r["message_id"] for r in leased if r["message_id"]})
        endpoint_ids = sorted({r["endpoint_id"] for r in leased if r["endpoint_id"]})
        messages: dict[str, MessageBody] = {}
        endpoints: dict[str, Target] = {}
        if message_ids:
            found = await self.db.rows(conn, "delivery_messages", (self.db.array(message_ids),))
            for r in found:
                messages[r[0]] = MessageBody(r[0], r[1], r[2].encode(), r[3], r[4])
        if endpoint_ids:
            secrets: dict[str, list[str]] = {}
            for s in await self.outbox.endpoint_secrets_active(conn, endpoint_ids, now=now):
                secrets.setdefault(s.endpoint_id, []).append(s.secret)
            found = await self.db.rows(conn, "delivery_endpoints", (self.db.array(endpoint_ids),))
            for r in found:
                opened, locked = open_secrets(secrets.get(r[0], ()))
                target = Target(
                    id=r[0],
                    tenant=r[1],
                    url=r[2],
                    signature=r[3],
                    timeout=r[4],
                    schedule=tuple(json.loads(r[5])) if r[5] else None,
                    secrets=opened,
                    locked=locked,
                )
                if not r[9]:
                    target = dataclasses.replace(target, trace_context=False)
                if r[6] or r[7] or r[8]:
                    target = with_extras(target, r[6], r[7], r[8], open_secrets)
                endpoints[r[0]] = target
        return messages, endpoints


class SQLiteStore(Store):
    """The store on SQLite (:class:`SQLiteBackend`); the options are the backend's."""

    db: SQLiteBackend

    def __init__(
        self, url: str, *, busy_timeout_ms: int = 10_000, pool_timeout: float = 10.0
    ) -> None:
        db = SQLiteBackend(url, busy_timeout_ms=busy_timeout_ms, pool_timeout=pool_timeout)
        super().__init__(db, inbox=SQLiteInbox(db), dispatch=SQLiteDispatch)
        self.db = db


def _executemany(db: Any, sql: str, rows: Sequence[Sequence[Any]]) -> None:
    db.executemany(sql, rows)
