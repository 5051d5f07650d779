"""Ordered delivery per key (docs/howto/ordered-delivery.md) end to end, with real
HTTP receivers on free ports: publish with an ordering key, endpoints with ``ordered``,
the ``webhook-sequence`` header, keys that never wait for each other, a dead head held
or skipped. The test with two ``relaybox dispatch`` processes, one SIGKILLed mid-run,
is in tests/e2e/test_outbound_ordered_procs.py."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest

from relaybox import Relaybox
from relaybox.config import Settings
from relaybox.outbound import EndpointPatch, update_endpoint
from relaybox.outbound.catalog import InvalidMessage
from tests.conftest import KEYED
from tests.support.outbound_app import endpoint, local, publish_one
from tests.support.procs import wait_until
from tests.support.receivers import HttpReceiver, Reply, Seen


@pytest.fixture
async def live(database_url: str) -> AsyncIterator[Relaybox]:
    """A box on the real clock: its dispatcher runs retries as they fall due."""
    b = Relaybox(settings=Settings(database_url=database_url, outbound=KEYED))
    local(b)
    yield b
    await b.close()


def key_of(seen: Seen) -> tuple[str, int]:
    envelope = json.loads(seen.body)
    return envelope["orderingKey"], envelope["sequence"]


async def test_publish_numbers_each_key_and_the_header_carries_it(live: Relaybox) -> None:
    async with HttpReceiver(Reply(200)) as receiver:
        await endpoint(live, receiver.url, ordered=True)
        published = [
            await publish_one(live, ordering_key=k, data={"n": i}, idempotency_key=f"k{i}")
            for i, k in enumerate(["a", "b", "a"])
        ]
        plain = await publish_one(live)
        assert [(m.ordering_key, m.sequence) for m in published] == [
            ("a", 1),
            ("b", 1),
            ("a", 2),
        ]
        assert (plain.ordering_key, plain.sequence) == (None, None)
        assert published[2].envelope["orderingKey"] == "a"
        assert published[2].envelope["sequence"] == 2
        dispatcher = live.dispatcher()
        running = asyncio.create_task(dispatcher.run())
        try:
            seen = await receiver.wait_for(4, within=30)
        finally:
            dispatcher.stop()
            await asyncio.wait_for(running, 10)
    by_id = {s.webhook_id: s for s in seen}
    for m in published:
        assert by_id[m.id].headers["webhook-sequence"] == str(m.sequence)
    assert "webhook-sequence" not in by_id[plain.id].headers
    for bad in ["", "x" * 257, "a\x00b"]:
        with pytest.raises(InvalidMessage):
            await publish_one(live, ordering_key=bad)
        # Refused before the key's stored message is looked up, not answered with it.
        with pytest.raises(InvalidMessage) as refused:
            await publish_one(live, ordering_key=bad, idempotency_key=published[0].idempotency_key)
        assert refused.value.code == "ordering_key"


async def test_a_failing_key_does_not_delay_the_others(live: Relaybox) -> None:
    """Key ``slow``'s head fails until the other keys are all delivered: they flow past
    it, and ``slow``'s later messages wait for their head, then arrive in order."""
    per_key = 15
    released = asyncio.Event()

    def reply(seen: Seen) -> Reply:
        key, seq = key_of(seen)
        if key == "slow" and seq == 1 and not released.is_set():
            return Reply(500)
        return Reply(200)

    async with HttpReceiver(reply) as receiver:
        await endpoint(live, receiver.url, ordered=True, schedule=[0.05] * 30, max_in_flight=4)
        for i in range(per_key):
            for key in ("slow", "fast1", "fast2"):
                await publish_one(live, ordering_key=key, data={"i": i})
        dispatcher = live.dispatcher()
        running = asyncio.create_task(dispatcher.run())
        started = time.monotonic()
        try:

            async def fast_done() -> bool:
                fast = [s for s in receiver.requests if key_of(s)[0] != "slow"]
                return len(fast) >= 2 * per_key

            await wait_until(fast_done, within=60, what="the fast keys delivered", interval=0.02)
            fast_time = time.monotonic() - started
            # Meanwhile only slow's head was tried (and failed), nothing behind it.
            slow = [key_of(s)[1] for s in receiver.requests if key_of(s)[0] == "slow"]
            assert slow and set(slow) == {1}, slow
            released.set()

            async def all_done() -> bool:
                return len({key_of(s) for s in receiver.requests}) >= 3 * per_key

            await wait_until(all_done, within=60, what="every key delivered", interval=0.02)
        finally:
            dispatcher.stop()
            await asyncio.wait_for(running, 10)
    # Generous: the fast keys took seconds at most on a loaded machine, not the slow
    # key's 30 retries.
    assert fast_time < 30
    for key in ("slow", "fast1", "fast2"):
        got = [key_of(s)[1] for s in receiver.requests if key_of(s)[0] == key]
        if key == "slow":
            got = [n for n in got if n > 1]
            assert got == list(range(2, per_key + 1))
        else:
            assert got == list(range(1, per_key + 1))


@pytest.mark.parametrize("on_dead", ["hold", "skip"])
async def test_a_dead_head_holds_its_key_or_is_skipped(live: Relaybox, on_dead: str) -> None:
    def reply(seen: Seen) -> Reply:
        return Reply(500) if key_of(seen) == ("k", 1) else Reply(200)

    async with HttpReceiver(reply) as receiver:
        eid, _ = await endpoint(live, receiver.url, ordered=True, on_dead=on_dead, schedule=[0.05])
        for key in ["k", "k", "k", "other"]:
            await publish_one(live, ordering_key=key)
        dispatcher = live.dispatcher()
        running = asyncio.create_task(dispatcher.run())
        try:
            if on_dead == "skip":
                await receiver.wait_for(2 + 3, within=30)  # k1 twice, k2, k3, other
            else:
                await receiver.wait_for(2 + 1, within=30)  # k1 twice, other
                await asyncio.sleep(0.5)  # k2 and k3 stay held
                assert len(receiver.requests) == 3
                blocked = await live.store.outbox.ordering_blocked_keys(
                    endpoint_id=eid, tenant=None, limit=10
                )
                assert [(b.ordering_key, b.sequence, b.waiting) for b in blocked] == [("k", 1, 2)]
                # A switch to skip frees the key: no operator step needed after it.
                await update_endpoint(live, eid, "t1", EndpointPatch(on_dead="skip"))
                await receiver.wait_for(2 + 3, within=30)
        finally:
            dispatcher.stop()
            await asyncio.wait_for(running, 10)
    got = [key_of(s) for s in receiver.requests]
    assert got.count(("k", 1)) == 2
    assert [s for k, s in got if k == "k" and s > 1] == [2, 3]
