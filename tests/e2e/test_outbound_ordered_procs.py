"""Ordered delivery with two ``relaybox dispatch`` processes on one PostgreSQL database,
one of them SIGKILLed mid-run: the per-key hold lives in the lease statement, so it
holds across processes and across a crash. 3 keys x 50 messages go to an ordered
endpoint (a real HTTP receiver on a free port) that fails 30 % of the requests at
random; the receiver checks every request's ``webhook-sequence`` against the last one
it accepted for the key."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from relaybox import Relaybox
from relaybox.config import Settings
from tests.conftest import KEYED
from tests.support.outbound_app import endpoint, local, outbox_rows, publish_one
from tests.support.procs import Procs, wait_until
from tests.support.receivers import HttpReceiver, OrderCheckingReceiver, Seen

pytestmark = pytest.mark.slow

KEYS = ("order_1", "order_2", "order_3")
PER_KEY = 50


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    yield p
    p.cleanup()


@pytest.fixture
async def live(pg_url: str) -> AsyncIterator[Relaybox]:
    b = Relaybox(settings=Settings(database_url=pg_url, outbound=KEYED))
    local(b)
    yield b
    await b.close()


async def test_two_dispatcher_processes_one_killed_keep_each_key_in_order(
    live: Relaybox, pg_url: str, procs: Procs
) -> None:
    checker = OrderCheckingReceiver(KEYS)
    victim: list[int] = []

    def kill_mid_run(seen: Seen) -> None:
        if victim and checker.total() >= 40:
            os.kill(victim.pop(), signal.SIGKILL)

    async with HttpReceiver(checker.reply, on_request=kill_mid_run) as receiver:
        await endpoint(live, receiver.url, ordered=True, schedule=[0.05] * 25, max_in_flight=4)
        for i in range(PER_KEY):
            for key in KEYS:
                await publish_one(live, "order.updated", {"i": i}, ordering_key=key)
        args = ["dispatch", "--app", "tests.support.outbound_app:box", "--database-url", pg_url]
        first = procs.start("dispatch-a", args)
        second = procs.start("dispatch-b", args)
        victim.append(first.pid)

        async def all_accepted() -> None:
            while checker.total() < len(KEYS) * PER_KEY:
                assert second.alive(), second.tail()
                await asyncio.sleep(0.1)

        try:
            await asyncio.wait_for(all_accepted(), 240)
        except TimeoutError:
            raise AssertionError(
                f"accepted {checker.accepted}\n{first.tail()}\n{second.tail()}"
            ) from None
        assert await first.wait_exit(within=10) == -signal.SIGKILL
        assert len(receiver.requests) > len(KEYS) * PER_KEY  # failures were retried

    assert checker.out_of_order == []
    for key in KEYS:
        assert checker.accepted[key] == list(range(1, PER_KEY + 1))

    async def all_recorded() -> bool:
        return {r["status"] for r in await outbox_rows(live)} == {"sent"}

    await wait_until(all_recorded, within=60, what="every delivery recorded sent")
    second.terminate()
    owners = await live.store.fetch_all(
        "SELECT DISTINCT dispatcher FROM relaybox_outbox_attempts WHERE dispatcher IS NOT NULL"
    )
    assert len(owners) == 2  # both processes delivered
