"""The accept hands its new rows to the worker of its own process (PostgreSQL): they
go in started and held for it, and run without a claim (``worker.handoff``)."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from relaybox import Context, Relaybox
from relaybox.config import Settings, WorkerSettings
from relaybox.inbound.worker import Worker
from relaybox.store import Claim, NewDelivery
from tests.support.procs import wait_until


def delivery(box: Relaybox, event_id: str, *, ignored: bool = False) -> NewDelivery:
    raw = json.dumps({"id": event_id}).encode()
    return NewDelivery(
        source="s",
        account="a",
        event_id=event_id,
        event_type="thing.done",
        tenant="t",
        fingerprint=hashlib.sha256(raw).digest(),
        payload=raw,
        headers='{"x-test": "1"}',
        version=None,
        received_at=box.clock.now(),
        ignored=ignored,
    )


def make_box(url: str, **worker: Any) -> Relaybox:
    settings = Settings(database_url=url, worker=WorkerSettings(poll_interval=0.05, **worker))
    return Relaybox(settings=settings)


@pytest.fixture
async def box(pg_url: str) -> AsyncIterator[Relaybox]:
    b = make_box(pg_url)
    await b.store.migrate()
    yield b
    await b.close()


async def inbox(box: Relaybox) -> dict[str, dict[str, Any]]:
    found = await box.store.fetch_all(
        "SELECT event_id, status, attempts, started_at, received_at, next_attempt_at"
        " FROM relaybox_inbox"
    )
    return {r["event_id"]: r for r in found}


def claims_seen(box: Relaybox) -> list[int]:
    """Record the ids every claim of ``box``'s store returns."""
    seen: list[int] = []
    claim = box.store.inbox.claim

    async def recording(**kwargs: Any) -> Claim:
        found = await claim(**kwargs)
        seen.extend([*found.ids, *found.suspects])
        return found

    box.store.inbox.claim = recording  # type: ignore[method-assign]
    return seen


async def test_new_rows_run_in_their_receivers_process_without_a_claim(box: Relaybox) -> None:
    """A receiver and a worker in one process: every accepted row runs once, its
    attempt counted by the accept itself (started at the batch's time, the hold
    written), and no claim ever returns it. An ignored row is not taken."""
    ran: list[tuple[str, int]] = []

    @box.handler("s", "*")
    async def handler(ctx: Context) -> None:
        ran.append((ctx.event.event_id, ctx.event.attempts))

    claimed = claims_seen(box)
    async with box.running(roles=("worker",)):
        assert box.inbound.acceptor.handoff is not None
        outcomes = await asyncio.gather(
            *(box.inbound.acceptor.accept(delivery(box, f"e{n}")) for n in range(40)),
            box.inbound.acceptor.accept(delivery(box, "skipped", ignored=True)),
        )
        assert [o.status for o in outcomes] == ["accepted"] * 40 + ["ignored"]

        async def all_done() -> bool:
            rows = await inbox(box)
            return sum(r["status"] == "done" for r in rows.values()) == 40

        await wait_until(all_done, within=10, what="the 40 rows done")
    assert sorted(ran) == sorted((f"e{n}", 1) for n in range(40))
    assert claimed == []
    rows = await inbox(box)
    assert rows["skipped"]["status"] == "ignored" and rows["skipped"]["attempts"] == 0
    assert all(r["attempts"] == 1 for k, r in rows.items() if k != "skipped")


async def test_rows_taken_at_accept_are_held_from_other_workers(box: Relaybox, pg_url: str) -> None:
    """While its handler runs, a taken row is pending with its attempt counted and a
    hold of ``claim_hold``, renewed while it runs: another worker claims nothing."""
    entered = asyncio.Event()
    release = asyncio.Event()

    @box.handler("s", "*")
    async def handler(ctx: Context) -> None:
        entered.set()
        await release.wait()

    other = make_box(pg_url)
    try:
        async with box.running(roles=("worker",)):
            accepted = asyncio.create_task(box.inbound.acceptor.accept(delivery(box, "held")))
            await asyncio.wait_for(entered.wait(), 10)
            await accepted
            row = (await inbox(box))["held"]
            assert row["status"] == "pending" and row["attempts"] == 1
            assert row["started_at"] == row["received_at"]  # the accept's own time
            hold = box.settings.worker.claim_hold
            assert row["next_attempt_at"] == pytest.approx(row["received_at"] + hold, abs=1)
            assert await other.worker().run_once() == 0
            release.set()
            await wait_until(
                lambda: _status(box, "held", "done"), within=10, what="the held row done"
            )
        assert (await inbox(box))["held"]["attempts"] == 1
    finally:
        await other.close()


async def _status(box: Relaybox, event_id: str, status: str) -> bool:
    return bool((await inbox(box))[event_id]["status"] == status)


async def test_a_duplicate_or_a_failed_insert_gives_the_room_back(box: Relaybox) -> None:
    """A row the worker took that turns out a duplicate frees its room and does not
    run; an insert that fails frees the room of all of its rows."""
    ran: list[str] = []

    @box.handler("s", "*")
    async def handler(ctx: Context) -> None:
        ran.append(ctx.event.event_id)

    worker = box.worker()  # its chains only: no claim loop runs
    box.inbound.acceptor.handoff = worker
    room = worker._offer_room()
    await box.inbound.acceptor.accept(delivery(box, "first"))
    await wait_until(lambda: _status(box, "first", "done"), within=10, what="the row done")
    outcome = await box.inbound.acceptor.accept(delivery(box, "first"))
    assert outcome.status == "duplicate"
    await worker.drain()
    assert ran == ["first"]
    assert len(worker._ready) == 0 and worker._reserved == 0
    assert worker._offer_room() == room

    async def refused(batch: Any) -> Any:
        assert worker._reserved == 1  # offered and counted while the insert runs
        raise ConnectionError("the database went away")

    box.store.inbox.accept = refused  # type: ignore[method-assign]
    second = delivery(box, "second")
    with pytest.raises(Exception, match="unavailable"):
        await box.inbound.acceptor.accept(second)
    assert len(worker._ready) == 0 and worker._reserved == 0
    assert second.held_until is None  # a part committed again is offered afresh


async def test_nothing_is_taken_when_off_stopping_or_full(box: Relaybox, pg_url: str) -> None:
    """``handoff = false`` leaves every row to the claims; a worker that stops, or
    whose chains have a group each waiting, takes nothing."""
    off = make_box(pg_url, handoff=False)
    try:
        async with off.running(roles=("worker",)):
            assert off.inbound.acceptor.handoff is None
    finally:
        await off.close()

    worker = box.worker()
    batch = [delivery(box, f"f{n}") for n in range(worker.concurrency * worker.group + 5)]
    full = worker.concurrency * worker.group  # one group per chain
    assert worker.offer(batch) == full
    assert [d.held_until is not None for d in batch] == [True] * full + [False] * 5
    assert worker.offer([delivery(box, "more")]) == 0  # the room is counted
    worker.settle(batch, None)
    assert worker._reserved == 0
    worker.stop()
    fresh = [delivery(box, "late")]
    assert worker.offer(fresh) == 0 and fresh[0].held_until is None


async def test_a_claim_in_flight_counts_the_free_chains_as_its_own(box: Relaybox) -> None:
    """While a claim is in flight it has counted the free chains for the rows it will
    start at once: an offer then takes nothing, and its rows go to the next claim
    (woken by their insert). Once the claim returns, offers take again."""
    worker = box.worker()
    during: list[int] = []
    claim = box.store.inbox.claim

    async def offering(**kwargs: Any) -> Claim:
        during.append(worker.offer([delivery(box, "meanwhile")]))
        return await claim(**kwargs)

    box.store.inbox.claim = offering  # type: ignore[method-assign]
    assert await worker.run_once() == 0  # nothing to claim
    assert during == [0]
    after = [delivery(box, "after")]
    assert worker.offer(after) == 1 and after[0].held_until is not None
    worker.settle(after, None)
    assert worker._reserved == 0


async def test_sqlite_takes_nothing(tmp_path: Any) -> None:
    """SQLite's worker runs claimed batches in its single writer: no row is taken."""
    box = Relaybox(settings=Settings(database_url=f"sqlite:///{tmp_path / 'h.db'}"))
    try:
        await box.store.migrate()
        worker = Worker(box)
        batch = [delivery(box, "s1")]
        assert worker.offer(batch) == 0 and batch[0].held_until is None
    finally:
        await box.close()
