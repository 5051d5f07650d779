"""Conformance of the store's ordered delivery on SQLite and PostgreSQL: sequence
numbers per (tenant, ordering key), keyed deliveries to ordered endpoints only, the
lease's per-key hold (pending and dead heads, ``on_dead``), blocked keys and their
release."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pytest

from relaybox.store import Store, open_store
from relaybox.store.dispatch_rows import LeaseRequest
from relaybox.store.outbox_rows import Delivery, NewMessage, new_id
from tests.store.test_outbox import endpoint, no_secrets
from tests.support.store_rows import attempt

T0 = 1_000_000.0


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    s = open_store(database_url)
    await s.migrate()
    yield s
    await s.close()


async def publish(store: Store, targets: Sequence[str], key: str | None) -> str:
    """A message of tenant t1 with ``key`` (its next sequence number) to ``targets``."""
    msg_id = new_id("msg", T0)
    async with store.transaction() as conn:
        seq = None if key is None else await store.outbox.message_sequence_next(conn, "t1", key)
        body = '{"id":"' + msg_id + '"}'
        new = NewMessage(msg_id, "t1", "pet.adopted", None, body, T0, key, seq)
        assert await store.outbox.message_insert(conn, new)
        await store.outbox.delivery_insert(
            conn, msg_id, "t1", targets, now=T0, ordering_key=key, sequence=seq
        )
    return msg_id


def request(at: float, owner: str = "d1") -> LeaseRequest:
    return LeaseRequest(
        owner=owner, slots=50, channels=["webhook"], now=at, until=at + 60, deadline=30
    )


async def lease(store: Store, at: float) -> list[Delivery]:
    return (await store.dispatch.outbox_lease(request(at), no_secrets)).deliveries


def seqs(leased: Sequence[Delivery], lane: str) -> list[int]:
    """The sequence numbers leased of ``lane`` (0: a message without a key)."""
    return sorted((d.message.sequence or 0) if d.message else -1 for d in leased if d.lane == lane)


async def record(store: Store, d: Delivery, status: str, at: float, next_at: float = 0) -> None:
    async with store.transaction() as conn:
        done = attempt(d, status, code=500, error="boom", next_at=next_at, reason="failed")
        assert await store.dispatch.outbox_record(conn, [done], now=at)


async def test_sequence_numbers_per_tenant_and_key(store: Store) -> None:
    async with store.transaction() as conn:
        got = [await store.outbox.message_sequence_next(conn, "t1", "a") for _ in range(3)]
        got.append(await store.outbox.message_sequence_next(conn, "t1", "b"))
        got.append(await store.outbox.message_sequence_next(conn, "t2", "a"))
    assert got == [1, 2, 3, 1, 1]
    msg = await publish(store, [], "a")
    found = await store.outbox.message_get(msg, "t1")
    assert found is not None and (found.ordering_key, found.sequence) == ("a", 4)


async def test_an_ordered_endpoint_takes_one_delivery_per_key(store: Store) -> None:
    await store.outbox.endpoint_create(endpoint("ep_o", ordered=True), "s", quota=5, now=T0)
    await store.outbox.endpoint_create(endpoint("ep_u"), "s", quota=5, now=T0)
    for key in ["a", "a", "b", "a", "b"]:
        await publish(store, ["ep_o", "ep_u"], key)
    await publish(store, ["ep_o"], None)  # no key: never held back
    first = await lease(store, T0 + 1)
    # The ordered endpoint: each key's head only (a1, b1) and the unkeyed message.
    assert seqs(first, "ep_o") == [0, 1, 1]
    # The unordered endpoint takes up to its cap (4), keys or not.
    assert len([d for d in first if d.lane == "ep_u"]) == 4
    assert all(d.message and d.message.sequence for d in first if d.lane == "ep_u")
    # A second dispatcher finds nothing of the ordered endpoint while the heads run.
    assert [d for d in await lease(store, T0 + 2) if d.lane == "ep_o"] == []

    # Outbox ids follow publish order: a1 is the first message's, b1 the third's.
    a1, b1, unkeyed = sorted((d for d in first if d.lane == "ep_o"), key=lambda d: d.id)
    await record(store, unkeyed, "sent", T0 + 3)
    # a1 fails and waits for its retry: a stays held; b1 is sent: b2 goes.
    await record(store, a1, "pending", T0 + 3, next_at=T0 + 100)
    await record(store, b1, "sent", T0 + 3)
    nxt = [d for d in await lease(store, T0 + 4) if d.lane == "ep_o"]
    assert [d.message.sequence if d.message else None for d in nxt] == [2]
    await record(store, nxt[0], "sent", T0 + 5)
    # a1's retry is due: it goes, alone of its key.
    retry = [d for d in await lease(store, T0 + 101) if d.lane == "ep_o"]
    assert [d.id for d in retry] == [a1.id] and retry[0].attempt == 2
    await record(store, retry[0], "sent", T0 + 102)
    after = [d for d in await lease(store, T0 + 103) if d.lane == "ep_o"]
    assert [d.message.sequence if d.message else None for d in after] == [2]


@pytest.mark.parametrize("on_dead", ["hold", "skip"])
async def test_a_dead_head_holds_its_key_or_is_skipped(store: Store, on_dead: str) -> None:
    await store.outbox.endpoint_create(
        endpoint("ep_o", ordered=True, on_dead=on_dead), "s", quota=5, now=T0
    )
    for key in ["a", "a", "a", "b"]:
        await publish(store, ["ep_o"], key)
    first = await lease(store, T0 + 1)
    assert seqs(first, "ep_o") == [1, 1]
    a1 = min(first, key=lambda d: d.id)  # the first message, key a
    for d in first:
        await record(store, d, "dead" if d is a1 else "sent", T0 + 2)
    nxt = await lease(store, T0 + 3)
    blocked = await store.outbox.ordering_blocked_keys(endpoint_id=None, tenant=None, limit=10)
    if on_dead == "skip":
        assert seqs(nxt, "ep_o") == [2]
        assert blocked == []
        return
    assert nxt == []
    assert [(b.endpoint_id, b.ordering_key, b.sequence, b.dead, b.waiting) for b in blocked] == [
        ("ep_o", "a", 1, 1, 2)
    ]
    assert await store.outbox.ordering_blocked_count() == 1
    assert await store.outbox.ordering_blocked_keys(endpoint_id="ep_x", tenant=None, limit=10) == []
    assert await store.outbox.ordering_blocked_keys(endpoint_id=None, tenant="t2", limit=10) == []
    # The operator releases the key: the dead head stays a dead letter, a2 goes.
    assert await store.outbox.ordering_key_release("ep_o", "a", now=T0 + 4) == 1
    assert await store.outbox.ordering_key_release("ep_o", "a", now=T0 + 4) == 0
    assert await store.outbox.ordering_blocked_keys(endpoint_id=None, tenant=None, limit=10) == []
    released = await lease(store, T0 + 5)
    assert seqs(released, "ep_o") == [2]
    rows = await store.fetch_all("SELECT status FROM relaybox_outbox WHERE id = " + str(a1.id))
    assert rows[0]["status"] == "dead"


async def test_a_retried_dead_head_goes_first(store: Store) -> None:
    await store.outbox.endpoint_create(endpoint("ep_o", ordered=True), "s", quota=5, now=T0)
    first_msg = await publish(store, ["ep_o"], "a")
    await publish(store, ["ep_o"], "a")
    (a1,) = await lease(store, T0 + 1)
    await record(store, a1, "dead", T0 + 2)
    assert await lease(store, T0 + 3) == []
    # An operator's redeliver puts the head back: it goes before a2, alone.
    assert await store.outbox.delivery_redeliver(
        first_msg, tenant=None, endpoint_id=None, now=T0 + 4
    )
    again = await lease(store, T0 + 5)
    assert [d.id for d in again] == [a1.id]


async def test_an_endpoint_switched_to_unordered_lets_every_key_go(store: Store) -> None:
    await store.outbox.endpoint_create(endpoint("ep_o", ordered=True), "s", quota=5, now=T0)
    for _ in range(3):
        await publish(store, ["ep_o"], "a")
    (a1,) = await lease(store, T0 + 1)
    await record(store, a1, "dead", T0 + 2)
    assert await store.outbox.ordering_blocked_count() == 1
    await store.outbox.endpoint_update(endpoint("ep_o", ordered=False), now=T0 + 3)
    assert await store.outbox.ordering_blocked_count() == 0
    assert seqs(await lease(store, T0 + 4), "ep_o") == [2, 3]
