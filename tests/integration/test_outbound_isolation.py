"""One endpoint that hangs must not slow the others: per-endpoint in-flight caps, lanes
leased round robin, and a loop that refills free slots without waiting for a batch."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections import Counter

import pytest

from relaybox import Relaybox
from relaybox.outbound.channels.base import Delivery
from relaybox.outbound.leases import lease_recording
from relaybox.store.dispatch_rows import Attempt, Lane, allocate
from tests.support.outbound_app import endpoint, local, publish_one
from tests.support.receivers import HttpReceiver, Reply, Seen
from tests.support.store_rows import attempt

HANG_TIMEOUT = 5.0


async def test_a_hanging_endpoint_does_not_delay_twenty_healthy_ones(box: Relaybox) -> None:
    local(box)
    async with HttpReceiver(Reply(hang=True)) as stuck, HttpReceiver() as healthy:
        hanging, _ = await endpoint(box, stuck.url, timeout=HANG_TIMEOUT, max_in_flight=2)
        # Its backlog is older than everything else: a FIFO dispatcher would fill
        # every slot with it and wait for the timeouts.
        for _ in range(10):
            await publish_one(box, "order.created", endpoint_ids=[hanging])
        for i in range(20):
            await endpoint(box, f"{healthy.url}/{i}")
        for _ in range(3):
            await publish_one(box, "order.created")

        dispatcher = box.dispatcher(concurrency=6)
        started = time.monotonic()
        running = asyncio.create_task(dispatcher.run())
        try:
            await healthy.wait_for(60, within=HANG_TIMEOUT)
            elapsed = time.monotonic() - started
            # Well before the first hanging attempt could even time out.
            assert elapsed < HANG_TIMEOUT / 2, f"healthy deliveries took {elapsed:.2f} s"
            assert 1 <= stuck.peak_in_flight <= 2  # its cap, not the dispatcher's 6 slots
            assert {r.path for r in healthy.requests} == {f"/hook/{i}" for i in range(20)}
        finally:
            stuck.release()
            dispatcher.stop()
            await asyncio.wait_for(running, 10)
    sent = await box.store.fetch_all(
        "SELECT endpoint_id FROM relaybox_outbox WHERE status = 'sent'"
    )
    healthy_sent = [r for r in sent if r["endpoint_id"] != hanging]
    assert len(healthy_sent) == 60  # the stuck ones were released at the end: at most 2


async def test_the_dispatcher_never_has_more_attempts_in_flight_than_its_slots(
    box: Relaybox,
) -> None:
    """Successes that finish during a lease are leased into again as soon as it
    returns, before the rows it leased start: those rows' slots count as taken. Mixed
    delays and rejections (recorded apart, freeing slots at other moments) vary how
    many slots each lease asks for."""
    local(box)
    rng = random.Random(7)

    def reply(_: Seen) -> Reply:
        return Reply(status=rng.choice([200, 200, 200, 400]), delay=rng.choice([0, 0.005, 0.03]))

    async with HttpReceiver(reply) as receiver:
        for i in range(3):
            await endpoint(box, f"{receiver.url}/{i}", max_in_flight=50)
        for _ in range(60):
            await publish_one(box)
        dispatcher = box.dispatcher(concurrency=5)
        running = asyncio.create_task(dispatcher.run())
        try:
            await receiver.wait_for(180, within=30)
        finally:
            dispatcher.stop()
            await asyncio.wait_for(running, 10)
        assert receiver.peak_in_flight <= 5  # 6 or 7 when the leased rows were not counted
    done = await box.store.fetch_all(
        "SELECT id FROM relaybox_outbox WHERE status IN ('sent', 'dead')"
    )
    assert len(done) == 180


def test_slots_are_shared_round_robin_within_caps_and_rate_limits() -> None:
    lanes = [
        Lane("a", max_in_flight=4, rate_limit=None, tokens=1, refilled_at=0, in_flight=3),
        Lane("b", max_in_flight=4, rate_limit=None, tokens=1, refilled_at=0, in_flight=0),
        Lane("c", max_in_flight=10, rate_limit=2.0, tokens=0.0, refilled_at=99.0, in_flight=0),
    ]
    # a has 1 free slot, b 4, c's bucket holds 2 tokens after a second at 2/s.
    assert allocate(lanes, 5, now=100.0) == {"a": 1, "b": 2, "c": 2}
    assert allocate(lanes, 100, now=100.0) == {"a": 1, "b": 4, "c": 2}
    assert allocate(lanes, 2, now=100.0) == {"a": 1, "b": 1}
    room, tokens = lanes[2].room(now=99.2)
    assert room == 0 and tokens == pytest.approx(0.4)  # no whole token yet


async def test_the_rate_limit_spaces_deliveries_across_leases(box: Relaybox) -> None:
    local(box)
    clock = box.clock
    async with HttpReceiver() as receiver:
        await endpoint(box, receiver.url, rate_limit=2.0)
        for _ in range(5):
            await publish_one(box)
        dispatcher = box.dispatcher()
        try:
            # A new lane starts with a full bucket: one second's worth, no more.
            assert await dispatcher.run_once() == 2
            assert await dispatcher.run_once() == 0
            clock.advance(0.5)  # type: ignore[attr-defined]
            assert await dispatcher.run_once() == 1
            clock.advance(10)  # type: ignore[attr-defined]
            assert await dispatcher.run_once() == 2  # ten quiet seconds still allow only 2
        finally:
            await dispatcher.close()
        assert len(receiver.requests) == 5


async def test_two_dispatchers_share_a_lane_without_overshooting_its_cap(box: Relaybox) -> None:
    """Each row is delivered once, and the lane lock keeps the endpoint's in-flight cap
    across dispatchers (not per dispatcher)."""
    local(box)
    async with HttpReceiver(Reply(delay=0.05)) as receiver:
        await endpoint(box, receiver.url, max_in_flight=2)
        messages = [await publish_one(box) for _ in range(12)]
        dispatchers = [box.dispatcher(concurrency=8) for _ in range(2)]
        running = [asyncio.create_task(d.run()) for d in dispatchers]
        try:
            await receiver.wait_for(12, within=10)
        finally:
            for d in dispatchers:
                d.stop()
            await asyncio.wait_for(asyncio.gather(*running), 10)
        assert sorted(r.webhook_id for r in receiver.requests) == sorted(m.id for m in messages)
        assert receiver.peak_in_flight <= 2


async def test_one_lease_shares_slots_like_allocate(box: Relaybox) -> None:
    """The lease itself (one statement on PostgreSQL, steps on SQLite) shares free slots
    as ``allocate`` does: round robin within in-flight caps and token buckets, and it
    sends served lanes to the back."""
    local(box)
    clock = box.clock
    a, secret = await endpoint(box, "http://127.0.0.1:9/a", max_in_flight=1)
    b, _ = await endpoint(box, "http://127.0.0.1:9/b", max_in_flight=4)
    c, _ = await endpoint(box, "http://127.0.0.1:9/c", max_in_flight=10, rate_limit=2.0)
    messages = [await publish_one(box) for _ in range(5)]
    dispatcher = box.dispatcher()

    def lanes(deliveries: list[Delivery]) -> dict[str, int]:
        return dict(Counter(d.endpoint.id for d in deliveries if d.endpoint is not None))

    first = await dispatcher._lease(5)
    assert lanes(first) == {a: 1, b: 2, c: 2}  # c's new bucket holds 2 tokens
    assert [d.id for d in first] == sorted(d.id for d in first)
    one = next(d for d in first if d.endpoint is not None and d.endpoint.id == a)
    assert one.message is not None and one.message.id == messages[0].id  # oldest first
    assert one.endpoint is not None and one.endpoint.secrets == (secret,)
    assert one.endpoint.url == "http://127.0.0.1:9/a" and one.endpoint.tenant == "t1"
    assert (one.attempt, one.lease_token, one.uncertain) == (1, 1, False)
    # a is at its cap, c's bucket is empty: only b has room (2 more of its 4).
    assert lanes(await dispatcher._lease(100)) == {b: 2}
    clock.advance(0.5)  # type: ignore[attr-defined]
    assert lanes(await dispatcher._lease(100)) == {c: 1}  # half a second at 2/s
    await dispatcher.close()


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_a_lease_that_records_successes_reuses_exactly_their_slots(box: Relaybox) -> None:
    """PostgreSQL records plain successes in the lease statement itself (SQLite records
    them apart): its snapshot still counts them in flight, so it frees the slots of
    those it wrote whose lease was live, no more (a fenced record frees nothing, an
    expired lease was not counted)."""
    local(box)
    clock = box.clock
    await endpoint(box, "http://127.0.0.1:9/a", max_in_flight=2)
    for _ in range(6):
        await publish_one(box)
    dispatcher = box.dispatcher()

    def sent(d: Delivery, token: int | None = None) -> Attempt:
        if token is not None:
            d = dataclasses.replace(d, lease_token=token)
        return attempt(d, response="ok", started=clock.now(), duration=0.01, dispatcher="other")

    async def lease_and_record(*rows: Attempt) -> tuple[list[Delivery], set[object]]:
        found, written, _ = await lease_recording(
            box, owner="other", slots=10, channels=["webhook"], lease_ttl=30.0, sent=rows
        )
        return found, set(written)

    first = await dispatcher._lease(10)
    assert len(first) == 2  # the cap
    found, written = await lease_and_record(sent(first[0]))
    assert written == {(first[0].id, first[0].lease_token)}
    assert len(found) == 1  # first[1] is still in flight
    assert await lease_and_record(sent(first[1], token=99)) == ([], set())  # fenced
    clock.advance(31)  # type: ignore[attr-defined]  # every lease expired
    found, written = await lease_and_record(sent(first[1]))
    assert written == {(first[1].id, first[1].lease_token)}
    assert len(found) == 2  # the cap, not 3: first[1]'s expired lease was not counted
    outcomes = await box.store.fetch_all(
        "SELECT outcome, count(*) AS n FROM relaybox_outbox_attempts GROUP BY outcome"
    )
    assert {r["outcome"]: r["n"] for r in outcomes} == {"sent": 2, "fenced": 1}
    status = await box.store.fetch_all(
        "SELECT id FROM relaybox_outbox WHERE status = 'sent' ORDER BY id"
    )
    assert [r["id"] for r in status] == sorted([first[0].id, first[1].id])
    await dispatcher.close()
