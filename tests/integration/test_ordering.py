"""Versioned projections (retries do not put events in order) and the
feedback alerts example, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import json
import random
import time
from typing import Any

import aiohttp
import pytest
from sqlalchemy import text

from relaybox import Context, FrozenClock, Relaybox, sources
from relaybox.config import Settings
from relaybox.inbound.projections import auto_order, current, integer_order, project, text_order
from relaybox.inbound.replay import Selection, replay
from relaybox.store import NewDelivery
from relaybox.testing import Harness
from tests.conftest import Served

SECRET = "ordering-secret"


def billing_source() -> sources.HmacSource:
    """A provider that sends a monotonic version in the payload (``data.version``)."""
    return sources.hmac(
        secrets=[SECRET],
        header="X-Signature",
        prefix="sha256=",
        id_path="id",
        type_path="type",
        version_path="data.version",
        account="acct_1",
    )


def subscription(event_id: str, version: int, status: str, sub: str = "sub_1") -> dict[str, Any]:
    return {
        "id": event_id,
        "type": "subscription.updated",
        "data": {"id": sub, "status": status, "version": version},
    }


def delivery(body: dict[str, Any], received_at: float, version: str | None = None) -> NewDelivery:
    """What the receiver stores for ``body`` from the billing source."""
    raw = json.dumps(body).encode()
    return NewDelivery(
        source="billing",
        account="acct_1",
        event_id=body["id"],
        event_type=body["type"],
        tenant=None,
        fingerprint=hashlib.sha256(raw).digest(),
        payload=raw,
        headers=None,
        version=version,
        received_at=received_at,
    )


async def inbox(box: Relaybox) -> dict[str, dict[str, Any]]:
    rows = await box.store.fetch_all(
        "SELECT event_id, status, dead_reason, last_error, superseded_by FROM relaybox_inbox"
    )
    return {r["event_id"]: r for r in rows}


async def test_a_late_older_version_is_superseded(box: Relaybox, clock: FrozenClock) -> None:
    """ "active" v5, then "canceled" v7, then a late "active" v6: canceled stays; the v6
    row is done and marked superseded. The version comes from the source's version_path."""
    source = box.source("billing", billing_source())
    async with box.store.transaction() as conn:
        await conn.execute(text("CREATE TABLE applied (version INTEGER PRIMARY KEY)"))

    @box.handler("billing", "subscription.updated")
    async def on_update(ctx: Context) -> None:
        sub = ctx.payload["data"]
        if await project(ctx, f"subscription:{sub['id']}", None, {"status": sub["status"]}):
            await ctx.conn.execute(
                text("INSERT INTO applied (version) VALUES (:v)"),
                {"v": int(ctx.event.version or 0)},
            )

    worker = box.worker()
    async with Served(box.receiver) as server, aiohttp.ClientSession(server.url) as http:
        for event_id, version, status in (
            ("evt_5", 5, "active"),
            ("evt_7", 7, "canceled"),
            ("evt_6", 6, "active"),
        ):
            raw = json.dumps(subscription(event_id, version, status)).encode()
            headers = source.sign(
                raw, event_id=event_id, event_type="subscription.updated", now=clock.now()
            )
            async with http.post("/webhooks/billing", data=raw, headers=headers) as answer:
                assert answer.status == 200, await answer.text()
            assert await worker.run_once() == 1

    stored = await current(box, "subscription:sub_1")
    assert stored is not None
    assert (stored.state, stored.version, stored.origin) == ({"status": "canceled"}, "7", "event")
    rows = await inbox(box)
    assert {k: (r["status"], r["superseded_by"]) for k, r in rows.items()} == {
        "evt_5": ("done", None),
        "evt_7": ("done", None),
        "evt_6": ("done", "subscription:sub_1@7"),
    }
    applied = await box.store.fetch_all("SELECT version FROM applied ORDER BY version")
    assert [a["version"] for a in applied] == [5, 7]
    metrics = box.metrics.render().decode()
    assert 'relaybox_projection_writes_total{outcome="superseded"} 1.0' in metrics
    assert 'relaybox_projection_writes_total{outcome="applied"} 2.0' in metrics


async def test_the_same_version_again_is_current_and_no_version_is_refused(
    box: Relaybox, clock: FrozenClock
) -> None:
    """A replay of the event that is current changes nothing and is not "superseded";
    a replay of the stale one is superseded again (the mark is judged anew). An event
    without a version is refused, never ordered by arrival."""

    @box.handler("billing")
    async def on_update(ctx: Context) -> None:
        sub = ctx.payload["data"]
        await project(ctx, f"subscription:{sub['id']}", sub.get("version"), sub.get("status"))

    await box.store.inbox.accept(
        [
            delivery(subscription("e10", 10, "active"), clock.now()),
            delivery(subscription("e9", 9, "paused"), clock.now()),
        ]
    )
    await box.worker().run_once()
    result = await replay(box, Selection(source="billing"), actor="ops", reason="check")
    assert len(result.replayed) == 2
    assert {r["superseded_by"] for r in (await inbox(box)).values()} == {None}
    await box.worker().run_once()
    rows = await inbox(box)
    assert (rows["e10"]["superseded_by"], rows["e9"]["superseded_by"]) == (
        None,
        "subscription:sub_1@10",
    )
    stored = await current(box, "subscription:sub_1")
    assert stored is not None and (stored.version, stored.state) == ("10", "active")

    # Arrival order and timestamps are not versions: no version → dead "invalid".
    await box.store.inbox.accept(
        [delivery({"id": "e0", "type": "t", "data": {"id": "sub_1"}}, clock.now())]
    )
    await box.worker().run_once()
    row = (await inbox(box))["e0"]
    assert (row["status"], row["dead_reason"]) == ("dead", "invalid")
    assert "no version" in row["last_error"]


def test_version_orders() -> None:
    versions = ["-100", "-12", "-9", "-1", "0", "7", "9", "10", "99", "100", "12345678901234567890"]
    keys = [integer_order(v) for v in versions]
    assert keys == sorted(keys)
    assert integer_order("007") == integer_order("7") and integer_order("-0") == integer_order("0")
    assert auto_order("10") > auto_order("9")
    assert auto_order("2026-01-02") > auto_order("99999")  # text after every integer
    assert text_order("b") > text_order("a")
    with pytest.raises(ValueError):
        integer_order("v2")


async def test_history_is_not_a_projection(box: Relaybox, clock: FrozenClock) -> None:
    """Invoices A and B processed B first, then A: two grants (two operations)."""
    async with box.store.transaction() as conn:
        await conn.execute(text("CREATE TABLE grants (invoice TEXT PRIMARY KEY)"))

    @box.handler("billing", "invoice.paid")
    async def grant(ctx: Context) -> None:
        invoice = ctx.payload["data"]["id"]
        if await ctx.once(f"billing:{ctx.event.account}:{invoice}:initial-credit-grant"):
            await ctx.conn.execute(text("INSERT INTO grants VALUES (:i)"), {"i": invoice})

    worker = box.worker()
    for event_id, invoice in (("evt_b", "inv_B"), ("evt_a", "inv_A")):
        body = {"id": event_id, "type": "invoice.paid", "data": {"id": invoice}}
        await box.store.inbox.accept([delivery(body, clock.now())])
        assert await worker.run_once() == 1
    grants = await box.store.fetch_all("SELECT invoice FROM grants ORDER BY invoice")
    assert [g["invoice"] for g in grants] == ["inv_A", "inv_B"]


async def test_inverted_updates_and_a_concurrent_replay(database_url: str) -> None:
    """State updates delivered out of order, plus replays of the
    whole range while the worker loop runs. No older state ever overwrites a newer one,
    no grant is duplicated, every replay is recorded."""
    settings = Settings(database_url=database_url)
    w = settings.worker
    w.poll_interval, w.claim_hold, w.batch, w.concurrency = 0.02, 2.0, 4, 4
    w.backoff_base, w.backoff_cap = 0.05, 0.2
    box = Relaybox(settings=settings)  # real clock: the loop and the replays interleave
    async with box.store.transaction() as conn:
        await conn.execute(text("CREATE TABLE grants (invoice TEXT PRIMARY KEY)"))
        await conn.execute(
            text("CREATE TABLE subscriptions (id TEXT PRIMARY KEY, version INTEGER, status TEXT)")
        )
        await conn.execute(text("CREATE TABLE violations (seen INTEGER, stored INTEGER)"))

    @box.handler("billing", "subscription.updated")
    async def on_update(ctx: Context) -> None:
        sub = ctx.payload["data"]
        if not await project(ctx, f"subscription:{sub['id']}", sub["version"], sub["status"]):
            return
        # project() said this version is newer than anything applied: check it.
        row = (
            await ctx.conn.execute(text("SELECT version FROM subscriptions WHERE id = :id"), sub)
        ).first()
        if row is not None and row[0] >= sub["version"]:
            await ctx.conn.execute(
                text("INSERT INTO violations VALUES (:s, :o)"), {"s": sub["version"], "o": row[0]}
            )
        await ctx.conn.execute(
            text(
                "INSERT INTO subscriptions VALUES (:id, :version, :status) ON CONFLICT (id)"
                " DO UPDATE SET version = excluded.version, status = excluded.status"
            ),
            sub,
        )

    @box.handler("billing", "invoice.paid")
    async def grant(ctx: Context) -> None:
        invoice = ctx.payload["data"]["id"]
        if await ctx.once(f"billing:{ctx.event.account}:{invoice}:initial-credit-grant"):
            await ctx.conn.execute(text("INSERT INTO grants VALUES (:i)"), {"i": invoice})

    updates = [
        subscription(f"sub_v{v}", v, "canceled" if v == 12 else ("active", "past_due")[v % 2])
        for v in range(1, 13)
    ]
    random.Random(5).shuffle(updates)
    invoices = [
        {"id": f"inv_evt_{i}", "type": "invoice.paid", "data": {"id": f"inv_{i}"}} for i in range(8)
    ]
    bodies = [b for pair in zip(updates, invoices + [None] * 4, strict=True) for b in pair if b]
    replays: list[int] = []

    async def deliver() -> None:
        for start in range(0, len(bodies), 3):
            now = time.time()
            await box.store.inbox.accept([delivery(b, now) for b in bodies[start : start + 3]])
            await asyncio.sleep(0.01)

    async def replay_alongside() -> None:
        # At least five rounds, and on until one of them found finished rows to replay
        # (a loaded machine may not have completed any during the first rounds).
        rounds = 0
        while rounds < 5 or (not replays and rounds < 500):
            result = await replay(
                box, Selection(source="billing", since=0), actor="test", reason=f"round {rounds}"
            )
            replays.extend(result.replayed)
            rounds += 1
            await asyncio.sleep(0.02)

    try:
        await box.start(("worker",))
        await asyncio.gather(deliver(), replay_alongside())
        for _ in range(1000):
            left = await box.store.fetch_all(
                "SELECT count(*) AS n FROM relaybox_inbox WHERE status <> 'done'"
            )
            if left[0]["n"] == 0:
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError(f"rows still pending: {await inbox(box)}")
        await box.close()  # stop the worker: what follows reads a settled database
        await check_settled(box, replays)
    finally:
        await box.close()


async def check_settled(box: Relaybox, replays: list[int]) -> None:
    assert replays, "no replay overlapped the normal delivery"
    stored = await current(box, "subscription:sub_1")
    assert stored is not None and (stored.version, stored.state) == ("12", "canceled")
    assert await box.store.fetch_all("SELECT * FROM violations") == []
    subscriptions = await box.store.fetch_all("SELECT version, status FROM subscriptions")
    assert subscriptions == [{"version": 12, "status": "canceled"}]
    grants = await box.store.fetch_all("SELECT invoice FROM grants ORDER BY invoice")
    assert [g["invoice"] for g in grants] == [f"inv_{i}" for i in range(8)]
    ops = await box.store.fetch_all("SELECT count(*) AS n FROM relaybox_operations")
    assert ops[0]["n"] == 8
    recorded = await box.store.fetch_all("SELECT count(*) AS n FROM relaybox_replays")
    assert recorded[0]["n"] == len(replays)
    superseded = [r for r in (await inbox(box)).values() if r["superseded_by"]]
    assert superseded, "the shuffled order never delivered an older version late"


# -- the feedback alerts example ---------------------------------------------------


async def test_feedback_alerts_example(database_url: str, clock: FrozenClock) -> None:
    """Duplicate and different-id deliveries for one feedback → one alert; an
    escalation → a second, distinct alert; shown on the page; notifications through
    the outbox with the destination in their key. Deliveries go through the box's
    receiver and the worker is stepped with ``relaybox.testing``'s ``Harness.of``."""
    from examples.feedback_alerts.app import Contract, alert_key, build, build_app, setup

    contract = dataclasses.replace(Contract.load(env={}), destinations=("team-chat",))
    box = build(contract=contract, settings=Settings(database_url=database_url), clock=clock)
    await setup(box)
    kit = Harness.of(box)

    def feedback(event: str, **extra: Any) -> dict[str, Any]:
        return {
            "event": event,
            "project": {"id": "proj_1"},
            "feedback": {"id": "fb_42", "title": "<b>Export</b> is slow"},
            **extra,
        }

    async def post(delivery_id: str, body: dict[str, Any]) -> str | None:
        delivery = kit.signed(
            "sinalio", event_id=delivery_id, event_type=body["event"], payload=body
        )
        response = await kit.deliver(delivery)
        assert response.status == 200, response.body
        return response.outcome

    try:
        created = feedback("feedback.created")
        assert await post("dlv_1", created) == "accepted"
        assert await post("dlv_1", created) == "duplicate"
        assert await post("dlv_2", created) == "accepted"  # another id, same feedback
        assert len(await kit.inbox("sinalio", "dlv_1")) == 1
        assert await kit.drain_worker() == 2
        initial = alert_key("sinalio", "sinalio-dev", "proj_1", "fb_42", "initial-alert")
        await kit.assert_business_key(initial, fingerprint="initial")
        alerts = await box.store.fetch_all("SELECT business_key FROM feedback_alerts")
        assert [a["business_key"] for a in alerts] == [initial]

        escalated = feedback("feedback.escalated", escalation={"level": 2})
        assert await post("dlv_3", escalated) == "accepted"
        assert await post("dlv_4", escalated) == "accepted"
        assert await kit.drain_worker() == 2
        for delivery_id in ("dlv_1", "dlv_2", "dlv_3", "dlv_4"):
            await kit.assert_status(delivery_id, "done")
        escalation = alert_key("sinalio", "sinalio-dev", "proj_1", "fb_42", "escalation:2")
        await kit.assert_business_key(escalation, fingerprint="escalation")
        assert sorted(await kit.business_keys()) == sorted([initial, escalation])
        rows = await box.store.fetch_all(
            "SELECT business_key, kind FROM feedback_alerts ORDER BY kind"
        )
        assert [(r["business_key"], r["kind"]) for r in rows] == [
            (escalation, "escalation"),
            (initial, "initial"),
        ]
        outbox = await kit.outbox()
        assert sorted((o["channel"], o["key"]) for o in outbox) == [
            ("webhook", f"{escalation}:notify:team-chat"),
            ("webhook", f"{initial}:notify:team-chat"),
        ]
        [notify] = await kit.assert_outbox("webhook", key=f"{initial}:notify:team-chat", count=1)
        assert notify["payload"]["destination"] == "team-chat"
        refs = await box.store.fetch_all("SELECT first_event, last_event FROM feedbacks")
        # One reference, touched by every delivery (a batch's groups may run in any order).
        assert len(refs) == 1 and refs[0]["last_event"] in ("dlv_3", "dlv_4")

        async with Served(build_app(box, roles=())) as server:
            async with aiohttp.ClientSession(server.url) as http, http.get("/") as page:
                shown = await page.text()
        assert "&lt;b&gt;Export&lt;/b&gt; is slow" in shown and "<b>Export" not in shown
        assert shown.count("<tr><td>") == 2
    finally:
        await kit.close()


async def test_feedback_alerts_refuse_what_they_cannot_trust(relaybox_harness: Any) -> None:
    """With the kit's own SQLite box: a forged delivery is refused and stores nothing;
    a delivery without the feedback's id is a dead letter and alerts nobody."""
    from examples.feedback_alerts.app import Contract, configure, setup

    contract = dataclasses.replace(Contract.load(env={}), destinations=("team-chat",))
    kit = await relaybox_harness(functools.partial(configure, contract=contract), setup=setup)
    body = {"event": "feedback.created", "project": {"id": "proj_1"}, "feedback": {"id": "fb_1"}}
    forged = kit.signed("sinalio", event_id="dlv_f", event_type=body["event"], payload=body)
    assert (await kit.deliver(forged.tampered())).status == 401
    assert await kit.inbox("sinalio") == []

    nameless = {"event": "feedback.created", "project": {"id": "proj_1"}, "feedback": {}}
    await kit.send("sinalio", event_id="dlv_x", event_type="feedback.created", payload=nameless)
    assert await kit.drain_worker() == 1
    await kit.assert_dead("dlv_x", "invalid")
    assert await kit.business_keys() == [] and await kit.outbox() == []


def test_feedback_contract_is_configuration() -> None:
    from examples.feedback_alerts.app import Contract

    contract = Contract.load(env={"FEEDBACK_ALERTS_SECRET": "from-env"})
    assert contract.source["provider"] == "hmac" and contract.source["secrets"] == ["from-env"]
    with pytest.raises(Exception, match=r"fields\.feedback"):
        Contract.from_dict(
            {"source": {}, "events": {"new_feedback": []}, "fields": {"project": "p"}}, env={}
        )
