"""Conformance of the store's silence area (``store/silence.py``) on SQLite and
PostgreSQL: each source's newest arrival, the arrivals a window is learned from,
the endpoints with their last success and waiting deliveries, and the state rows a
silence is raised and ended in, once."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator

import pytest

from relaybox.store import NewDelivery, Store, open_store
from relaybox.store.outbox_rows import NewMessage, new_id
from tests.support.store_rows import endpoint_write as endpoint

T0 = 1_000_000.0


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    s = open_store(database_url)
    await s.migrate()
    yield s
    await s.close()


async def arrive(store: Store, source: str, event_id: str, at: float) -> None:
    raw = event_id.encode()
    new = NewDelivery(
        source=source,
        account="a",
        event_id=event_id,
        event_type="ping",
        tenant="t",
        fingerprint=hashlib.sha256(raw).digest(),
        payload=raw,
        headers=None,
        version=None,
        received_at=at,
    )
    async with store.transaction() as conn:
        await store.inbox.insert(conn, [new])


async def test_newest_arrivals_and_the_arrivals_learned_from(store: Store) -> None:
    for n in range(5):
        await arrive(store, "a", f"a{n}", T0 + 10 * n)
    await arrive(store, "b", "b0", T0 + 7)
    assert await store.silence.sources_seen([]) == {}
    seen = await store.silence.sources_seen(["a", "b", "never"])
    assert seen == {"a": T0 + 40, "b": T0 + 7, "never": None}
    assert await store.silence.arrivals("a", T0 + 10, 3) == [T0 + 40, T0 + 30, T0 + 20]
    assert await store.silence.arrivals("a", T0 + 35, 10) == [T0 + 40]


async def test_endpoints_with_their_last_success_and_waiting_deliveries(store: Store) -> None:
    for eid, tenant in (("ep_1", "t1"), ("ep_2", "t1"), ("ep_ops", "relaybox")):
        await store.outbox.endpoint_create(endpoint(eid, tenant=tenant), "s", quota=10, now=T0)
    msg = new_id("msg", T0)
    async with store.transaction() as conn:
        assert await store.outbox.message_insert(
            conn, NewMessage(msg, "t1", "x", None, "{}", T0 + 5)
        )
        await store.outbox.delivery_insert(conn, msg, "t1", ["ep_1", "ep_ops"], now=T0 + 5)
        await store.dispatch.endpoints_succeeded(conn, ["ep_2"], now=T0 + 100)
        await store.dispatch.endpoint_succeeded(conn, "ep_2", now=T0 + 130)  # within the minute
    found = {e.id: e for e in await store.silence.endpoints("relaybox")}
    assert set(found) == {"ep_1", "ep_2"}
    assert (found["ep_1"].waiting_since, found["ep_1"].last_success_at) == (T0 + 5, None)
    assert (found["ep_2"].waiting_since, found["ep_2"].last_success_at) == (None, T0 + 100)
    assert found["ep_1"].created_at == T0 and found["ep_1"].tenant == "t1"
    async with store.transaction() as conn:
        await store.dispatch.endpoint_succeeded(conn, "ep_2", now=T0 + 161)
    found = {e.id: e for e in await store.silence.endpoints("relaybox")}
    assert found["ep_2"].last_success_at == T0 + 161


async def test_a_silence_is_raised_and_ended_once(store: Store) -> None:
    await store.silence.note("source", [], now=T0)  # nothing changed: no statement
    await store.silence.note("source", [("a", T0, 60.0), ("b", None, None)], now=T0)
    rows = await store.silence.rows("source")
    assert (rows["a"].last_seen, rows["a"].expected, rows["a"].checked_at) == (T0, 60, T0)
    assert (rows["b"].last_seen, rows["b"].silent_since) == (None, None)
    await store.silence.note("source", [("a", T0 + 5, 90.0)], now=T0 + 5)
    rows = await store.silence.rows("source")
    assert (rows["a"].last_seen, rows["a"].expected) == (T0 + 5, 90)
    assert rows["b"].checked_at == T0  # not written again
    async with store.transaction() as conn:
        assert await store.silence.start(conn, "source", "a", now=T0 + 70)
        assert not await store.silence.start(conn, "source", "a", now=T0 + 71)
    notes = [(f"ep_{n}", T0 + n, 600.0) for n in range(3)]
    await store.silence.note("endpoint", notes, now=T0 + 70)
    async with store.transaction() as conn:
        for n in range(3):
            assert await store.silence.start(conn, "endpoint", f"ep_{n}", now=T0 + 70)
    assert set(await store.silence.rows("endpoint")) == {"ep_0", "ep_1", "ep_2"}
    states = await store.silence.states()  # the sources
    assert [(s.name, s.silent_since) for s in states] == [("a", T0 + 70), ("b", None)]
    summary = await store.silence.summary(limit=2)
    assert [s.name for s in summary.silent_sources] == ["a"]
    assert summary.silent_endpoints == 3
    assert [e.name for e in summary.endpoints] == ["ep_0", "ep_1"]  # the longest first
    await store.silence.learned("source", "a", 1800.0, now=T0 + 80)
    await store.silence.learned("source", "new", None, now=T0 + 80)  # makes its row
    rows = await store.silence.rows("source")
    assert (rows["a"].learned, rows["a"].learned_at) == (1800.0, T0 + 80)
    assert (rows["new"].learned, rows["new"].learned_at) == (None, T0 + 80)
    async with store.transaction() as conn:
        assert await store.silence.end(conn, "source", "a")
        assert not await store.silence.end(conn, "source", "a")
    assert sorted(await store.silence.forget("endpoint", ["ep_1"])) == ["ep_0", "ep_2"]
    assert await store.silence.forget("endpoint", ["ep_1"]) == []
    summary = await store.silence.summary()
    assert summary.silent_endpoints == 1 and summary.silent_sources == []
