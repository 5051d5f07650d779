"""The store's synchronous side (``store.sync``, :mod:`relaybox.store.sync`) on both
backends: the same named statements over a sync ``Connection``, in its transaction."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy import create_engine, text

from relaybox.errors import ConfigurationError
from relaybox.store import Store, open_store
from relaybox.store.history import ProjectionWrite
from relaybox.store.inbox_rows import NewAttempt, NewOperation
from relaybox.store.outbox_rows import PublishContext
from relaybox.store.sync import _convert
from tests.store.test_core import T0, _started
from tests.support.syncdb import sync_url


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    s = open_store(database_url)
    yield s
    await s.close()


def test_dollar_parameters_are_rewritten_for_the_drivers_paramstyle() -> None:
    sql = "SELECT $2, $1 || '%' WHERE x = $2"
    assert _convert(sql, "pyformat") == ("SELECT %(p2)s, %(p1)s || '%%' WHERE x = %(p2)s", [])
    assert _convert(sql, "format") == ("SELECT %s, %s || '%%' WHERE x = %s", [1, 0, 1])
    with pytest.raises(ConfigurationError, match="paramstyle"):
        _convert(sql, "named")


async def test_an_in_memory_sqlite_database_has_no_sync_side() -> None:
    store = open_store("sqlite:///:memory:")
    try:
        with pytest.raises(ConfigurationError, match="in-memory"), store.sync.transaction():
            pass
    finally:
        await store.close()


async def test_a_handlers_statements_run_in_the_callers_transaction(store: Store) -> None:
    inbox_id = await _started(store)
    sync = store.sync
    with sync.transaction() as conn:
        assert not sync.inbox.begin(conn, inbox_id, attempt=2, now=T0)  # not this attempt
        assert sync.inbox.begin(conn, inbox_id, attempt=1, now=T0)
        assert sync.inbox.operation_insert(
            conn,
            NewOperation(
                business_key="k",
                fingerprint="f",
                inbox_id=inbox_id,
                source="src",
                tenant=None,
                now=T0,
            ),
        ) == (True, "f")
        assert sync.inbox.operation_insert(
            conn,
            NewOperation(
                business_key="k",
                fingerprint="g",
                inbox_id=inbox_id,
                source="src",
                tenant=None,
                now=T0,
            ),
        ) == (False, "f")
        rows = [("email", "r1", '{"a": 1}', None, inbox_id)] * 2
        sync.inbox.outbox_insert_rows(conn, rows, now=T0)
        write = ProjectionWrite("res", "event", "2", "B00012", '{"s":2}', "src", inbox_id, T0)
        assert sync.history.projection_upsert(conn, write)
        assert not sync.history.projection_upsert(conn, write)  # not newer
        got = sync.history.projection_get(conn, "res")
        assert got is not None and (got.version, got.state) == ("2", {"s": 2})
        sync.history.inbox_mark_superseded(conn, inbox_id, "res@3")
        conn.rollback()  # none of it happened
    assert (await store.inbox.get(inbox_id)).status == "pending"  # type: ignore[union-attr]
    assert await store.fetch_all("SELECT * FROM relaybox_operations") == []
    assert await store.fetch_all("SELECT * FROM relaybox_outbox") == []
    with sync.transaction() as conn:
        assert sync.inbox.begin(conn, inbox_id, attempt=1, now=T0)
        sync.inbox.outbox_insert_rows(conn, [("email", "r1", "{}", "t", inbox_id)], now=T0)
    assert (await store.inbox.get(inbox_id)).status == "done"  # type: ignore[union-attr]
    [row] = await store.fetch_all("SELECT channel, key, tenant FROM relaybox_outbox")
    assert row == {"channel": "email", "key": "r1", "tenant": "t"}


async def test_outcomes_are_written_while_the_row_is_pending(store: Store) -> None:
    inbox_id = await _started(store)
    sync = store.sync
    with sync.transaction() as conn:
        [locked] = sync.inbox.lock(conn, [inbox_id])
        assert (locked.id, locked.attempts) == (inbox_id, 1)
        sync.inbox.retry_later(conn, inbox_id, at=T0 + 60, error="boom", now=T0)
        sync.inbox.attempt_insert(
            conn,
            NewAttempt(
                inbox_id=inbox_id,
                attempt=1,
                outcome="retry",
                error="boom",
                worker="w",
                started_at=T0,
                finished_at=T0,
            ),
        )
    event = await store.inbox.get(inbox_id)
    assert event is not None and (event.next_attempt_at, event.last_error) == (T0 + 60, "boom")
    with sync.transaction() as conn:
        sync.inbox.kill(conn, inbox_id, reason="invalid", error="bad", now=T0)
        assert sync.inbox.lock(conn, [inbox_id]) == []  # dead: nothing to lock
    event = await store.inbox.get(inbox_id)
    assert event is not None and (event.status, event.dead_reason) == ("dead", "invalid")
    [attempt] = await store.fetch_all("SELECT attempt, outcome FROM relaybox_inbox_attempts")
    assert attempt == {"attempt": 1, "outcome": "retry"}


async def test_the_applications_own_engine_works_as_well(store: Store, database_url: str) -> None:
    """An engine the application made (sqlite3's default transaction handling, or
    psycopg), not relaybox's."""
    engine = create_engine(sync_url(database_url))
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE t (x INTEGER)"))
            assert store.sync.outbox.publish_context(conn, "t1", "nothing") == PublishContext(
                None, []
            )
            assert store.sync.outbox.message_get_by_key(conn, "t1", "k") is None
    finally:
        engine.dispose()
