"""Every reliance of the stores on their drivers' private attributes, in one place.

relaybox folds statements into the BEGIN and COMMIT of a transaction SQLAlchemy holds
(one round trip each, on asyncpg), begins a worker's transactions without a greenlet
hop, and runs SQLite's accept batch on the connection's own thread. That needs a few
attributes the drivers do not document: SQLAlchemy's asyncpg adapter
(``_connection``, ``_transaction``, ``_start_transaction``), SQLAlchemy's
``Connection._has_events`` and ``Engine._has_events``, asyncpg's ``Transaction``
(its constructor, ``_connection``, ``_state``, ``_check_conn_validity``) and
``Connection._top_xact``, aiosqlite's ``Connection._execute`` and ``_conn``.
``tests/store/test_drivers.py`` checks each of them on the installed versions, so a
driver upgrade that moves one fails there, by name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

import asyncpg
import asyncpg.transaction
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

__all__ = [
    "FoldedTransaction",
    "adapted",
    "adopt",
    "asyncpg_of",
    "begin_has_listeners",
    "discard_if_closed",
    "driver",
    "open_transaction",
    "plain",
    "run_on_pooled_sqlite",
    "run_on_sqlite_thread",
]

T = TypeVar("T")

_NEW = asyncpg.transaction.TransactionState.NEW
_STARTED = asyncpg.transaction.TransactionState.STARTED
_COMMITTED = asyncpg.transaction.TransactionState.COMMITTED
_FAILED = asyncpg.transaction.TransactionState.FAILED


async def adapted(conn: AsyncConnection) -> Any:
    """SQLAlchemy's adapter around the asyncpg connection under ``conn``. Without the
    greenlet hop of ``get_raw_connection()`` while ``conn`` holds its connection."""
    sync = conn.sync_connection
    if sync is not None and not sync.closed and not sync.invalidated:
        return sync.connection.dbapi_connection
    return (await conn.get_raw_connection()).dbapi_connection


def plain(adapted: Any) -> bool:
    """Whether the adapter begins plain transactions (no isolation level, read-only or
    deferrable option that relaybox's own BEGIN would have to repeat)."""
    return adapted.isolation_level is None and not adapted.readonly and not adapted.deferrable


async def driver(conn: AsyncConnection) -> asyncpg.Connection:
    """The asyncpg connection under ``conn``, inside ``conn``'s transaction.

    SQLAlchemy's asyncpg adapter issues BEGIN lazily, on its own first statement; a
    statement sent to the driver before that would run outside the transaction, so
    the transaction is started first (tests/store/test_store.py checks that a rolled-back
    transaction takes the driver's statements with it), as a :class:`FoldedTransaction`
    so that its COMMIT can carry a statement.
    """
    found = await adapted(conn)
    await discard_if_closed(conn, found)
    if found._transaction is None and conn.in_transaction():
        if plain(found):
            tx = FoldedTransaction(found._connection)
            await tx.start()
            found._transaction = tx
        else:
            await found._start_transaction()
    return found._connection


async def discard_if_closed(conn: AsyncConnection, found: Any) -> None:
    """Raise ``ConnectionDoesNotExistError`` if the asyncpg connection under ``conn``
    is closed (a reset, the server gone), after invalidating ``conn``: the pool then
    opens a new connection for the next transaction. relaybox's statements on the
    driver bypass SQLAlchemy, which therefore never saw the disconnect, and would
    have given the same dead connection back to every later use (the maintenance
    process failed every run after one database reset until it was restarted)."""
    if found._connection.is_closed():
        await conn.invalidate()
        raise asyncpg.ConnectionDoesNotExistError(
            "the database connection was closed: the next transaction opens a new one"
        )


class FoldedTransaction(asyncpg.transaction.Transaction):  # type: ignore[misc]
    """An asyncpg transaction whose BEGIN and COMMIT can each carry one more statement
    in the same round trip (simple query protocol: one message, several statements).
    SQLAlchemy's adapter holds it like its own: its commit and rollback end it.

    A round trip costs the worker more CPU (loopback ``send()``) than the statements
    themselves (bench/README.md): an event's BEGIN goes with its completion, its
    COMMIT with the next event's start mark.
    """

    __slots__ = ("_then",)
    _state: Any  # the Cython base class's slot (asyncpg ships no type stubs)

    def __init__(self, connection: asyncpg.Connection) -> None:
        super().__init__(connection, None, False, False)
        self._then: list[str] = []

    @property
    def started(self) -> bool:
        return self._state is _STARTED

    async def begin_with(self, sql: str) -> str:
        """BEGIN, then ``sql``; returns ``sql``'s status (``UPDATE 1``)."""
        self._check_conn_validity("begin_with")
        con: Any = self._connection
        if self._state is not _NEW or con._top_xact is not None or con.is_in_transaction():
            raise asyncpg.InterfaceError("begin_with: a transaction is already open")
        con._top_xact = self
        try:
            status: str = await con.execute("BEGIN;" + sql)
        except BaseException:
            # BEGIN went through if the connection is in a (failed) transaction.
            if not con.is_closed() and con.is_in_transaction():
                self._state = _STARTED
            else:
                self._state = _FAILED
                con._top_xact = None
            raise
        self._state = _STARTED
        return status

    def before_commit(self, sql: str, *, once: bool = False) -> None:
        """Send ``sql`` with the COMMIT, after what was given before (its failure fails
        the COMMIT); with ``once``, not again if it was given already."""
        if not (once and sql in self._then):
            self._then.append(sql)

    async def commit(self) -> None:
        sql, self._then = ";".join(self._then) or None, []
        if self._state is not _STARTED:
            await super().commit()  # raises asyncpg's error for the state
            return
        self._check_conn_validity("commit")
        con: Any = self._connection
        if con._top_xact is self:
            con._top_xact = None
        try:
            status = await con.execute("COMMIT;" if sql is None else sql + ";COMMIT;")
            if status != "COMMIT":  # a failed transaction "commits" as a ROLLBACK
                raise asyncpg.InterfaceError(f"COMMIT answered {status}: nothing committed")
        except BaseException:
            self._state = _FAILED
            # A failed statement before the COMMIT leaves an aborted transaction open.
            with contextlib.suppress(Exception):
                if not con.is_closed() and con.is_in_transaction():
                    await con.execute("ROLLBACK;")
            raise
        self._state = _COMMITTED

    async def rollback(self) -> None:
        self._then = []
        await super().rollback()


def asyncpg_of(found: Any) -> asyncpg.Connection:
    """The asyncpg connection of an adapter from :func:`adapted`."""
    con: asyncpg.Connection = found._connection
    return con


def open_transaction(found: Any) -> Any:
    """The asyncpg transaction an adapter from :func:`adapted` holds, or ``None``."""
    return found._transaction


def adopt(found: Any, tx: FoldedTransaction) -> None:
    """Make ``tx`` the adapter's own transaction: SQLAlchemy's commit and rollback end it."""
    found._transaction = tx


def begin_has_listeners(sync: Connection) -> bool:
    """Whether a "begin" event listener may run on ``sync`` (the connection's or its
    engine's): then its BEGIN may run SQL and needs SQLAlchemy's greenlet."""
    return bool(sync._has_events or sync.engine._has_events)


def sqlite_in_transaction(aio: Any) -> bool:
    """Whether a transaction is open on the sqlite3 connection under aiosqlite's ``aio``
    (read without a hop to its thread)."""
    return bool(aio._conn.in_transaction)


async def run_on_sqlite_thread(conn: AsyncConnection, fn: Callable[..., T], *args: Any) -> T:
    """``fn(sqlite3_connection, *args)`` on the aiosqlite connection's own thread, in
    one hop (aiosqlite otherwise hops threads once per statement)."""
    aio = (await conn.get_raw_connection()).driver_connection
    assert aio is not None  # an open pooled connection always has its driver's
    result: T = await aio._execute(fn, aio._conn, *args)
    return result


async def run_on_pooled_sqlite(engine: AsyncEngine, fn: Callable[..., T], *args: Any) -> T:
    """``fn(sqlite3_connection, *args)`` on a connection of ``engine``'s pool, checked out
    for this call alone, in one hop to its thread. The pool's raw checkout and return
    took ~15 µs a call here where a SQLAlchemy ``Connection`` around them took ~48
    (pinned to one core, as the accept benchmark runs: ~2 % of the SQLite accept's CPU
    at ~500 batches a second). ``fn`` ends what it begins; a transaction it left open
    (it raised before its own ROLLBACK) is rolled back before the connection goes back."""
    raw = await engine.raw_connection()
    try:
        aio = raw.driver_connection
        assert aio is not None  # an open pooled connection always has its driver's
        try:
            result: T = await aio._execute(fn, aio._conn, *args)
        finally:
            if sqlite_in_transaction(aio):
                await aio._execute(_rollback, aio._conn)
    finally:
        raw.close()
    return result


def _rollback(db: Any) -> None:
    db.rollback()
