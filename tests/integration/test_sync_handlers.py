"""Synchronous handlers (plain ``def``) in process, on SQLite and PostgreSQL: the worker
runs each in a thread inside one transaction from ``box.sync_transaction()``, where the
effect, the business key, the outbox rows and the inbox row's completion commit
together, with the same retry and dead-letter accounting as async handlers."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from examples.credits import app as credits
from sqlalchemy import Connection, text

from relaybox import FrozenClock, Relaybox
from relaybox.config import Settings
from relaybox.sync import SyncContext
from tests.integration.test_credits import (
    WS,
    balance,
    counts,
    deliver,
    inbox,
    outcomes,
    rows,
    worker_settings,
)
from tests.support.faultapp import invoice_paid
from tests.support.syncapp import register
from tests.support.syncdb import app_engine


async def make_box(database_url: str, clock: FrozenClock, **options: Any) -> Relaybox:
    worker = {k: options.pop(k) for k in list(options) if k in ("max_attempts",)}
    box = register(
        Relaybox(
            settings=Settings(database_url=database_url, worker=worker_settings(**worker)),
            clock=clock,
            **options,
        )
    )
    await credits.setup(box)
    return box


@pytest.fixture
async def box(database_url: str, clock: FrozenClock) -> AsyncIterator[Relaybox]:
    b = await make_box(database_url, clock)
    yield b
    await b.close()


async def until_settled(box: Relaybox, *workers: Any) -> None:
    for _ in range(200):
        await asyncio.gather(*(w.run_once() for w in workers))
        if not await rows(box, "SELECT id FROM relaybox_inbox WHERE status = 'pending'"):
            return
    raise AssertionError("events still pending")


async def test_fifty_concurrent_copies_and_two_event_ids_grant_once(box: Relaybox) -> None:
    copies = await asyncio.gather(
        *(deliver(box, invoice_paid("evt_1", "in_1")) for _ in range(50)),
        deliver(box, invoice_paid("evt_2", "in_1")),
    )
    assert sorted(copies) == ["accepted"] * 2 + ["duplicate"] * 49
    # Two workers taking one event each: their transactions race on the business key.
    await until_settled(box, box.worker(name="w1", batch=1), box.worker(name="w2", batch=1))
    assert await counts(box) == {"grants": 1, "operations": 1, "outbox": 1}
    assert await balance(box) == 100
    for event_id in ("evt_1", "evt_2"):
        row = await inbox(box, event_id)
        assert (row["status"], row["attempts"]) == ("done", 1)
    [mail] = await rows(box, "SELECT channel, key, tenant FROM relaybox_outbox")
    grant = credits.grant_key("stripe", credits.DEV_ACCOUNT, "in_1")
    assert mail == {"channel": "email", "key": grant + ":confirmation", "tenant": WS}


async def test_a_failing_handler_leaves_nothing_retries_then_goes_dead(
    database_url: str, clock: FrozenClock
) -> None:
    box = await make_box(database_url, clock, max_attempts=3)
    try:
        await deliver(box, invoice_paid("evt_1", "in_fail_1"))
        worker = box.worker()
        for attempt in (1, 2, 3):
            assert await worker.run_once() == 1
            row = await inbox(box, "evt_1")
            assert row["attempts"] == attempt
            # The handler recorded its key, its grant, its balance and its e-mail, then
            # raised: none of it committed.
            assert await counts(box) == {"grants": 0, "operations": 0, "outbox": 0}
            assert await balance(box) is None
            if row["status"] != "pending":
                break
            assert "HandlerFailed: the ledger refused invoice in_fail_1" in row["last_error"]
            clock.set(row["next_attempt_at"])
        assert (row["status"], row["dead_reason"]) == ("dead", "exhausted")
        assert "the ledger refused" in row["last_error"]
        assert await outcomes(box, "evt_1") == ["retry", "retry", "exhausted"]

        await deliver(box, invoice_paid("evt_2", "in_invalid_1"))
        assert await worker.run_once() == 1
        row = await inbox(box, "evt_2")
        assert (row["status"], row["dead_reason"], row["attempts"]) == ("dead", "invalid", 1)
        assert "not eligible" in row["last_error"]
        processed = box.metrics.registry.get_sample_value(
            "relaybox_inbox_outcomes_total", {"source": "stripe", "outcome": "dead_invalid"}
        )
        assert processed == 1
    finally:
        await box.close()


async def test_session_project_and_outbox_share_the_handlers_transaction(
    box: Relaybox, clock: FrozenClock
) -> None:
    async with box.store.transaction() as conn:
        await conn.execute(text("CREATE TABLE notes (id TEXT PRIMARY KEY, body TEXT)"))
    threads: list[str] = []

    @box.handler("stripe", "customer.updated")
    def customer(ctx: SyncContext) -> None:
        threads.append(threading.current_thread().name)
        obj = ctx.payload["data"]["object"]
        ctx.session.execute(
            text("INSERT INTO notes VALUES (:id, :body)"),
            {"id": ctx.event.event_id, "body": obj["name"]},
        )
        if ctx.project(f"customer:{obj['id']}", obj["version"], {"name": obj["name"]}):
            ctx.outbox.add("email", f"welcome:{obj['id']}:{obj['version']}", {"n": obj["name"]})
        if obj["name"] == "fails":
            raise RuntimeError("after the session, the projection and the outbox row")

    def updated(event_id: str, version: int, name: str) -> dict[str, Any]:
        event = invoice_paid(event_id, "in_x")
        event["type"] = "customer.updated"
        event["data"] = {"object": {"id": "cus_1", "version": version, "name": name}}
        return event

    await deliver(box, updated("evt_new", 2, "Ada"))
    await box.worker().run_once()
    await deliver(box, updated("evt_old", 1, "Old"))
    await deliver(box, updated("evt_bad", 3, "fails"))
    await box.worker().run_once()
    assert threads and all(name != threading.main_thread().name for name in threads)
    notes = await rows(box, "SELECT id, body FROM notes ORDER BY id")
    assert notes == [{"id": "evt_new", "body": "Ada"}, {"id": "evt_old", "body": "Old"}]
    [state] = await rows(box, "SELECT version, state FROM relaybox_projections")
    assert state["version"] == "2"
    [old] = await rows(box, "SELECT superseded_by FROM relaybox_inbox WHERE event_id = 'evt_old'")
    assert old == {"superseded_by": "customer:cus_1@2"}
    assert (await inbox(box, "evt_bad"))["status"] == "pending"  # rolled back, retried later
    keys = [r["key"] for r in await rows(box, "SELECT key FROM relaybox_outbox")]
    assert keys == ["welcome:cus_1:2"]


async def test_a_sync_handler_on_the_driver_connection_shares_its_transaction(
    box: Relaybox, clock: FrozenClock
) -> None:
    """``ctx.driver`` in a plain-def handler: psycopg's or sqlite3's connection, in the
    handler's transaction (a failing handler's write rolls back)."""
    async with box.store.transaction() as conn:
        await conn.execute(text("CREATE TABLE notes (id TEXT PRIMARY KEY, body TEXT)"))
    drivers: set[str] = set()

    @box.handler("stripe", "customer.updated")
    def customer(ctx: SyncContext) -> None:
        drivers.add(type(ctx.driver).__module__.split(".")[0])
        mark = "?" if box.store.db.single_writer else "%s"
        ctx.driver.execute(f"INSERT INTO notes VALUES ({mark}, 'x')", (ctx.event.event_id,))
        if ctx.event.event_id == "evt_bad":
            raise RuntimeError("after the driver's write")

    for event_id in ("evt_ok", "evt_bad"):
        event = invoice_paid(event_id, "in_x")
        event["type"] = "customer.updated"
        await deliver(box, event)
    await box.worker().run_once()
    assert drivers == {"sqlite3" if box.store.db.single_writer else "psycopg"}
    assert await rows(box, "SELECT id FROM notes") == [{"id": "evt_ok"}]
    assert (await inbox(box, "evt_bad"))["status"] == "pending"


async def test_the_provider_of_sync_transactions_is_pluggable(
    database_url: str, clock: FrozenClock
) -> None:
    engine = app_engine(database_url)
    opened: list[Connection] = []

    @contextlib.contextmanager
    def transaction() -> Iterator[Connection]:
        with engine.begin() as conn:
            opened.append(conn)
            yield conn

    box = await make_box(database_url, clock, sync_transaction=transaction)
    try:
        assert box.sync_transaction is transaction
        await deliver(box, invoice_paid("evt_1", "in_1"))
        assert await box.worker().run_once() == 1
        assert len(opened) == 1
        assert (await inbox(box, "evt_1"))["status"] == "done"
        assert await balance(box) == 100
        assert box.store._sync is None or box.store.sync._engine is None  # never made
    finally:
        await box.close()
        engine.dispose()


@pytest.mark.parametrize("group", [None, 1])
async def test_async_and_sync_handlers_share_a_claim(
    database_url: str, clock: FrozenClock, group: int | None
) -> None:
    """One claim with events of both kinds (groups or SQLite's batch for the async ones,
    a thread each for the plain defs; and with ``group = 1``, chains of both)."""
    box = Relaybox(
        settings=Settings(database_url=database_url, worker=worker_settings(group=group)),
        clock=clock,
    )
    register(box)
    await credits.setup(box)
    kinds: list[str] = []

    @box.handler("stripe", "customer.created")
    async def created(ctx: Any) -> None:
        kinds.append("async")
        assert await ctx.once(f"customer:{ctx.event.event_id}")

    try:
        for n in range(3):
            event = invoice_paid(f"evt_c{n}", "in_x")
            event["type"] = "customer.created"
            await deliver(box, event)
            await deliver(box, invoice_paid(f"evt_i{n}", f"in_{n}"))
        assert await box.worker().run_once() == 6
        statuses = await rows(box, "SELECT status FROM relaybox_inbox")
        assert statuses == [{"status": "done"}] * 6
        assert kinds == ["async"] * 3
        assert await counts(box) == {"grants": 3, "operations": 6, "outbox": 3}
        assert await balance(box) == 300
    finally:
        await box.close()


async def test_the_testing_kit_runs_plain_def_handlers(relaybox_harness: Any) -> None:
    seen: list[str] = []

    def configure(box: Relaybox) -> None:
        box.source("stripe", credits.stripe_source({}))

        @box.handler("stripe", "invoice.paid")
        def paid(ctx: SyncContext) -> None:
            if ctx.once(f"paid:{ctx.payload['data']['object']['id']}"):
                seen.append(ctx.event.event_id)

    kit = await relaybox_harness(configure)
    for event_id in ("evt_1", "evt_2"):
        event = invoice_paid(event_id, "in_1")
        delivery = kit.signed("stripe", event_id=event_id, event_type=event["type"], payload=event)
        assert (await kit.deliver(delivery)).status == 200
    assert await kit.drain_worker() == 2
    assert len(seen) == 1
