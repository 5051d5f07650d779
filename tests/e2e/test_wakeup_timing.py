"""Work goes when it comes due, not at the next poll.

- A retry scheduled 200 ms out is attempted ~200 ms later: the dispatcher sets a
  timer for the earliest due time it knows of (its own retries, the store's next due
  row), whatever its poll interval.
- A publish committed by another process is delivered at once: PostgreSQL's NOTIFY,
  and on SQLite the commit watch (``PRAGMA data_version``) of the listening process.
- The same for the worker: an event accepted by ``relaybox serve --roles receiver``
  is processed at once by a ``relaybox worker`` in another process.

The dispatchers and workers here poll every 30 s, so only a wake-up can meet the
bounds. The bounds are generous (a loaded machine shares its 2 cores with other test
runs); the goals (200 ± 50 ms, 100 ms) are measured by ``python -m bench latency``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from examples.credits import app as credits

from relaybox import Relaybox, SystemClock
from relaybox.config import Settings
from tests.conftest import KEYED
from tests.support.faultapp import invoice_paid, signed
from tests.support.outbound_app import endpoint, local, outbox_rows, publish_one
from tests.support.procs import ROOT, Procs, wait_until
from tests.support.receivers import HttpReceiver, Reply, Seen

pytestmark = pytest.mark.slow

POLL = 30.0
"""The poll interval of every loop here: far beyond any bound the tests assert."""


@pytest.fixture
async def sender(database_url: str) -> AsyncIterator[Relaybox]:
    """A box on the real clock, its dispatcher polling every 30 s."""
    b = Relaybox(settings=Settings(database_url=database_url, outbound=KEYED))
    local(b, poll_interval=POLL, jitter=0.0)
    yield b
    await b.close()


@contextlib.asynccontextmanager
async def dispatching(box: Relaybox) -> AsyncIterator[None]:
    """``box``'s dispatcher running (``run()``) in this event loop."""
    dispatcher = box.dispatcher()
    task = asyncio.create_task(dispatcher.run())
    try:
        yield
    finally:
        dispatcher.stop()
        await asyncio.wait_for(task, 30)


async def test_a_retry_goes_when_it_comes_due_not_at_the_next_poll(sender: Relaybox) -> None:
    async with HttpReceiver([Reply(500), Reply(200)]) as receiver:
        await endpoint(sender, receiver.url, schedule=[0.2])
        await publish_one(sender)
        async with dispatching(sender):
            first, second = await receiver.wait_for(2, within=20)
    gap = second.at - first.at
    # Goal 200 ± 50 ms; asserted with room for a loaded machine. Waiting for the
    # poll, the retry would go ~30 s after the failure.
    assert 0.19 <= gap <= 1.5, gap
    [row] = await outbox_rows(sender)
    assert (row["status"], row["attempts"]) == ("sent", 2)


async def test_the_store_next_due_row_wakes_a_dispatcher_that_did_not_schedule_it(
    sender: Relaybox,
) -> None:
    """A retry another dispatcher scheduled (here: a row made due 0.5 s from now before
    this dispatcher started) goes when it comes due."""
    async with HttpReceiver() as receiver:
        await endpoint(sender, receiver.url)
        await publish_one(sender)
        due = time.time() + 0.5
        async with sender.store.transaction() as conn:
            await conn.exec_driver_sql(f"UPDATE relaybox_outbox SET next_attempt_at = {due!r}")
        arrived: list[float] = []
        receiver.on_request = lambda _seen: arrived.append(time.time())
        async with dispatching(sender):
            await receiver.wait_for(1, within=20)
    late = arrived[0] - due
    assert -0.01 <= late <= 1.0, late


async def test_a_wake_up_during_a_lease_that_asked_every_slot_is_not_lost(
    sender: Relaybox,
) -> None:
    """A publish whose wake-up (NOTIFY, or SQLite's commit watch) comes while a lease
    that asked for every free slot is in flight, its statement begun before that
    publish committed (here: the lease answers "nothing" only once the wake-up has
    come): the loop cannot start another lease then (no slot is free of that lease's
    count), so the lease in flight looks again when it ends. Before, the row waited
    for the next poll (30 s here)."""
    async with HttpReceiver() as receiver:
        await endpoint(sender, receiver.url)
        dispatcher = sender.dispatcher()
        real = dispatcher._lease_safely
        in_flight, woken = asyncio.Event(), asyncio.Event()
        first = True

        async def lease(*args: Any) -> Any:
            nonlocal first
            if not first:
                return await real(*args)
            first = False
            in_flight.set()
            await woken.wait()
            return [], {}  # what a statement that began before the publish finds

        dispatcher._lease_safely = lease  # type: ignore[method-assign]
        wake, rung = dispatcher._wake.set, asyncio.Event()

        def ring() -> None:
            rung.set()
            wake()

        task = asyncio.create_task(dispatcher.run())
        try:
            await asyncio.wait_for(in_flight.wait(), 10)
            dispatcher._wake.set = ring  # type: ignore[method-assign]
            await publish_one(sender)
            await asyncio.wait_for(rung.wait(), 10)  # the wake-up came
            await asyncio.sleep(0.05)  # the loop saw it, with the lease still in flight
            committed = time.time()
            woken.set()
            [seen] = await receiver.wait_for(1, within=10)
        finally:
            dispatcher.stop()
            await asyncio.wait_for(task, 30)
    assert seen.at - committed <= 2.0


_PUBLISHER = """
import asyncio, sys, time
from tests.support.outbound_app import box, publish_one

async def main() -> None:
    for n in range(int(sys.argv[1])):
        await publish_one(box, data={"n": n})
        print(f"committed {n} {time.time()!r}", flush=True)
        await asyncio.sleep(0.3)
    await box.close()

asyncio.run(main())
"""


async def test_a_publish_from_another_process_is_delivered_at_once(
    sender: Relaybox, database_url: str
) -> None:
    arrived: dict[int, float] = {}

    def seen(request: Seen) -> None:
        arrived[json.loads(request.body)["data"]["n"]] = time.time()

    async with HttpReceiver(on_request=seen) as receiver:
        await endpoint(sender, receiver.url)
        async with dispatching(sender):
            await asyncio.sleep(0.3)  # the dispatcher is idle, waiting
            publisher = await asyncio.create_subprocess_exec(
                sys.executable, "-c", _PUBLISHER, "3",
                cwd=ROOT, env={**os.environ, "RELAYBOX_DATABASE_URL": database_url},
                stdout=subprocess.PIPE,
            )  # fmt: skip
            out, _ = await asyncio.wait_for(publisher.communicate(), 60)
            assert publisher.returncode == 0, out
            await receiver.wait_for(3, within=20)
    committed = {
        int(n): float(at)
        for _, n, at in (line.split() for line in out.decode().splitlines() if line)
    }
    delays = [arrived[n] - committed[n] for n in sorted(committed)]
    # Goal 100 ms; waiting for the poll, each would wait up to 30 s.
    assert all(d <= 1.0 for d in delays), delays


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    yield p
    p.cleanup()


async def test_the_worker_takes_an_event_accepted_by_another_process_at_once(
    database_url: str, procs: Procs
) -> None:
    box = credits.configure(
        Relaybox(settings=Settings(database_url=database_url), clock=SystemClock()), {}
    )
    await credits.setup(box)
    try:
        slow_poll = {"RELAYBOX_WORKER__POLL_INTERVAL": str(POLL)}
        receiver = await procs.serve(database_url, roles="receiver")
        procs.worker(database_url, env=slow_poll)

        async def done(n: int) -> list[float] | None:
            rows = await box.store.fetch_all(
                "SELECT done_at - received_at AS waited FROM relaybox_inbox"
                " WHERE status = 'done' ORDER BY id"
            )
            return [r["waited"] for r in rows] if len(rows) == n else None

        async with aiohttp.ClientSession() as http:
            for n in range(4):
                body, headers = signed(box, invoice_paid(f"evt_{n}", f"in_{n}"))
                async with http.post(
                    receiver.url + "/webhooks/stripe", data=body, headers=headers
                ) as r:
                    assert r.status == 200, await r.text()
                if n == 0:  # the worker is up (however long it took to start) and idle
                    await wait_until(
                        lambda: done(1), within=60, what="the first event done", procs=procs
                    )
                await asyncio.sleep(0.3)
        waited = await wait_until(lambda: done(4), within=20, what="4 events done", procs=procs)
        waited = waited[1:]
    finally:
        await box.close()
    # Received (committed) to done: the handler's transaction included; goal 5 ms for
    # a worker that polls nothing. Waiting for the poll, each would wait up to 30 s.
    assert all(w <= 1.5 for w in waited), waited
