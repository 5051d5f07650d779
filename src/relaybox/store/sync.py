"""The store's synchronous side: relaybox's statements over a *sync* SQLAlchemy
``Connection`` (sqlite3, or psycopg 3 / psycopg2 under PostgreSQL), in the caller's
transaction.

Flask, scripts and Django hold a synchronous connection in the transaction of their
own change; :meth:`Relaybox.publish_sync` and synchronous handlers run relaybox's
statements there, so the change, the message, its outbox rows, the business keys and
the inbox row's completion commit together. The statements are the named blocks of
``sql/<backend>*.sql`` that the async store runs: PostgreSQL's ``$n`` parameters are
rewritten once per statement for the driver's ``paramstyle`` (``%(pn)s`` for psycopg,
``%s`` for ``format`` drivers), SQLite's ``?n`` pass as they are.

:class:`SyncStore` also owns the default provider of synchronous transactions: a
pooled sync engine made from the box's database URL, created on first use
(:meth:`SyncStore.transaction`).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, ClassVar

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine, create_engine, make_url

from relaybox.errors import ConfigurationError
from relaybox.store import statements as st
from relaybox.store.history import Projection, ProjectionWrite
from relaybox.store.inbox_rows import InboxEvent, NewAttempt, NewOperation, OutboxRow
from relaybox.store.outbox_rows import Message, NewMessage, PublishContext

if TYPE_CHECKING:
    from relaybox.store.backend import Backend

__all__ = ["SyncStore", "sync_store"]

_DOLLAR = re.compile(r"\$(\d+)")


class SyncStore:
    """relaybox's statements on a synchronous ``Connection``; methods taking ``conn``
    run in its transaction and never commit it."""

    backend: ClassVar[str]

    def __init__(self, queries: Mapping[str, str], url: str, *, pool_size: int = 5) -> None:
        self.q = queries
        self.url = url
        self._pool_size = pool_size
        self._engine: Engine | None = None
        self._lock = threading.Lock()
        self._converted: dict[tuple[str, str], tuple[str, list[int]]] = {}
        self.inbox = SyncInbox(self)
        self.outbox = SyncOutbox(self)
        self.history = SyncHistory(self)
        self.erasure = SyncErasure(self)

    # -- the default provider of transactions -------------------------------------------

    @property
    def engine(self) -> Engine:
        """The pooled sync engine of the box's database, made on first use."""
        with self._lock:  # two threads asking first must not make two pools
            if self._engine is None:
                self._engine = self._make_engine()
            return self._engine

    def _make_engine(self) -> Engine:
        raise NotImplementedError

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A connection of :attr:`engine` in a transaction: committed when the block
        ends, rolled back when it raises."""
        with self.engine.begin() as conn:
            yield conn

    def close(self) -> None:
        """Close the engine's pooled connections (a later use opens new ones)."""
        with self._lock:
            engine, self._engine = self._engine, None
        if engine is not None:
            engine.dispose()

    # -- primitives -----------------------------------------------------------------------

    def rows(self, conn: Connection, name: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run the named query in ``conn``'s transaction; rows read by index or name."""
        sql, bound = self.statement(conn, name, params)
        result = conn.exec_driver_sql(sql, bound)
        return list(result.all()) if result.returns_rows else []

    def first(self, conn: Connection, name: str, params: Sequence[Any] = ()) -> Any:
        found = self.rows(conn, name, params)
        return found[0] if found else None

    def statement(self, conn: Connection, name: str, params: Sequence[Any]) -> tuple[str, Any]:
        return self.q[name], tuple(params)

    def array(self, ids: Sequence[Any]) -> Any:
        """A list parameter as the driver takes it."""
        return list(ids)

    # -- publishing -----------------------------------------------------------------------

    def notify(self, conn: Connection, channel: str) -> None:
        """Wake listeners of ``channel`` when the transaction commits."""

    # -- handlers ---------------------------------------------------------------------------

    # -- outcomes ---------------------------------------------------------------------------


class SyncInbox:
    """The inbox's statements of a synchronous handler's transaction
    (:class:`~relaybox.store.inbox.InboxStore`'s, synchronous)."""

    def __init__(self, db: SyncStore) -> None:
        self.db = db

    def begin(self, conn: Connection, inbox_id: int, *, attempt: int, now: float) -> bool:
        """The first statement of a synchronous handler's transaction: mark the row
        done under its row lock if it is still pending at ``attempt`` (the handler's
        failure rolls the mark back). Whether the row is this worker's to process."""
        sql, bound = self.db.statement(conn, *st.inbox_begin(inbox_id, attempt=attempt, now=now))
        result = conn.exec_driver_sql(sql, bound)
        # SQLite's block returns the row; PostgreSQL's counts it.
        return bool(result.all() if result.returns_rows else result.rowcount == 1)

    def lock(self, conn: Connection, ids: Sequence[int]) -> list[InboxEvent]:
        """Lock rows still pending, until the caller's COMMIT."""
        return st.inbox_events(self.db.rows(conn, *st.inbox_lock(ids, self.db.array)))

    def operation_insert(self, conn: Connection, operation: NewOperation) -> tuple[bool, str]:
        """Insert a business key; return (created, stored fingerprint)."""
        return st.run_sync(self.db, conn, st.operation_insert(operation, self.db.backend))

    def outbox_insert_rows(
        self, conn: Connection, rows: Sequence[OutboxRow], *, now: float
    ) -> None:
        """Handlers' outbox rows; a (channel, key) that exists is left alone."""
        st.run_sync(self.db, conn, st.outbox_insert_rows(rows, now=now))

    def retry_later(
        self, conn: Connection, inbox_id: int, *, at: float, error: str, now: float
    ) -> None:
        self.db.rows(conn, *st.inbox_retry_later(inbox_id, at=at, error=error, now=now))

    def kill(self, conn: Connection, inbox_id: int, *, reason: str, error: str, now: float) -> None:
        self.db.rows(conn, *st.inbox_kill(inbox_id, reason=reason, error=error, now=now))

    def attempt_insert(self, conn: Connection, attempt: NewAttempt) -> None:
        self.db.rows(conn, *st.attempt_insert(attempt))


class SyncOutbox:
    """Publishing in the caller's synchronous transaction
    (:class:`~relaybox.store.outbox.OutboxStore`'s, synchronous)."""

    def __init__(self, db: SyncStore) -> None:
        self.db = db

    def message_get_by_key(
        self, conn: Connection, tenant: str, idempotency_key: str
    ) -> Message | None:
        """The tenant's message published with ``idempotency_key``, if any
        (:meth:`relaybox.store.outbox.OutboxStore.message_get_by_key`)."""
        row = self.db.first(conn, *st.message_get_by_key(tenant, idempotency_key))
        return None if row is None else Message.from_key_row(row, tenant, idempotency_key)

    def message_insert(self, conn: Connection, message: NewMessage) -> bool:
        """Insert ``message``; ``False`` when its (tenant, idempotency key) exists
        (:meth:`relaybox.store.outbox.OutboxStore.message_insert`)."""
        return st.run_sync(self.db, conn, st.message_insert(message))

    def publish_context(self, conn: Connection, tenant: str, event_type: str) -> PublishContext:
        """The event type's schema and the tenant's enabled endpoints, in one statement
        (:meth:`relaybox.store.outbox.OutboxStore.publish_context`)."""
        return PublishContext.from_rows(self.db.rows(conn, *st.publish_context(tenant, event_type)))

    def message_sequence_next(self, conn: Connection, tenant: str, ordering_key: str) -> int:
        """The next sequence number of the tenant's ``ordering_key``, in ``conn``'s
        transaction (:meth:`relaybox.store.outbox.OutboxStore.message_sequence_next`: a
        concurrent publish with the same key waits until this transaction ends)."""
        return int(self.db.first(conn, *st.message_sequence_next(tenant, ordering_key))[0])

    def delivery_insert(
        self,
        conn: Connection,
        message_id: str,
        tenant: str,
        endpoint_ids: Sequence[str],
        *,
        now: float,
        ordering_key: str | None = None,
        sequence: int | None = None,
    ) -> None:
        """One pending outbox row per endpoint for the message, and a wake for the
        dispatchers when it commits (PostgreSQL; on SQLite they poll). The rows of
        ordered endpoints carry ``ordering_key`` and ``sequence``."""
        statement = st.delivery_insert(
            message_id,
            tenant,
            endpoint_ids,
            self.db.array,
            now=now,
            ordering_key=ordering_key,
            sequence=sequence,
        )
        self.db.rows(conn, *statement)
        self.db.notify(conn, "outbox")


class SyncHistory:
    """Projections in a synchronous handler's transaction
    (:class:`~relaybox.store.history.HistoryStore`'s, synchronous)."""

    def __init__(self, db: SyncStore) -> None:
        self.db = db

    def projection_upsert(self, conn: Connection, new: ProjectionWrite) -> bool:
        """The projection's compare-and-set; whether ``new`` was written."""
        return self.db.first(conn, "projection_upsert", new.params()) is not None

    def projection_get(self, conn: Connection, resource_key: str) -> Projection | None:
        row = self.db.first(conn, "projection_get", (resource_key,))
        return None if row is None else Projection.from_row(row)

    def inbox_mark_superseded(self, conn: Connection, inbox_id: int, by: str) -> None:
        self.db.rows(conn, *st.inbox_mark_superseded(inbox_id, by))


class SyncErasure:
    """The subject index, in a synchronous transaction
    (:class:`~relaybox.store.erasure.ErasureStore`'s, synchronous)."""

    def __init__(self, db: SyncStore) -> None:
        self.db = db

    def subject_index(self, conn: Connection, digest: bytes, kind: str, ref: str) -> None:
        """:meth:`ErasureStore.subject_index <relaybox.store.erasure.ErasureStore.subject_index>`
        in a synchronous transaction."""
        self.db.rows(conn, *st.subject_index(digest, kind, ref))

    def subject_inherit(self, conn: Connection, message_id: str, *, inbox_id: int) -> None:
        """:meth:`ErasureStore.subject_inherit
        <relaybox.store.erasure.ErasureStore.subject_inherit>` of an inbox row, in a
        synchronous transaction."""
        self.db.rows(conn, "subject_inherit_inbox", (message_id, inbox_id))


class PostgresSyncStore(SyncStore):
    backend: ClassVar[str] = "postgres"

    def __init__(
        self, queries: Mapping[str, str], url: str, *, session: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(queries, url)
        # The async store's session settings (idle_in_transaction_session_timeout).
        self._session = {k: v for k, v in (session or {}).items() if k != "application_name"}

    def _make_engine(self) -> Engine:
        url = make_url(self.url).set(drivername="postgresql+psycopg")
        connect_args: dict[str, Any] = {"connect_timeout": 5, "application_name": "relaybox"}
        if self._session:
            connect_args["options"] = " ".join(f"-c {k}={v}" for k, v in self._session.items())
        try:
            return create_engine(
                url,
                pool_size=self._pool_size,
                max_overflow=self._pool_size,
                pool_pre_ping=True,
                connect_args=connect_args,
            )
        except ModuleNotFoundError as exc:
            raise ConfigurationError(
                "synchronous code on PostgreSQL needs psycopg 3: pip install 'relaybox[psycopg]'"
            ) from exc

    def statement(self, conn: Connection, name: str, params: Sequence[Any]) -> tuple[str, Any]:
        """The block with its ``$n`` written in the driver's ``paramstyle``."""
        style = conn.dialect.paramstyle
        converted = self._converted.get((name, style))
        if converted is None:
            converted = self._converted[(name, style)] = _convert(self.q[name], style)
        sql, order = converted
        if style == "pyformat":
            return sql, {f"p{i + 1}": v for i, v in enumerate(params)}
        return sql, tuple(params[i] for i in order)

    def notify(self, conn: Connection, channel: str) -> None:
        """A NOTIFY in the application's transaction, delivered at its COMMIT (as the
        async ``publish`` does)."""
        self.rows(conn, f"notify_{channel}")


def _convert(sql: str, style: str) -> tuple[str, list[int]]:
    """``sql`` with ``$n`` rewritten for ``style`` (and ``%`` doubled), with the order
    in which positional styles take the parameters."""
    escaped = sql.replace("%", "%%")
    order: list[int] = []
    if style == "pyformat":
        return _DOLLAR.sub(lambda m: f"%(p{m.group(1)})s", escaped), order
    if style == "format":

        def positional(m: re.Match[str]) -> str:
            order.append(int(m.group(1)) - 1)
            return "%s"

        return _DOLLAR.sub(positional, escaped), order
    raise ConfigurationError(
        f"a PostgreSQL driver with paramstyle {style!r}: relaybox's synchronous statements"
        " run on psycopg 3 or psycopg2 (pyformat) and format-style drivers"
    )


class SQLiteSyncStore(SyncStore):
    backend: ClassVar[str] = "sqlite"

    def __init__(self, queries: Mapping[str, str], url: str, *, busy_timeout_ms: int = 10_000):
        super().__init__(queries, url)
        self._busy_timeout_ms = busy_timeout_ms

    def array(self, ids: Sequence[Any]) -> Any:
        return json.dumps(list(ids))

    def _make_engine(self) -> Engine:
        """sqlite3 with the async store's settings: a busy timeout, ``synchronous=FULL``,
        foreign keys, and ``BEGIN IMMEDIATE`` (the write lock from the first statement:
        no upgrade from a read lock that another writer could refuse)."""
        url = make_url(self.url)
        if url.database in (None, "", ":memory:"):
            raise ConfigurationError(
                "an in-memory SQLite database is not shared with another connection:"
                " synchronous code needs a database file (or box.sync_transaction set)"
            )
        engine = create_engine(url.set(drivername="sqlite+pysqlite"))
        busy = int(self._busy_timeout_ms)

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA busy_timeout={busy}")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine


def sync_store(db: Backend) -> SyncStore:
    """The synchronous side of ``db`` (same statements, same database)."""
    if db.backend == "postgres":
        session: Mapping[str, str] = getattr(db, "session_settings", {})
        return PostgresSyncStore(db.q, db.url, session=session)
    return SQLiteSyncStore(db.q, db.url)
