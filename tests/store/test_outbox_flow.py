"""Conformance of the store's endpoint-flow statements (``store/outbox_flow.py``) on
SQLite and PostgreSQL: the payload filter and pause columns of an endpoint, the lease
skipping a paused endpoint, the paused backlog, and replay missing's page and insert
(once per message and endpoint, in the order given, never for a purged body)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pytest

from relaybox.store import Store, open_store
from relaybox.store.outbox_rows import LeaseRequest, NewMessage, new_id
from tests.support.store_rows import endpoint_write as endpoint

T0 = 1_000_000.0


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    s = open_store(database_url)
    await s.migrate()
    yield s
    await s.close()


async def publish(store: Store, tenant: str, targets: Sequence[str], *, at: float = T0) -> str:
    msg_id = new_id("msg", at)
    async with store.transaction() as conn:
        new = NewMessage(msg_id, tenant, "pet.adopted", None, '{"id":"' + msg_id + '"}', at)
        assert await store.message_insert(conn, new)
        if targets:
            await store.delivery_insert(conn, msg_id, tenant, targets, now=at)
    return msg_id


def lease_request(owner: str = "d1") -> LeaseRequest:
    at = T0 + 1
    return LeaseRequest(
        owner=owner, slots=10, channels=["webhook"], now=at, until=at + 60, deadline=30
    )


def no_secrets(stored: Sequence[str]) -> tuple[tuple[str, ...], str | None]:
    return tuple(stored), None


async def test_an_endpoint_keeps_its_filter_and_pause(store: Store) -> None:
    flt = {"data.country": {"$in": ["PT"]}}
    await store.endpoint_create(endpoint("ep_1", payload_filter=flt), "s", quota=5, now=T0)
    await store.endpoint_create(endpoint("ep_2"), "s", quota=5, now=T0)
    found = await store.endpoint_get("ep_1", "t1")
    assert found is not None and found.payload_filter == flt and found.paused_at is None
    async with store.transaction() as conn:
        subs = (await store.publish_context(conn, "t1", "pet.born")).subscribers
    # Stored as compact JSON: what a publish reads is the size the filter was checked at.
    assert subs == [("ep_1", '["*"]', '{"data.country":{"$in":["PT"]}}'), ("ep_2", '["*"]', None)]

    await store.endpoint_update(endpoint("ep_1", payload_filter=None), now=T0 + 1)
    assert await store.endpoint_pause("ep_1", "t1", paused=True, now=T0 + 2)
    assert not await store.endpoint_pause("ep_1", None, paused=True, now=T0 + 3)
    [first, _] = await store.endpoint_list("t1", limit=10)
    assert (first.payload_filter, first.paused_at) == (None, T0 + 2)
    async with store.transaction() as conn:  # a paused endpoint still subscribes
        subscribers = (await store.publish_context(conn, "t1", "pet.born")).subscribers
        assert [s[0] for s in subscribers] == ["ep_1", "ep_2"]
    async with store.transaction() as conn:  # failing when paused
        await store.endpoint_failed(conn, "ep_1", now=T0 + 3)
    assert await store.endpoint_pause("ep_1", None, paused=False, now=T0 + 4)
    resumed = await store.endpoint_get("ep_1", None)
    # The resume ends the failure streak: the time paused is not failing time.
    assert resumed is not None and (resumed.paused_at, resumed.failing_since) == (None, None)


async def test_the_lease_skips_a_paused_endpoint(store: Store) -> None:
    await store.endpoint_create(endpoint("ep_1"), "s", quota=5, now=T0)
    await store.endpoint_create(endpoint("ep_2"), "s", quota=5, now=T0)
    await publish(store, "t1", ["ep_1", "ep_2"])
    await publish(store, "t1", ["ep_1"])
    assert await store.endpoint_pause("ep_1", "t1", paused=True, now=T0)
    leased = await store.outbox_lease(lease_request(), no_secrets)
    assert [d.lane for d in leased.deliveries] == ["ep_2"]
    assert await store.endpoint_paused_backlog() == {"ep_1": 2}
    assert await store.endpoint_pause("ep_1", "t1", paused=False, now=T0)
    again = await store.outbox_lease(lease_request("d2"), no_secrets)
    assert [d.lane for d in again.deliveries] == ["ep_1", "ep_1"]
    assert await store.endpoint_paused_backlog() == {}


async def test_missing_messages_are_paged_and_inserted_once(store: Store) -> None:
    await store.endpoint_create(endpoint("ep_1"), "s", quota=5, now=T0)
    ids = [await publish(store, "t1", [], at=T0 + n) for n in range(5)]
    await publish(store, "t2", [], at=T0)  # another tenant's
    delivered = await publish(store, "t1", ["ep_1"], at=T0 + 5)
    async with store.transaction() as conn:
        page = await store.message_missing_page(
            conn, "t1", "ep_1", since=T0 + 1, after=None, limit=2
        )
        assert [m.id for m in page] == ids[1:3]
        assert page[0].event_type == "pet.adopted" and page[0].body.startswith('{"id":')
        rest = await store.message_missing_page(
            conn, "t1", "ep_1", since=T0 + 1, after=(page[-1].created_at, page[-1].id), limit=10
        )
        assert [m.id for m in rest] == ids[3:]  # not `delivered`: it has a delivery
        # In the order given, once: a second insert of the same ids inserts nothing.
        wanted = [ids[4], ids[1], delivered, "msg_none"]
        assert await store.delivery_insert_missing(conn, "ep_1", "t1", wanted, now=T0 + 9) == 2
        assert await store.delivery_insert_missing(conn, "ep_1", "t1", wanted, now=T0 + 9) == 0
        assert await store.delivery_insert_missing(conn, "ep_1", "t1", [], now=T0 + 9) == 0
        # Another tenant's message is never inserted for this endpoint's tenant.
        assert await store.delivery_insert_missing(conn, "ep_1", "t2", ids[:1], now=T0) == 0
        left = await store.message_missing_page(conn, "t1", "ep_1", since=0, after=None, limit=9)
        assert [m.id for m in left] == [ids[0], ids[2], ids[3]]
    rows = await store.delivery_list(
        "t1", message_id=None, endpoint_id="ep_1", undelivered=False, limit=10
    )
    # Newest first: the two inserted rows in the order given (ids[4] before ids[1]).
    assert [(r.message_id, r.status) for r in rows] == [
        (ids[1], "pending"),
        (ids[4], "pending"),
        (delivered, "pending"),
    ]
    assert all(r.key == f"{r.message_id}:ep_1" for r in rows)


async def test_a_purged_message_is_neither_read_nor_inserted(store: Store) -> None:
    await store.endpoint_create(endpoint("ep_1"), "s", quota=5, now=T0)
    kept = await publish(store, "t1", [], at=T0)
    purged = await publish(store, "t1", [], at=T0)
    async with store.transaction() as conn:  # as retention leaves it
        await conn.exec_driver_sql(
            f"UPDATE relaybox_messages SET body = 'null', purged_at = 1 WHERE id = '{purged}'"
        )
    async with store.transaction() as conn:
        page = await store.message_missing_page(conn, "t1", "ep_1", since=0, after=None, limit=9)
        assert [m.id for m in page] == [kept]
        both = [kept, purged]
        assert await store.delivery_insert_missing(conn, "ep_1", "t1", both, now=T0) == 1
