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
from relaybox.store import keys
from relaybox.store.history import Projection, ProjectionWrite
from relaybox.store.inbox_rows import InboxEvent
from relaybox.store.keys import message_digest
from relaybox.store.outbox_rows import Message, NewMessage, PublishContext

if TYPE_CHECKING:
    from relaybox.store.base import OutboxRow, Store

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
        sql, bound = self._statement(conn, name, params)
        result = conn.exec_driver_sql(sql, bound)
        return list(result.all()) if result.returns_rows else []

    def subject_index(self, conn: Connection, digest: bytes, kind: str, ref: str) -> None:
        """:meth:`ErasureStore.subject_index <relaybox.store.erasure.ErasureStore.subject_index>`
        in a synchronous transaction."""
        self.rows(conn, "subject_index", (digest, kind, ref))

    def first(self, conn: Connection, name: str, params: Sequence[Any] = ()) -> Any:
        found = self.rows(conn, name, params)
        return found[0] if found else None

    def _statement(self, conn: Connection, name: str, params: Sequence[Any]) -> tuple[str, Any]:
        return self.q[name], tuple(params)

    def _ids(self, ids: Sequence[Any]) -> Any:
        """A list parameter as the driver takes it."""
        return list(ids)

    # -- publishing -----------------------------------------------------------------------

    def message_get_by_key(
        self, conn: Connection, tenant: str, idempotency_key: str
    ) -> Message | None:
        """The tenant's message published with ``idempotency_key``, if any
        (:meth:`relaybox.store.Store.message_get_by_key`)."""
        row = self.first(
            conn,
            "message_get_by_key",
            (message_digest(tenant, idempotency_key), tenant, idempotency_key),
        )
        return None if row is None else Message.from_key_row(row, tenant, idempotency_key)

    def message_insert(self, conn: Connection, message: NewMessage) -> bool:
        """Insert ``message``; ``False`` when its (tenant, idempotency key) exists
        (:meth:`relaybox.store.Store.message_insert`)."""
        key = message.key_params()
        if key is not None and self.first(conn, "message_key_insert", key) is None:
            return False
        if self.first(conn, "message_insert", message.params()) is not None:
            return True
        if key is not None:  # an old message under this key, stored before its key
            self.rows(conn, "message_key_adopt", (key[0], message.tenant, message.idempotency_key))
        return False

    def publish_context(self, conn: Connection, tenant: str, event_type: str) -> PublishContext:
        """The event type's schema and the tenant's enabled endpoints, in one statement
        (:meth:`relaybox.store.Store.publish_context`)."""
        return PublishContext.from_rows(self.rows(conn, "publish_context", (tenant, event_type)))

    def message_sequence_next(self, conn: Connection, tenant: str, ordering_key: str) -> int:
        """The next sequence number of the tenant's ``ordering_key``, in ``conn``'s
        transaction (:meth:`relaybox.store.Store.message_sequence_next`: a concurrent
        publish with the same key waits until this transaction ends)."""
        return int(self.first(conn, "message_sequence_next", (tenant, ordering_key))[0])

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
        params = (message_id, tenant, now, self._ids(endpoint_ids), ordering_key, sequence)
        self.rows(conn, "delivery_insert", params)
        self.notify(conn, "outbox")

    def notify(self, conn: Connection, channel: str) -> None:
        """Wake listeners of ``channel`` when the transaction commits."""

    # -- handlers ---------------------------------------------------------------------------

    def inbox_begin(self, conn: Connection, inbox_id: int, *, attempt: int, now: float) -> bool:
        """The first statement of a synchronous handler's transaction: mark the row
        done under its row lock if it is still pending at ``attempt`` (the handler's
        failure rolls the mark back). Whether the row is this worker's to process."""
        sql, bound = self._statement(conn, "inbox_begin_done", (inbox_id, now, attempt))
        result = conn.exec_driver_sql(sql, bound)
        # SQLite's block returns the row; PostgreSQL's counts it.
        return bool(result.all() if result.returns_rows else result.rowcount == 1)

    def inbox_lock(self, conn: Connection, ids: Sequence[int]) -> list[InboxEvent]:
        """Lock rows still pending, until the caller's COMMIT."""
        return [InboxEvent.from_row(r) for r in self.rows(conn, "inbox_lock", (self._ids(ids),))]

    def operation_insert(
        self,
        conn: Connection,
        *,
        business_key: str,
        fingerprint: str,
        inbox_id: int | None,
        source: str | None,
        tenant: str | None,
        now: float,
    ) -> tuple[bool, str]:
        """Insert a business key; return (created, stored fingerprint)
        (:meth:`relaybox.store.Store.operation_insert`)."""
        key, row = keys.operation_params(business_key, fingerprint, inbox_id, source, tenant, now)
        if self.backend == "postgres":
            found = self.first(conn, "operation_insert", (*key, *row))
            keyed, created = bool(found[0]), bool(found[1])
        else:
            keyed = self.first(conn, "operation_insert", key) is not None
            created = keyed and self.first(conn, "operation_record", row) is not None
        if created:
            return True, fingerprint
        existing = self.first(conn, "operation_get", (key[0], business_key))
        stored, fix = keys.operation_stored(fingerprint, keyed=keyed, found=existing)
        if fix is not None:
            self.rows(conn, "operation_key_fix", (key[0], fix))
        return False, stored

    def outbox_insert_rows(
        self, conn: Connection, rows: Sequence[OutboxRow], *, now: float
    ) -> None:
        """Handlers' outbox rows (channel, key, payload, tenant, inbox id); a (channel,
        key) that exists is left alone."""
        for channel, key, payload, tenant, inbox_id in rows:
            self.rows(conn, "outbox_insert", (channel, key, payload, tenant, inbox_id, now))

    def projection_upsert(self, conn: Connection, new: ProjectionWrite) -> bool:
        """The projection's compare-and-set; whether ``new`` was written."""
        return self.first(conn, "projection_upsert", new.params()) is not None

    def projection_get(self, conn: Connection, resource_key: str) -> Projection | None:
        row = self.first(conn, "projection_get", (resource_key,))
        return None if row is None else Projection.from_row(row)

    def inbox_mark_superseded(self, conn: Connection, inbox_id: int, by: str) -> None:
        self.rows(conn, "inbox_mark_superseded", (inbox_id, by))

    # -- outcomes ---------------------------------------------------------------------------

    def inbox_retry_later(
        self, conn: Connection, inbox_id: int, *, at: float, error: str, now: float
    ) -> None:
        self.rows(conn, "inbox_retry_later", (inbox_id, at, error, now))

    def inbox_kill(
        self, conn: Connection, inbox_id: int, *, reason: str, error: str, now: float
    ) -> None:
        self.rows(conn, "inbox_kill", (inbox_id, reason, error, now))

    def attempt_insert(
        self,
        conn: Connection,
        *,
        inbox_id: int,
        attempt: int,
        outcome: str,
        error: str | None,
        worker: str,
        started_at: float,
        finished_at: float,
    ) -> None:
        params = (inbox_id, attempt, outcome, error, worker, started_at, finished_at)
        self.rows(conn, "attempt_insert", params)


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

    def _statement(self, conn: Connection, name: str, params: Sequence[Any]) -> tuple[str, Any]:
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

    def _ids(self, ids: Sequence[Any]) -> Any:
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


def sync_store(store: Store) -> SyncStore:
    """The synchronous side of ``store`` (same statements, same database)."""
    if store.backend == "postgres":
        session: Mapping[str, str] = getattr(store, "session_settings", {})
        return PostgresSyncStore(store.q, store.url, session=session)
    return SQLiteSyncStore(store.q, store.url)
