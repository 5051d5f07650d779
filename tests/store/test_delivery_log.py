"""Conformance of the delivery log's store methods on both backends: delivery_search
and its filters (tenant, status, event type, message id, idempotency key, time), and
the request and response headers an attempt records."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from relaybox.store import Store, open_store
from relaybox.store.outbox_rows import NewMessage, new_id
from tests.support.store_rows import endpoint_write as endpoint
from tests.support.store_rows import logged

T0 = 1_000_000.0


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    s = open_store(database_url)
    await s.migrate()
    yield s
    await s.close()


async def _publish(store: Store, tenant: str, event_type: str, key: str | None, at: float) -> str:
    msg_id = new_id("msg", at)
    async with store.transaction() as conn:
        body = '{"id":"' + msg_id + '"}'
        assert await store.outbox.message_insert(
            conn, NewMessage(msg_id, tenant, event_type, key, body, at)
        )
        await store.outbox.delivery_insert(conn, msg_id, tenant, [f"ep_{tenant}"], now=at)
    return msg_id


async def test_delivery_search_filters(store: Store) -> None:
    for tenant in ("t1", "t2"):
        await store.outbox.endpoint_create(
            endpoint(f"ep_{tenant}", tenant=tenant), "s", quota=5, now=T0
        )
    paid = await _publish(store, "t1", "order.paid", "k-1", T0)
    shipped = await _publish(store, "t1", "order.shipped", None, T0 + 10)
    other = await _publish(store, "t2", "order.paid", "k-1", T0 + 20)

    async def ids(tenant: str | None, **filters: object) -> list[str | None]:
        found = await store.outbox.delivery_search(tenant, limit=10, **filters)  # type: ignore[arg-type]
        return [r.message_id for r in found]

    assert await ids("t1") == [shipped, paid]  # newest first, the tenant's only
    assert await ids(None) == [other, shipped, paid]
    assert await ids("t1", event_type="order.paid") == [paid]
    assert await ids("t1", idempotency_key="k-1") == [paid]
    assert await ids(None, idempotency_key="k-1") == [other, paid]
    assert await ids("t1", message_id=other) == []  # another tenant's id finds nothing
    assert await ids("t1", status="pending") == [shipped, paid]
    assert await ids("t1", status="sent") == []
    assert await ids(None, since=T0 + 5, until=T0 + 15) == [shipped]
    found = await store.outbox.delivery_search("t1", limit=1)
    assert [(r.message_id, r.event_type, r.tenant) for r in found] == [
        (shipped, "order.shipped", "t1")
    ]


async def test_attempts_keep_their_headers_until_retention(store: Store) -> None:
    await store.outbox.endpoint_create(endpoint("ep_t1", tenant="t1"), "s", quota=5, now=T0)
    msg_id = await _publish(store, "t1", "order.paid", None, T0)
    [row] = await store.outbox.delivery_search("t1", limit=1)
    headers = '{"request": [["webhook-id", "m"]], "response": [["Server", "x"]]}'
    async with store.transaction() as conn:
        await store.dispatch.outbox_attempts_insert(
            conn,
            [
                logged(row.id, 1, "retry", started=T0, code=500, error="HTTP 500",
                       response="oops", headers=headers),
                logged(row.id, 2, "retry", started=T0 + 5, code=502, error="HTTP 502"),
            ],
        )  # fmt: skip
    first, second = await store.outbox.attempt_list(msg_id, "t1")
    assert (first.headers, second.headers) == (headers, None)
    assert await store.outbox.attempt_list(msg_id, "t2") == []


async def test_attempt_minutes_count_outcomes_per_minute(store: Store) -> None:
    await store.outbox.endpoint_create(endpoint("ep_t1", tenant="t1"), "s", quota=5, now=T0)
    await _publish(store, "t1", "order.paid", None, T0)
    [row] = await store.outbox.delivery_search("t1", limit=1)
    minute = 60 * 16_667  # 1_000_020.0: a minute's start after T0
    rows = [
        logged(row.id, 1, "retry", started=minute + 1, code=500, error="HTTP 500"),
        logged(row.id, 2, "retry", started=minute + 30, code=500, error="HTTP 500"),
        logged(row.id, 3, "sent", started=minute + 61),
    ]
    async with store.transaction() as conn:
        await store.dispatch.outbox_attempts_insert(conn, rows)
    assert await store.outbox.attempt_minutes(minute) == [
        (minute, "retry", 2),
        (minute + 60, "sent", 1),
    ]
    assert await store.outbox.attempt_minutes(minute + 60) == [(minute + 60, "sent", 1)]
