"""A dispatcher SIGKILLed after the receiver got the request and before the outcome
was recorded: the lease expires, the outcome is uncertain, and each channel's policy
decides. A real ``relaybox dispatch`` process is killed; a second dispatcher (in the
test, with the clock past the lease) takes over."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from relaybox import FrozenClock, Relaybox
from tests.support.outbound_app import LOCAL, endpoint, local, outbox_rows, publish_one
from tests.support.procs import Procs
from tests.support.receivers import HttpReceiver, Reply, Seen

pytestmark = pytest.mark.slow


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    yield p
    p.cleanup()


async def test_sigkill_before_recording_resends_the_webhook_and_holds_the_review_row(
    box: Relaybox, clock: FrozenClock, database_url: str, procs: Procs
) -> None:
    local(box)
    clock.set(time.time() - 1)  # rows due now for the real process's real clock
    arrived: list[Seen] = []
    dispatcher_pid: list[int] = []

    def kill_when_both_arrived(seen: Seen) -> None:
        arrived.append(seen)
        if len(arrived) == 2:  # both requests are in; neither has been answered
            os.kill(dispatcher_pid[0], signal.SIGKILL)

    webhook_script = [Reply(hang=True), Reply(200)]
    async with (
        HttpReceiver(webhook_script, on_request=kill_when_both_arrived) as hooks,
        HttpReceiver(Reply(hang=True), on_request=kill_when_both_arrived) as refunds,
    ):
        await endpoint(box, hooks.url)
        message = await publish_one(box, "payment.succeeded", {"paymentId": "pay_1"})
        async with box.store.transaction() as conn:
            await box.store.inbox.outbox_insert(
                conn,
                channel="review-http",
                key="refund:pay_1",
                payload=json.dumps({"url": refunds.url, "body": {"refund": "pay_1"}}),
                tenant="t1",
                inbox_id=None,
                now=clock.now(),
            )

        proc = procs.start(
            "dispatch",
            ["dispatch", "--app", "tests.support.outbound_app:box", "--database-url", database_url],
        )
        dispatcher_pid.append(proc.pid)
        assert await proc.wait_exit(within=30) == -signal.SIGKILL, proc.tail()
        assert len(arrived) == 2
        rows = await outbox_rows(box)
        assert [(r["status"], r["attempts"]) for r in rows] == [("pending", 1), ("pending", 1)]

        clock.set(time.time() + LOCAL["lease_ttl"] + 1)  # the dead dispatcher's lease ran out
        takeover = box.dispatcher()
        try:
            assert await takeover.run_once() == 2
        finally:
            await takeover.close()

        first, second = hooks.requests
        assert first.webhook_id == second.webhook_id == message.id  # a duplicate, not a new id
        assert first.body == second.body
        assert len(refunds.requests) == 1  # held for review, not sent again
        assert refunds.requests[0].headers["idempotency-key"] == "refund:pay_1"

    webhook, refund = await outbox_rows(box)
    assert (webhook["status"], webhook["attempts"]) == ("sent", 2)
    assert (refund["status"], refund["dead_reason"]) == ("held", "uncertain")
    log = await box.store.fetch_all(
        "SELECT outbox_id, attempt, outcome FROM relaybox_outbox_attempts ORDER BY id"
    )
    outcomes = {(a["outbox_id"], a["attempt"], a["outcome"]) for a in log}
    assert outcomes == {
        (webhook["id"], 1, "uncertain"),
        (webhook["id"], 2, "sent"),
        (refund["id"], 1, "uncertain"),
    }


async def test_a_row_whose_last_attempt_died_is_dead_not_resent(
    box: Relaybox, clock: FrozenClock
) -> None:
    """The attempt budget counts attempts that killed their dispatcher too."""
    local(box)
    async with HttpReceiver(Reply(500)) as receiver:
        await endpoint(box, receiver.url, schedule=[1.0])  # two attempts in all
        await publish_one(box)
        first = box.dispatcher()
        await first.run_once()  # attempt 1: 500
        clock.advance(1)
        await first._lease(1)  # attempt 2 leased... and its dispatcher "dies"
        await first.close()
        clock.advance(LOCAL["lease_ttl"] + 1)
        second = box.dispatcher()
        try:
            assert await second.run_once() == 1
        finally:
            await second.close()
        assert len(receiver.requests) == 1
    [row] = await outbox_rows(box)
    assert (row["status"], row["dead_reason"], row["attempts"]) == ("dead", "exhausted", 3)
    assert "did not finish" in row["last_error"]
