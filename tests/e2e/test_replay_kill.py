"""A ``relaybox dispatch`` process SIGKILLed in the middle of a replay-missing job: what
it committed is consistent (each step's deliveries and the job's progress went
together), and once its lease runs out a second runner (in the test, with the clock
past the lease) goes on from its last step: every message gets one delivery, none
two, and the job's counts say so."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from relaybox import FrozenClock, Relaybox
from relaybox.outbound.replays import ReplayRunner, start_replay
from tests.support.outbound_app import LOCAL, endpoint, local, outbox_rows
from tests.support.procs import Procs

pytestmark = pytest.mark.slow

MESSAGES = 300


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    yield p
    p.cleanup()


async def test_sigkill_in_a_replay_job_loses_nothing_and_doubles_nothing(
    box: Relaybox, clock: FrozenClock, database_url: str, procs: Procs
) -> None:
    local(box)
    clock.set(time.time() - 60)
    async with box.store.transaction() as conn:
        for n in range(MESSAGES):
            clock.advance(0.001)
            await box.publish(conn, "pet.adopted", {"n": n}, tenant="t1", endpoint_ids=[])
    endpoint_id, _ = await endpoint(box, "http://127.0.0.1:9/hook")
    await box.store.flow.endpoint_pause(endpoint_id, "t1", paused=True, now=clock.now())  # no sends
    job = await start_replay(box, endpoint_id, since=0.0, tenant="t1")
    assert job is not None

    proc = procs.start(
        "dispatch",
        ["dispatch", "--app", "tests.support.outbound_app:box", "--database-url", database_url],
        env={"RELAYBOX_TEST_REPLAY_BATCH": "1"},
    )
    # Until the process has committed some steps, not all (a loaded machine may take
    # long to start it).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        current = await box.store.flow.replay_job_get(job.id, None)
        assert current is not None
        if current.queued >= 20:
            break
        await asyncio.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    assert await proc.wait_exit(within=30) == -signal.SIGKILL, proc.tail()

    killed = await box.store.flow.replay_job_get(job.id, None)
    assert killed is not None and killed.status == "running", proc.tail()
    assert 20 <= killed.queued < MESSAGES
    rows = [r for r in await outbox_rows(box) if r["endpoint_id"] == endpoint_id]
    assert len(rows) == killed.queued == killed.scanned  # committed together
    assert killed.cursor is not None and killed.cursor[1] == rows[-1]["message_id"]

    runner = ReplayRunner(box, "takeover")
    assert await runner.run_once() is None  # the dead process's lease is still live
    clock.set(time.time() + LOCAL["lease_ttl"] + 1)  # ... until it runs out
    done = await runner.run_once()
    assert done is not None and (done.status, done.queued, done.scanned) == (
        "done",
        MESSAGES,
        MESSAGES,
    )
    rows = [r for r in await outbox_rows(box) if r["endpoint_id"] == endpoint_id]
    assert len(rows) == len({r["message_id"] for r in rows}) == MESSAGES
