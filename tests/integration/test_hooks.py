"""The acceptor's and the dispatcher's test hooks (``box.accept_hooks``,
``box.dispatch_hooks``), on SQLite and PostgreSQL: they fire at their points with the
right ids, and a hook that raises loses no delivery."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from relaybox import FrozenClock, Relaybox, sources
from relaybox.store import AcceptOutcome, NewDelivery
from relaybox.store.outbox_rows import Delivery
from tests.conftest import Served
from tests.support.outbound_app import endpoint, local, outbox_rows, publish_one
from tests.support.receivers import HttpReceiver, Reply

SECRET = "hook-secret"


def billing(box: Relaybox, inline: bool = False) -> sources.HmacSource:
    return box.source(
        "billing",
        sources.hmac(
            secrets=[SECRET],
            header="X-Signature",
            prefix="sha256=",
            id_path="id",
            type_path="type",
            account="acct_1",
            inline=inline,
        ),
    )


INLINE = pytest.mark.parametrize("inline", [False, True], ids=["acceptor", "inline"])


async def post(
    http: aiohttp.ClientSession, source: sources.HmacSource, event_id: str, now: float
) -> tuple[int, dict[str, Any]]:
    raw = json.dumps({"id": event_id, "type": "invoice.paid"}).encode()
    headers = source.sign(raw, event_id=event_id, event_type="invoice.paid", now=now)
    async with http.post("/webhooks/billing", data=raw, headers=headers) as answer:
        return answer.status, await answer.json()


async def inbox_ids(box: Relaybox) -> dict[str, int]:
    rows = await box.store.fetch_all("SELECT id, event_id FROM relaybox_inbox ORDER BY id")
    return {r["event_id"]: r["id"] for r in rows}


# -- the acceptor -----------------------------------------------------------------------


@INLINE
async def test_after_commit_fires_with_the_committed_rows_before_the_answer(
    box: Relaybox, clock: FrozenClock, inline: bool
) -> None:
    source = billing(box, inline)
    seen: list[tuple[tuple[str, str, str], int, str, dict[str, int]]] = []

    async def after_commit(accepted: list[tuple[NewDelivery, AcceptOutcome]]) -> None:
        stored = await inbox_ids(box)  # another connection: the COMMIT is done
        seen.extend((d.key, o.inbox_id, o.status, stored) for d, o in accepted)

    box.accept_hooks.after_commit.append(after_commit)
    async with Served(box.receiver) as server, aiohttp.ClientSession(server.url) as http:
        assert await post(http, source, "evt_1", clock.now()) == (
            200,
            {"status": "accepted", "event_id": "evt_1"},
        )
        assert len(seen) == 1  # the answer waited for the hook
        assert (await post(http, source, "evt_1", clock.now()))[1]["status"] == "duplicate"
    ids = await inbox_ids(box)
    assert [(key, inbox_id, status) for key, inbox_id, status, _ in seen] == [
        (("billing", "acct_1", "evt_1"), ids["evt_1"], "accepted"),
        (("billing", "acct_1", "evt_1"), ids["evt_1"], "duplicate"),
    ]
    assert seen[0][3] == ids


@INLINE
async def test_an_after_commit_hook_that_raises_is_a_lost_answer_not_a_lost_row(
    box: Relaybox, clock: FrozenClock, inline: bool
) -> None:
    """The request is answered 503 (the sender retries) but its row is committed: the
    retry is a duplicate of that row, and the handler runs once (inline: in the
    transaction that committed the row; else the worker, later)."""
    source = billing(box, inline)
    handled: list[str] = []

    @box.handler("billing", "invoice.paid")
    async def on_paid(ctx: Any) -> None:
        handled.append(ctx.event.event_id)

    async def lose_the_answer(accepted: list[tuple[NewDelivery, AcceptOutcome]]) -> None:
        box.accept_hooks.after_commit.remove(lose_the_answer)
        raise ConnectionResetError("the commit's answer was lost")

    box.accept_hooks.after_commit.append(lose_the_answer)
    async with Served(box.receiver) as server, aiohttp.ClientSession(server.url) as http:
        status, answer = await post(http, source, "evt_1", clock.now())
        assert (status, answer["error"]) == (503, "unavailable")
        assert list(await inbox_ids(box)) == ["evt_1"]
        assert await post(http, source, "evt_1", clock.now()) == (
            200,
            {"status": "duplicate", "event_id": "evt_1"},
        )
    assert handled == (["evt_1"] if inline else [])
    worker = box.worker()
    assert await worker.run_once() == (0 if inline else 1)
    assert await worker.run_once() == 0
    assert handled == ["evt_1"]


# -- the dispatcher ---------------------------------------------------------------------


async def test_before_send_and_after_record_fire_with_each_delivery_and_its_outcome(
    box: Relaybox, clock: FrozenClock
) -> None:
    local(box)
    order: list[tuple[str, int, str]] = []

    async def before_send(d: Delivery) -> None:
        order.append(("before_send", d.id, str(len(receiver.requests))))

    async def after_record(recorded: list[tuple[Delivery, str]]) -> None:
        order.extend(("after_record", d.id, label) for d, label in recorded)

    box.dispatch_hooks.before_send.append(before_send)
    box.dispatch_hooks.after_record.append(after_record)
    async with HttpReceiver([Reply(500), Reply(200)]) as receiver:
        await endpoint(box, receiver.url)
        await publish_one(box)
        dispatcher = box.dispatcher()
        try:
            assert await dispatcher.run_once() == 1
            [row] = await outbox_rows(box)
            clock.advance(3600)
            assert await dispatcher.run_once() == 1
        finally:
            await dispatcher.close()
    assert order == [
        ("before_send", row["id"], "0"),  # before the channel sent it
        ("after_record", row["id"], "retry"),
        ("before_send", row["id"], "1"),
        ("after_record", row["id"], "sent"),
    ]


async def test_after_record_is_awaited_by_a_running_dispatcher(box: Relaybox) -> None:
    """run()'s path (on PostgreSQL a success is recorded by the next lease): the hook
    fires once the outcome is committed, and a test waits on it instead of sleeping."""
    local(box)
    recorded: list[tuple[int, str]] = []
    done = asyncio.Event()

    async def after_record(batch: list[tuple[Delivery, str]]) -> None:
        recorded.extend((d.id, label) for d, label in batch)
        done.set()

    box.dispatch_hooks.after_record.append(after_record)
    async with HttpReceiver() as receiver:
        await endpoint(box, receiver.url)
        await publish_one(box)
        dispatcher = box.dispatcher()
        task = asyncio.create_task(dispatcher.run())
        try:
            async with asyncio.timeout(10):
                await done.wait()
            [row] = await outbox_rows(box)
            assert (row["status"], recorded) == ("sent", [(row["id"], "sent")])
        finally:
            dispatcher.stop()
            await task


async def test_a_before_send_hook_that_raises_fails_the_attempt_as_a_retry(
    box: Relaybox, clock: FrozenClock
) -> None:
    local(box)

    async def refuse(d: Delivery) -> None:
        box.dispatch_hooks.before_send.remove(refuse)
        raise RuntimeError("injected before the send")

    box.dispatch_hooks.before_send.append(refuse)
    async with HttpReceiver() as receiver:
        await endpoint(box, receiver.url)
        await publish_one(box)
        dispatcher = box.dispatcher()
        try:
            assert await dispatcher.run_once() == 1
            [row] = await outbox_rows(box)
            assert (row["status"], receiver.requests) == ("pending", [])
            assert "injected before the send" in row["last_error"]
            clock.advance(3600)
            assert await dispatcher.run_once() == 1
        finally:
            await dispatcher.close()
        assert len(receiver.requests) == 1
    [row] = await outbox_rows(box)
    assert (row["status"], row["attempts"]) == ("sent", 2)


@pytest.mark.parametrize("running", [False, True], ids=["run_once", "run"])
async def test_an_after_record_hook_that_raises_leaves_the_outcome_recorded(
    box: Relaybox, running: bool
) -> None:
    local(box)
    calls: list[int] = []
    second = asyncio.Event()

    async def broken(batch: list[tuple[Delivery, str]]) -> None:
        calls.extend(d.id for d, _ in batch)
        if len(calls) >= 2:
            second.set()
        raise RuntimeError("a broken hook")

    box.dispatch_hooks.after_record.append(broken)
    async with HttpReceiver() as receiver:
        await endpoint(box, receiver.url)
        await publish_one(box, data={"n": 1})
        await publish_one(box, data={"n": 2})
        dispatcher = box.dispatcher(concurrency=1, batch=1)
        if running:
            task = asyncio.create_task(dispatcher.run())
            try:
                async with asyncio.timeout(10):
                    await second.wait()  # the dispatcher went on after the first
            finally:
                dispatcher.stop()
                await task
        else:
            try:
                assert await dispatcher.run_once() == 1
                assert await dispatcher.run_once() == 1
            finally:
                await dispatcher.close()
        assert len(receiver.requests) == 2
    rows = await outbox_rows(box)
    assert [r["status"] for r in rows] == ["sent", "sent"]
    assert sorted(calls) == [r["id"] for r in rows]
