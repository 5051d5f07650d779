"""Every driver-private attribute that ``relaybox.store._drivers`` relies on exists on the
installed versions of asyncpg, SQLAlchemy and aiosqlite: an upgrade that renames or
drops one fails here, naming it, rather than somewhere in the worker at run time."""

from __future__ import annotations

import asyncio
import inspect
import sqlite3
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import aiosqlite
import asyncpg
import asyncpg.transaction
import pytest
from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_connection
from sqlalchemy.engine import Connection, Engine
from structlog.testing import capture_logs

from relaybox.store import _drivers, open_store
from relaybox.store.sqlite import SQLiteStore


def _has(owner: Any, name: str, package: str) -> None:
    assert hasattr(owner, name), (
        f"{package} {version(package)}: {getattr(owner, '__name__', owner)!r}.{name} is gone;"
        " relaybox.store._drivers relies on it"
    )


def test_asyncpg_transaction_internals() -> None:
    tx = asyncpg.transaction.Transaction
    for name in ("_connection", "_state", "_check_conn_validity", "start", "commit", "rollback"):
        _has(tx, name, "asyncpg")
    params = list(inspect.signature(tx.__init__).parameters)
    assert params == ["self", "connection", "isolation", "readonly", "deferrable"], (
        f"asyncpg {version('asyncpg')}: Transaction({', '.join(params[1:])}) changed;"
        " relaybox.store._drivers.FoldedTransaction calls it"
    )
    for state in ("NEW", "STARTED", "COMMITTED", "FAILED"):
        _has(asyncpg.transaction.TransactionState, state, "asyncpg")
    _has(asyncpg.Connection, "_top_xact", "asyncpg")


def test_sqlalchemy_internals() -> None:
    for name in ("_transaction", "_start_transaction", "isolation_level", "readonly", "deferrable"):
        _has(AsyncAdapt_asyncpg_connection, name, "sqlalchemy")
    _has(Connection, "_has_events", "sqlalchemy")
    _has(Engine, "_has_events", "sqlalchemy")


def test_aiosqlite_internals() -> None:
    _has(aiosqlite.Connection, "_execute", "aiosqlite")
    assert inspect.iscoroutinefunction(aiosqlite.Connection._execute)


async def test_live_asyncpg_adapter(pg_url: str) -> None:
    """On a live connection: the adapter's instance attributes, a transaction folded
    in and adopted, and the listeners check."""
    store = open_store(pg_url)
    try:
        async with store.db.connection() as conn:
            found = await _drivers.adapted(conn)
            _has(found, "_connection", "sqlalchemy")
            assert isinstance(_drivers.asyncpg_of(found), asyncpg.Connection)
            assert _drivers.open_transaction(found) is None
            assert _drivers.plain(found)
            assert conn.sync_connection is not None
            assert _drivers.begin_has_listeners(conn.sync_connection) is False
            async with conn.begin():
                con = await _drivers.driver(conn)
                assert isinstance(_drivers.open_transaction(found), _drivers.FoldedTransaction)
                assert con.is_in_transaction()
                assert await con.fetchval("SELECT 1") == 1
            assert _drivers.open_transaction(found) is None
            assert not _drivers.asyncpg_of(found).is_in_transaction()
    finally:
        await store.close()


async def test_a_closed_connection_is_discarded_not_given_back(pg_url: str) -> None:
    """A pooled connection closed under SQLAlchemy (a reset, found by the simulation's
    seed 3: the maintenance process failed every run after one) fails its next use
    once, then the pool opens a new one: statements on the driver bypass SQLAlchemy,
    which would otherwise give the dead connection back to every later use."""
    store = open_store(pg_url)
    try:
        async with store.transaction() as conn:
            first = await _drivers.driver(conn)
            assert await first.fetchval("SELECT 1") == 1
        first.terminate()  # the pool holds it, closed
        with pytest.raises(asyncpg.ConnectionDoesNotExistError):
            async with store.transaction() as conn:
                await _drivers.driver(conn)
        async with store.transaction() as conn:
            second = await _drivers.driver(conn)
            assert second is not first and await second.fetchval("SELECT 1") == 1
    finally:
        await store.close()


async def test_live_aiosqlite_thread(tmp_path: Path) -> None:
    """``run_on_sqlite_thread`` hands the function the sqlite3 connection itself."""
    store = open_store(f"sqlite:///{tmp_path / 'drivers.db'}")
    try:
        async with store.db.connection() as conn:

            def probe(db: Any, value: int) -> int:
                assert isinstance(db, sqlite3.Connection)
                return int(db.execute("SELECT ?", (value,)).fetchone()[0])

            assert await _drivers.run_on_sqlite_thread(conn, probe, 7) == 7
    finally:
        await store.close()


async def test_a_sqlite_connection_goes_back_rolled_back_only_when_a_transaction_is_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SQLite pool resets a connection it gets back by rolling back what is still
    open on it (a raw BEGIN left behind: its writes are undone) and otherwise leaves
    it alone (no hop to aiosqlite's thread per checkout)."""
    store = open_store(f"sqlite:///{tmp_path / 'reset.db'}")
    rollbacks: list[bool] = []
    try:
        async with store.transaction() as conn:
            await conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")
        async with store.db.connection() as conn:
            adapter = type((await conn.get_raw_connection()).dbapi_connection)
            real = adapter.rollback

            def rollback(self: Any) -> None:
                rollbacks.append(True)
                real(self)

            monkeypatch.setattr(adapter, "rollback", rollback)

            def leave_open(db: Any) -> None:
                db.execute("BEGIN IMMEDIATE")
                db.execute("INSERT INTO t VALUES (1)")

            await _drivers.run_on_sqlite_thread(conn, leave_open)
        assert rollbacks == [True]
        async with store.db.connection() as conn:

            def state(db: Any) -> tuple[bool, int]:
                return db.in_transaction, db.execute("SELECT count(*) FROM t").fetchone()[0]

            assert await _drivers.run_on_sqlite_thread(conn, state) == (False, 0)
        async with store.transaction() as conn:
            await conn.exec_driver_sql("INSERT INTO t VALUES (2)")
        for _ in range(3):
            async with store.db.connection() as conn:
                await _drivers.run_on_sqlite_thread(conn, state)
        assert rollbacks == [True]  # nothing open: no rollback
        async with store.db.connection() as conn:
            assert await _drivers.run_on_sqlite_thread(conn, state) == (False, 1)
    finally:
        await store.close()


async def test_run_on_pooled_sqlite_gives_the_connection_back_closed_out(
    tmp_path: Path,
) -> None:
    """``run_on_pooled_sqlite`` (the accept's checkout): the function's result; a
    transaction the function left open is rolled back (its writes undone) before the
    pool's one connection goes back, an error of the function still raised; the same
    connection serves every call, and the pool's other users after it."""
    store = open_store(f"sqlite:///{tmp_path / 'pooled.db'}")
    assert isinstance(store, SQLiteStore)
    try:
        async with store.transaction() as conn:
            await conn.exec_driver_sql("CREATE TABLE t (x INTEGER)")

        def leave_open(db: Any) -> None:
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO t VALUES (1)")
            raise RuntimeError("before its own ROLLBACK")

        def state(db: Any) -> tuple[bool, int, int]:
            count = db.execute("SELECT count(*) FROM t").fetchone()[0]
            return db.in_transaction, count, id(db)

        with pytest.raises(RuntimeError, match="before its own ROLLBACK"):
            await _drivers.run_on_pooled_sqlite(store.engine, leave_open)
        first = await _drivers.run_on_pooled_sqlite(store.engine, state)
        assert first[:2] == (False, 0)
        assert await _drivers.run_on_pooled_sqlite(store.engine, state) == first
        async with store.transaction() as conn:
            await conn.exec_driver_sql("INSERT INTO t VALUES (2)")
        assert (await _drivers.run_on_pooled_sqlite(store.engine, state))[:2] == (False, 1)
    finally:
        await store.close()


async def test_a_borrowed_connection_waits_for_the_next_use(pg_url: str) -> None:
    """The PostgreSQL store's hot statements borrow a connection per statement without
    asyncpg's acquire and release: a use that ended cleanly leaves its connection with
    the store for the next use (the pool does not see it come back); a failed use's
    connection goes back to the pool in a task the caller does not wait for (three
    passes of the event loop); a connection lost while idle is not handed out; and
    ``close()`` gives every one back and waits for them."""
    from relaybox.store.postgres import PostgresStore

    store = open_store(pg_url)
    assert isinstance(store, PostgresStore)
    pool = await store.db.start_pool()
    idle = pool.get_idle_size()
    async with store.db.borrow(pool) as first:
        assert await first.fetchval("SELECT 1") == 1
    for _ in range(5):
        await asyncio.sleep(0)
    assert pool.get_idle_size() == idle - 1  # kept by the store
    async with store.db.borrow(pool) as again:
        assert again is first
    with pytest.raises(asyncpg.DataError):
        async with store.db.borrow(pool) as conn:
            await conn.fetchval("SELECT 1/0")
    assert pool.get_idle_size() == idle - 1  # still going back: the caller did not wait
    for _ in range(5):
        await asyncio.sleep(0)
    assert pool.get_idle_size() == idle  # a failed statement's connection: to the pool
    async with store.db.borrow(pool) as conn:
        await conn.fetchval("SELECT 1")
    conn.terminate()  # lost while idle
    async with store.db.borrow(pool) as other:
        assert other is not conn and await other.fetchval("SELECT 2") == 2
    await store.close()
    assert not store.db._releasing and pool.is_closing()


async def test_a_use_waiting_for_the_pool_gets_the_connection_another_use_ends_with(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every connection of the pool out, a use that waits for the pool gets the
    next connection whose use ends (it would wait forever if the store kept it), and
    a connection unused for ``IDLE_KEEP`` seconds goes back to the pool."""
    from relaybox.store import postgres

    store = postgres.PostgresStore(pg_url, raw_pool_size=1)
    pool = await store.db.start_pool()
    entered = asyncio.Event()
    release = asyncio.Event()

    async def hold() -> None:
        async with store.db.borrow(pool) as conn:
            await conn.fetchval("SELECT 1")
            entered.set()
            await release.wait()

    async def wait_then_use() -> int:
        async with store.db.borrow(pool) as conn:
            return int(await conn.fetchval("SELECT 3"))

    holding = asyncio.create_task(hold())
    await entered.wait()
    waiting = asyncio.create_task(wait_then_use())
    for _ in range(5):
        await asyncio.sleep(0)
    assert store.db._waiting[pool] == 1
    release.set()
    assert await asyncio.wait_for(waiting, 10) == 3
    await holding

    big = postgres.PostgresStore(pg_url, raw_pool_size=2)
    pool = await big.db.start_pool()
    monkeypatch.setattr(postgres, "IDLE_KEEP", 0.0)
    both = asyncio.Barrier(2)

    async def use() -> None:
        async with big.db.borrow(pool) as conn:
            await conn.fetchval("SELECT 1")
            await both.wait()

    await asyncio.gather(use(), use())
    for _ in range(5):
        await asyncio.sleep(0)
    assert pool.get_size() == 2 and pool.get_idle_size() == 1  # the older one went back
    await store.close()
    await big.close()


async def test_close_does_not_wait_forever_for_a_connection_never_given_back(
    pg_url: str,
) -> None:
    """A connection held by a task that never gives it back (here: acquired and
    abandoned) kept asyncpg's pool close, and so ``Relaybox.close`` and the process's
    exit, waiting forever; after ``close_timeout`` the store closes it and says so."""
    from relaybox.store import postgres

    store = postgres.PostgresStore(pg_url)
    store.db.close_timeout = 1.0
    pools = [await store.db.raw_pool(), await store.db.start_pool()]
    for pool in pools:
        await pool.acquire()  # and never released
    started = time.monotonic()
    with capture_logs() as logs:
        await asyncio.wait_for(store.close(), 10)
    assert time.monotonic() - started < 1.9  # the pools wait together, not one by one
    for pool in pools:
        assert pool.is_closing() and pool.get_size() == 0  # the held connection closed too
    lines = [entry for entry in logs if entry["event"] == "store_close_timed_out"]
    assert [(line["in_use"], line["log_level"]) for line in lines] == [(1, "warning")] * 2


async def test_every_postgres_session_ends_when_idle_in_a_transaction(pg_url: str) -> None:
    """``idle_in_transaction_timeout`` reaches every session relaybox opens: the
    SQLAlchemy pool (handlers, the API), the asyncpg pools (accept, leases, holds) and
    the synchronous engine of plain-def handlers; and the server ends one left idle in
    a transaction past it."""
    from relaybox.store import postgres

    store = postgres.PostgresStore(pg_url, idle_in_transaction_timeout=0.5)
    show = "SHOW idle_in_transaction_session_timeout"
    try:
        async with store.connect() as conn:
            assert (await conn.exec_driver_sql(show)).scalar() == "500ms"
        for pool in (
            await store.db.raw_pool(),
            await store.db.generic_pool(),
            await store.db.start_pool(),
        ):
            async with store.db.borrow(pool) as raw:
                assert await raw.fetchval(show) == "500ms"

        def synchronous() -> str:
            with store.sync.transaction() as conn:
                return str(conn.exec_driver_sql(show).scalar())

        assert await asyncio.to_thread(synchronous) == "500ms"

        async with store.engine.connect() as conn:
            await conn.exec_driver_sql("BEGIN")
            await conn.exec_driver_sql("SELECT 1")
            await asyncio.sleep(1.0)
            with pytest.raises(Exception, match=r"idle-in-transaction|closed|terminat"):
                await conn.exec_driver_sql("SELECT 1")
    finally:
        await store.close()
        store.sync.close()
