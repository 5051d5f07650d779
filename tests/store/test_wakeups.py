"""Conformance of what tells a waiting loop to look again: the outbox's next due time
(both backends) and, on SQLite, the commit watch that wakes listeners when another
connection (another process) commits to the file."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event

from relaybox.store import Store, open_store
from relaybox.store._commit_watch import CommitWatch

T0 = 1_000_000.0


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    s = open_store(database_url)
    await s.migrate()
    yield s
    await s.close()


async def _row(store: Store, channel: str, key: str, due: float) -> None:
    async with store.transaction() as conn:
        await store.inbox.outbox_insert(
            conn, channel=channel, key=key, payload="{}", tenant=None, inbox_id=None, now=due
        )


async def test_outbox_next_due_is_the_earliest_pending_row_after_now(store: Store) -> None:
    assert await store.dispatch.outbox_next_due(channels=["email"], now=T0) is None
    await _row(store, "email", "due-now", T0)
    await _row(store, "email", "later", T0 + 7.5)
    await _row(store, "email", "sooner", T0 + 0.25)
    await _row(store, "sms", "another-channel", T0 + 0.1)
    # Rows due at or before now are the lease's business, not a wake-up's.
    assert await store.dispatch.outbox_next_due(channels=["email"], now=T0) == T0 + 0.25
    assert await store.dispatch.outbox_next_due(channels=["email", "sms"], now=T0) == T0 + 0.1
    assert await store.dispatch.outbox_next_due(channels=["email"], now=T0 + 0.25) == T0 + 7.5
    assert await store.dispatch.outbox_next_due(channels=["email"], now=T0 + 8) is None
    assert await store.dispatch.outbox_next_due(channels=[], now=T0) is None
    # A row that is no longer pending never comes due.
    async with store.transaction() as conn:
        sent = "UPDATE relaybox_outbox SET status = 'sent' WHERE key = 'sooner'"
        await conn.exec_driver_sql(sent)
    assert await store.dispatch.outbox_next_due(channels=["email"], now=T0) == T0 + 7.5


async def _woken(wake: asyncio.Event, within: float) -> float | None:
    """Seconds until ``wake`` was set, or ``None`` if it was not within ``within``."""
    started = time.perf_counter()
    try:
        await asyncio.wait_for(wake.wait(), within)
    except TimeoutError:
        return None
    return time.perf_counter() - started


async def test_sqlite_listeners_wake_on_another_connections_commit(tmp_path: Path) -> None:
    """A commit by a connection outside the store (as another process's) wakes both
    channels' listeners within a few watch intervals; nothing wakes them while
    nobody writes; closing the last listener stops the watch."""
    path = tmp_path / "relaybox.db"
    store = open_store(f"sqlite:///{path}")
    await store.migrate()
    inbox, outbox = asyncio.Event(), asyncio.Event()
    listeners = [await store.db.listen("inbox", inbox), await store.db.listen("outbox", outbox)]
    other = sqlite3.connect(path, isolation_level=None)
    try:
        # The watch has read its first version once another connection's commit wakes
        # the listeners (a fixed wait could end before that on a slow machine, and a
        # commit made before that first read wakes nobody).
        other.execute("CREATE TABLE warm_up (n INTEGER)")
        for n in range(50):
            if await _woken(outbox, 0.2) is not None:
                break
            other.execute("INSERT INTO warm_up VALUES (?)", (n,))
        else:
            raise AssertionError("the watch never saw a commit of another connection")
        inbox.clear(), outbox.clear()
        assert await _woken(outbox, 0.3) is None  # idle: no wake-up
        other.execute(
            "INSERT INTO relaybox_outbox (channel, key, payload, status, next_attempt_at,"
            " created_at, updated_at) VALUES ('email', 'k', '{}', 'pending', 0, 0, 0)"
        )
        waited = await _woken(outbox, 5.0)
        assert waited is not None and waited < 2.0, waited  # generous: a loaded machine
        assert await _woken(inbox, 1.0) is not None
        for listener in listeners:
            assert listener is not None
            await listener.close()
        assert store.db._watch is None  # type: ignore[attr-defined]
    finally:
        other.close()
        await store.close()


async def test_commit_watch_waits_for_a_file_that_does_not_exist_yet(tmp_path: Path) -> None:
    path = tmp_path / "later.db"
    seen = asyncio.Event()
    watch = asyncio.create_task(CommitWatch(path, seen.set, interval=0.01).run())
    try:
        await asyncio.sleep(0.05)
        assert not path.exists()  # the watch never creates the database
        assert not watch.done()
    finally:
        watch.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watch


async def test_postgres_wakes_its_own_listeners_at_once_and_others_by_notify(pg_url: str) -> None:
    """A receiver and a worker in one process: ``wake`` sets the worker's event itself,
    before the NOTIFY's round trip; a listener of another store (another process) is
    woken by the NOTIFY."""
    here, there = open_store(pg_url), open_store(pg_url)
    mine, theirs = asyncio.Event(), asyncio.Event()
    listeners = [await here.db.listen("inbox", mine), await there.db.listen("inbox", theirs)]
    try:
        assert all(listener is not None for listener in listeners)
        here.db.wake("inbox")
        assert mine.is_set()  # no await since wake(): set by wake() itself
        assert not theirs.is_set()
        assert await _woken(theirs, 10.0) is not None
        mine.clear()
        here.db.wake("outbox")  # another channel: not this listener's
        assert not mine.is_set()
    finally:
        for listener in listeners:
            if listener is not None:
                await listener.close()
        await here.close()
        await there.close()


async def test_postgres_notify_rides_on_the_commit_and_never_on_a_rollback(pg_url: str) -> None:
    """A row added in relaybox's own transaction wakes another store's listener once
    that transaction commits, with the COMMIT (no statement of its own), and not at
    all when it rolls back. In a transaction the application's own statement began,
    the NOTIFY is a statement of its own, with the same effect."""
    here, there = open_store(pg_url), open_store(pg_url)
    await here.migrate()
    woken = asyncio.Event()
    listener = await there.db.listen("outbox", woken)
    statements: list[str] = []
    try:
        assert listener is not None

        async def add(key: str, *, app_first: bool = False, commit: bool = True) -> None:
            with contextlib.suppress(_RolledBack):
                async with here.transaction() as conn:
                    if app_first:  # the application's statement begins the transaction
                        await conn.exec_driver_sql("SELECT 1")
                    event.listen(conn.sync_connection, "before_cursor_execute", _seen)
                    await here.inbox.outbox_insert(
                        conn, channel="email", key=key, payload="{}", tenant=None,
                        inbox_id=None, now=T0,
                    )  # fmt: skip
                    await here.db.notify(conn, "outbox")
                    await here.db.notify(conn, "outbox")  # twice: still one NOTIFY
                    await asyncio.sleep(0.3)
                    assert not woken.is_set()  # not before the COMMIT
                    if not commit:
                        raise _RolledBack

        def _seen(_c: Any, _cur: Any, sql: str, *_: Any) -> None:
            statements.append(sql)

        await add("rolled-back", commit=False)
        assert await _woken(woken, 0.5) is None
        await add("committed")
        assert await _woken(woken, 10.0) is not None
        assert not any("NOTIFY" in s.upper() for s in statements)  # it went with the COMMIT
        woken.clear()
        await add("app-began", app_first=True)
        assert await _woken(woken, 10.0) is not None
        assert any("NOTIFY" in s.upper() for s in statements)  # a statement of its own
    finally:
        if listener is not None:
            await listener.close()
        await here.close()
        await there.close()


class _RolledBack(Exception):
    pass
