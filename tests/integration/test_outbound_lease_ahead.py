"""Leasing ahead (PostgreSQL): a dispatcher alone in an endpoint's lane may have up to
``lease_ahead`` times its cap leased, so that the next row starts as soon as an attempt
ends, yet it never runs more than the cap at once; another dispatcher's leases in the
lane bring both back to the cap; rows leased ahead and never started go back at once,
as if never leased."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from relaybox import FrozenClock, Relaybox
from relaybox.config import Settings
from relaybox.outbound.channels.base import Delivery
from relaybox.outbound.leases import lease_recording, release
from tests.support.outbound_app import endpoint, local, outbox_rows, publish_one
from tests.support.receivers import HttpReceiver, Reply


@pytest.fixture
async def pg(pg_url: str, clock: FrozenClock) -> AsyncIterator[Relaybox]:
    b = Relaybox(settings=Settings(database_url=pg_url), clock=clock)
    local(b)
    yield b
    await b.close()


async def leases(b: Relaybox) -> list[dict[str, Any]]:
    return await b.store.fetch_all(
        "SELECT outbox_id, lane, owner, token, until, attempt FROM relaybox_outbox_leases"
        " ORDER BY outbox_id"
    )


async def take(
    b: Relaybox, owner: str, *, channels: tuple[str, ...] = ("webhook",), ahead: bool = True
) -> tuple[list[Delivery], dict[str, int]]:
    """One lease of ``owner`` (the dispatcher's own statement), for every free slot."""
    found, _, allowed = await lease_recording(
        b,
        owner=owner,
        slots=100,
        channels=list(channels),
        lease_ttl=30.0,
        sent=[],
        ahead=["webhook"] if ahead else [],
        factor=4,
    )
    return found, allowed


async def test_alone_in_a_lane_it_leases_ahead_and_runs_at_most_the_cap(pg: Relaybox) -> None:
    async with HttpReceiver(Reply(hang=True)) as receiver:
        lane, _ = await endpoint(pg, receiver.url, max_in_flight=2)
        for _ in range(20):
            await publish_one(pg)
        dispatcher = pg.dispatcher(concurrency=10)
        running = asyncio.create_task(dispatcher.run())
        try:
            await receiver.wait_for(2)
            held = await leases(pg)
            assert len(held) == 4 * 2  # lease_ahead (4) times the cap
            assert {r["lane"] for r in held} == {lane}
            await asyncio.sleep(0.3)
            assert (receiver.peak_in_flight, len(receiver.requests)) == (2, 2)  # the cap
        finally:
            dispatcher.stop()
            receiver.release()
            await asyncio.wait_for(running, 10)
    # The two attempts were recorded; the rows leased ahead went back unstarted: no
    # lease left, no attempt counted, nothing uncertain about them.
    assert await leases(pg) == []
    rows = await outbox_rows(pg)
    assert [r["status"] for r in rows].count("sent") == len(receiver.requests) == 2
    assert {r["attempts"] for r in rows if r["status"] == "pending"} == {0}


async def test_another_dispatchers_leases_bring_the_lane_back_to_its_cap(pg: Relaybox) -> None:
    lane, _ = await endpoint(pg, "http://127.0.0.1:9/hook", max_in_flight=3)
    for _ in range(20):
        await publish_one(pg)
    found, allowed = await take(pg, "a")
    assert (len(found), allowed) == (12, {lane: 3})  # alone: 4 x 3 leased, 3 at once
    assert (await take(pg, "b"))[0] == []  # a holds more than the cap: nothing for b
    # a gives back all but one: b leases up to the cap minus a's lease, not ahead
    # (another dispatcher holds a lease in the lane), and may run as many.
    await release(pg, found[1:])
    found_b, allowed = await take(pg, "b")
    assert (len(found_b), allowed) == (2, {lane: 2})
    # a, leasing again, finds b's two: it takes none, and may run one.
    found, allowed = await take(pg, "a")
    assert (found, allowed) == ([], {})
    await release(pg, found_b)
    found, allowed = await take(pg, "a")
    assert (len(found), allowed) == (11, {lane: 3})  # alone again: ahead again


async def test_a_review_channels_lane_is_never_leased_ahead(pg: Relaybox) -> None:
    """Only channels whose uncertain policy is resend lease ahead: a row leased ahead
    that a crash leaves unstarted comes back uncertain, which a review channel would
    hold for a person although it was never sent."""
    async with pg.store.transaction() as conn:
        for i in range(12):
            await pg.store.inbox.outbox_insert(
                conn,
                channel="review-http",
                key=f"refund:{i}",
                payload=json.dumps({"url": "http://127.0.0.1:9/", "body": {}}),
                tenant="t1",
                inbox_id=None,
                now=pg.clock.now(),
            )
    dispatcher = pg.dispatcher()
    try:
        await dispatcher._ensure_lanes()
    finally:
        await dispatcher.close()
    found, _ = await take(pg, "a", channels=("review-http",))
    assert len(found) == dispatcher.outbound.channels["review-http"].max_in_flight


async def test_a_row_given_back_is_due_again_and_an_uncertain_one_stays_uncertain(
    pg: Relaybox, clock: FrozenClock
) -> None:
    await endpoint(pg, "http://127.0.0.1:9/hook", max_in_flight=1)
    await publish_one(pg)
    await publish_one(pg)
    [first] = (await take(pg, "a", ahead=False))[0]  # a died with it
    clock.advance(31)  # a's lease ran out
    again, _ = await take(pg, "b")
    assert (again[0].id, again[0].uncertain, again[0].attempt) == (first.id, True, 2)
    fresh = again[1]
    assert (fresh.uncertain, fresh.attempt) == (False, 1)
    await release(pg, again)  # b stops before starting either
    by_id = {r["outbox_id"]: r for r in await leases(pg)}
    # Given back, the uncertain row keeps an expired lease (its first attempt's outcome
    # is still unknown); the other goes back as if never leased.
    assert set(by_id) == {first.id} and by_id[first.id]["until"] == 0
    after, _ = await take(pg, "c")
    assert [(d.id, d.uncertain) for d in after] == [(first.id, True), (fresh.id, False)]
    assert after[1].attempt == 1
