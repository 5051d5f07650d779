"""Synchronous handlers under faults, with real ``relaybox worker`` processes
(``tests.support.syncapp:box``: the credits grant as a plain ``def``), on SQLite and
PostgreSQL: a worker killed before its COMMIT leaves nothing and the next one grants
once; killed after it, nothing runs twice; a handler that kills every worker running
it is charged an attempt each time and ends dead ``exhausted`` while the others end
done. The support code is the async fault tests' (tests/test_faults.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_faults import KILLED, POISON_EVENTS, Db, db, no_pending, procs, supervise
from tests.support.faultapp import POISON_INVOICE, invoice_paid
from tests.support.procs import Procs, wait_until

pytestmark = pytest.mark.slow

__all__ = ["db", "procs"]  # the fixtures, imported for this module's tests

APP = "tests.support.syncapp:box"


async def test_killed_before_commit_rolls_back_and_the_next_worker_grants_once(
    db: Db, procs: Procs, tmp_path: Path
) -> None:
    await db.deliver(invoice_paid("evt_1", "in_1"))
    env = {"FAULT": "kill_before_commit", "FAULT_MARKER": str(tmp_path / "fired")}
    first = procs.worker(db.url, app=APP, env=env)
    assert await first.wait_exit(30) == KILLED, first.tail()
    assert await db.state() == {
        "inbox": {"pending": 1},
        "grants": 0,
        "credits": 0,
        "operations": 0,
        "outbox": 0,
    }
    assert (await db.inbox("evt_1"))["attempts"] == 1  # counted before the handler ran

    second = procs.worker(db.url, app=APP, env=env)  # the marker exists: no fault now
    await wait_until(lambda: db.settled(1), within=30, what="the retry", procs=procs)
    assert await db.state() == {
        "inbox": {"done": 1},
        "grants": 1,
        "credits": 100,
        "operations": 1,
        "outbox": 1,
    }
    assert (await db.inbox("evt_1"))["attempts"] == 2, procs.tails()
    assert second.terminate() == 0


async def test_killed_after_commit_never_grants_twice(db: Db, procs: Procs, tmp_path: Path) -> None:
    await db.deliver(invoice_paid("evt_1", "in_1"))
    env = {"FAULT": "kill_after_commit", "FAULT_MARKER": str(tmp_path / "fired")}
    first = procs.worker(db.url, app=APP, env=env)
    assert await first.wait_exit(30) == KILLED, first.tail()
    committed = {"inbox": {"done": 1}, "grants": 1, "credits": 100, "operations": 1, "outbox": 1}
    assert await db.state() == committed

    assert await db.deliver(invoice_paid("evt_1", "in_1")) == "duplicate"
    assert await db.deliver(invoice_paid("evt_2", "in_1")) == "accepted"
    second = procs.worker(db.url, app=APP, env=env)
    await wait_until(lambda: db.settled(2), within=30, what="evt_2 processed", procs=procs)
    assert await db.state() == {**committed, "inbox": {"done": 2}}
    assert (await db.inbox("evt_1"))["attempts"] == 1  # never run again
    assert second.terminate() == 0


async def test_a_poison_event_is_dead_exhausted_and_the_others_are_done(
    db: Db, procs: Procs
) -> None:
    for event_id in POISON_EVENTS:
        invoice = POISON_INVOICE if event_id == "evt_poison" else event_id.replace("evt", "in")
        assert await db.deliver(invoice_paid(event_id, invoice)) == "accepted"
    crashes = await supervise(
        procs, db, lambda: no_pending(db), {"FAULT": "poison"}, app=APP, within=60
    )
    assert crashes == 3  # the default max_attempts
    poison = await db.inbox("evt_poison")
    assert (poison["status"], poison["dead_reason"], poison["attempts"]) == ("dead", "exhausted", 3)
    statuses = {e: (await db.inbox(e))["status"] for e in POISON_EVENTS}
    assert statuses == {**dict.fromkeys(POISON_EVENTS, "done"), "evt_poison": "dead"}, statuses
    state = await db.state()
    assert (state["inbox"], state["grants"], state["credits"]) == ({"done": 3, "dead": 1}, 3, 300)
