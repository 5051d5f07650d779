"""Operational events on SQLite and PostgreSQL: published to the operational tenant's
endpoints in the transaction of the change behind them, delivered like any webhook
to a real receiver, verified with the official ``standardwebhooks`` package."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from datetime import UTC, datetime
from typing import Any

import aiohttp
import httpx
import standardwebhooks
from sqlalchemy import text
from starlette.applications import Starlette
from starlette.routing import Mount

from relaybox import Context, FrozenClock, PermanentError, Relaybox, Secret, sources
from relaybox.admin import build_admin
from relaybox.outbound.announce import endpoint_recovered, operational_events
from relaybox.outbound.deliveries import redeliver
from relaybox.outbound.endpoints import disable_endpoint, enable_endpoint
from relaybox.store import NewDelivery
from relaybox.store.outbox_rows import Delivery
from tests.conftest import Served
from tests.support.outbound_app import dispatch_once, endpoint, local, publish_one
from tests.support.receivers import HttpReceiver, Reply, Seen

OPS = "relaybox"


async def ops_messages(box: Relaybox, event_type: str) -> list[dict[str, Any]]:
    found = await box.store.fetch_all(
        "SELECT body FROM relaybox_messages WHERE tenant = 'relaybox' AND event_type = "
        f"'{event_type}' ORDER BY created_at, id"
    )
    return [json.loads(r["body"])["data"] for r in found]


def received(receiver: HttpReceiver, event_type: str) -> list[dict[str, Any]]:
    bodies = [json.loads(s.body) for s in receiver.requests]
    return [b["data"] for b in bodies if b["type"] == event_type]


async def test_three_failures_in_a_row_fire_failing_once_and_recovery_once(
    box: Relaybox, clock: FrozenClock
) -> None:
    local(box)
    healthy = False

    def answer(seen: Seen) -> Reply:
        return Reply(200) if healthy else Reply(503)

    async with HttpReceiver() as ops, HttpReceiver(answer) as tenant_side:
        await endpoint(box, ops.url, tenant=OPS, event_types=["relaybox.*"])
        endpoint_id, _ = await endpoint(box, tenant_side.url, schedule=[1.0] * 20)
        await publish_one(box)
        for _ in range(5):  # failures 1..5: the threshold 3 is crossed once
            await dispatch_once(box)
            clock.advance(2)
        failing = await ops_messages(box, "relaybox.endpoint.failing")
        assert len(failing) == 1
        assert failing[0]["endpointId"] == endpoint_id
        assert (failing[0]["failures"], failing[0]["threshold"]) == (3, 3)
        assert failing[0]["lastStatus"] == 503
        assert await ops_messages(box, "relaybox.endpoint.recovered") == []
        healthy = True
        await dispatch_once(box)  # the retry succeeds: recovered
        await publish_one(box)
        clock.advance(2)
        await dispatch_once(box)  # a second success: nothing more to announce
        recovered = await ops_messages(box, "relaybox.endpoint.recovered")
        assert recovered == [{"endpointId": endpoint_id, "tenant": "t1", "url": tenant_side.url}]
        while await dispatch_once(box):  # the operator endpoint gets both
            pass
        assert len(received(ops, "relaybox.endpoint.failing")) == 1
        assert len(received(ops, "relaybox.endpoint.recovered")) == 1
    [row] = await box.store.fetch_all(
        f"SELECT failures, failing_level FROM relaybox_endpoints WHERE id = '{endpoint_id}'"
    )
    assert (row["failures"], row["failing_level"]) == (0, 0)


async def test_higher_thresholds_are_announced_as_they_are_crossed(
    box: Relaybox, clock: FrozenClock
) -> None:
    local(box, failing_thresholds=[2, 4])
    async with HttpReceiver(Reply(500)) as failing_side:
        await endpoint(box, failing_side.url, schedule=[1.0] * 20)
        await publish_one(box)
        for _ in range(6):
            await dispatch_once(box)
            clock.advance(2)
    failing = await ops_messages(box, "relaybox.endpoint.failing")
    assert [(f["failures"], f["threshold"]) for f in failing] == [(2, 2), (4, 4)]


async def test_an_exhausted_message_reaches_the_operator_endpoint_signed(
    box: Relaybox, clock: FrozenClock
) -> None:
    local(box)
    clock.set(time.time())  # the receiver checks webhook-timestamp against its clock
    async with HttpReceiver() as ops, HttpReceiver(Reply(500)) as tenant_side:
        _, ops_secret = await endpoint(box, ops.url, tenant=OPS)
        endpoint_id, _ = await endpoint(box, tenant_side.url, schedule=[1.0])
        message = await publish_one(box, "pet.adopted")
        await dispatch_once(box)
        clock.advance(2)
        await dispatch_once(box)  # the second and last attempt fails: exhausted
        [row] = await box.store.fetch_all(
            "SELECT status, dead_reason FROM relaybox_outbox WHERE tenant = 't1'"
        )
        assert (row["status"], row["dead_reason"]) == ("dead", "exhausted")
        await dispatch_once(box)  # the operational event goes out
        exhausted = [
            s for s in ops.requests if json.loads(s.body)["type"].endswith("attempt.exhausted")
        ]
    [seen] = exhausted
    payload = standardwebhooks.Webhook(ops_secret).verify(seen.body, seen.headers)
    assert payload["type"] == "relaybox.message.attempt.exhausted"
    data = payload["data"]
    assert data["messageId"] == message.id
    assert data["eventType"] == "pet.adopted"
    assert (data["endpointId"], data["tenant"], data["channel"]) == (endpoint_id, "t1", "webhook")
    assert (data["attempts"], data["lastStatus"], data["lastError"]) == (2, 500, "HTTP 500")


async def test_the_operator_endpoint_failing_raises_no_exhausted_events(
    box: Relaybox, clock: FrozenClock
) -> None:
    local(box)
    async with HttpReceiver(Reply(500)) as ops:
        await endpoint(box, ops.url, tenant=OPS, schedule=[])
        await publish_one(box, "relaybox.test", tenant=OPS)
        await dispatch_once(box)
    assert await ops_messages(box, "relaybox.message.attempt.exhausted") == []


def _delivery(clock: FrozenClock, event_id: str, event_type: str) -> NewDelivery:
    raw = b"{}"
    return NewDelivery(
        source="s",
        account="a",
        event_id=event_id,
        event_type=event_type,
        tenant="t",
        fingerprint=hashlib.sha256(raw).digest(),
        payload=raw,
        headers=None,
        version=None,
        received_at=clock.now(),
    )


async def test_inbox_dead_fires_with_the_dead_letter(box: Relaybox, clock: FrozenClock) -> None:
    local(box)

    @box.handler("s", "invoice.bad")
    async def bad(ctx: Context) -> None:
        raise PermanentError("invoice is not eligible")

    @box.handler("s", "invoice.ok")
    async def ok(ctx: Context) -> None:
        pass

    async with HttpReceiver() as ops:
        await endpoint(box, ops.url, tenant=OPS)
        await box.store.inbox.accept(
            [_delivery(clock, "e1", "invoice.bad"), _delivery(clock, "e2", "invoice.ok")]
        )
        await box.worker(concurrency=1).run_once()
        await dispatch_once(box)
        delivered = received(ops, "relaybox.inbox.dead")
    [dead] = await ops_messages(box, "relaybox.inbox.dead")
    assert dead == delivered[0]
    assert {k: dead[k] for k in ("source", "account", "eventId", "eventType", "tenant")} == {
        "source": "s",
        "account": "a",
        "eventId": "e1",
        "eventType": "invoice.bad",
        "tenant": "t",
    }
    assert (dead["reason"], dead["attempts"], dead["error"]) == (
        "invalid",
        1,
        "invoice is not eligible",
    )


async def test_a_plain_def_handlers_dead_letter_is_announced_in_its_transaction(
    box: Relaybox, clock: FrozenClock
) -> None:
    """A synchronous handler's outcome is written on a sync connection: its dead letter
    raises ``relaybox.inbox.dead`` there too, in the same transaction."""
    local(box)

    @box.handler("s", "invoice.bad")
    def bad(ctx: Any) -> None:
        raise PermanentError("invoice is not eligible")

    await box.store.inbox.accept([_delivery(clock, "e1", "invoice.bad")])
    await box.worker(concurrency=1).run_once()
    [dead] = await ops_messages(box, "relaybox.inbox.dead")
    assert (dead["eventId"], dead["reason"], dead["error"]) == (
        "e1",
        "invalid",
        "invoice is not eligible",
    )
    [row] = await box.store.fetch_all("SELECT status FROM relaybox_inbox")
    assert row["status"] == "dead"


STD_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def _signed(msg_id: str, payload: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(payload).encode()
    when = datetime.fromtimestamp(time.time(), tz=UTC)
    signature = standardwebhooks.Webhook(STD_SECRET).sign(msg_id, when, body.decode())
    return body, {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(when.timestamp())),
        "webhook-signature": signature,
        "content-type": "application/json",
    }


async def test_inbox_quarantined_fires_once_per_conflicting_content(
    box: Relaybox, clock: FrozenClock
) -> None:
    local(box)
    clock.set(time.time())
    box.source("std", sources.standard(secrets=[Secret(STD_SECRET, tenant="t-std")]))
    first = _signed("msg_q", {"type": "order.paid", "amount": 1})
    other = _signed("msg_q", {"type": "order.paid", "amount": 999})
    async with Served(box.receiver) as server, aiohttp.ClientSession() as http:
        answers = []
        for body, headers in (first, other, other):  # the conflict repeats: one event
            async with http.post(server.url + "/std", data=body, headers=headers) as r:
                answers.append((r.status, (await r.json())["status"]))
    assert answers == [(200, "accepted"), (200, "quarantined"), (200, "quarantined")]
    [event] = await ops_messages(box, "relaybox.inbox.quarantined")
    assert (event["source"], event["eventId"], event["tenant"]) == ("std", "msg_q", "t-std")
    [original] = await box.store.fetch_all("SELECT id FROM relaybox_inbox")
    assert event["inboxId"] == original["id"]


async def test_recent_operational_events_are_listed(box: Relaybox, clock: FrozenClock) -> None:
    local(box)
    async with HttpReceiver(Reply(410)) as gone:
        await endpoint(box, gone.url)
        await publish_one(box)
        await dispatch_once(box)  # 410: the endpoint is disabled
    listed = await operational_events(box)
    assert [m.event_type for m in listed] == ["relaybox.endpoint.disabled"]


async def test_admin_api_and_dashboard_show_events_and_set_headers(
    box: Relaybox, clock: FrozenClock
) -> None:
    local(box)
    box.settings = box.settings.model_copy(update={"admin_token": "t0ken-for-tests"})
    auth = {"Authorization": "Bearer t0ken-for-tests"}
    async with HttpReceiver(Reply(410)) as gone:
        endpoint_id, _ = await endpoint(box, gone.url)
        await publish_one(box)
        await dispatch_once(box)  # disabled: relaybox.endpoint.disabled
    app = Starlette(routes=[Mount("/admin", app=build_admin(box))])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://admin.test") as client:
        r = await client.get("/admin/api/v1/operational-events", headers=auth)
        assert r.status_code == 200, r.text
        [event] = r.json()["items"]
        assert event["event_type"] == "relaybox.endpoint.disabled"
        assert event["data"]["endpointId"] == endpoint_id
        url = f"/admin/api/v1/endpoints/{endpoint_id}/headers"
        r = await client.put(url, json={"headers": {"X-Ok": "1", "Host": "x"}}, headers=auth)
        assert (r.status_code, r.json()["error"]) == (422, "invalid_endpoint")
        assert "'Host' may not be set" in r.json()["message"]
        r = await client.put(url, json={"headers": {"X-Ok": "1"}}, headers=auth)
        assert (r.status_code, r.json()["headers"]) == (200, {"X-Ok": "1"})
        r = await client.put(
            f"/admin/api/v1/endpoints/{endpoint_id}/credentials",
            json={"credentials": {"type": "bearer", "token": "tk_admin"}},
            headers=auth,
        )
        assert r.json()["credentials"] == {"type": "bearer", "set": True}
        assert "tk_admin" not in r.text
        await client.post("/admin/login", data={"token": "t0ken-for-tests", "next": "/admin/"})
        page = (await client.get("/admin/operational-events")).text
    assert 'data-event-type="relaybox.endpoint.disabled"' in page
    assert endpoint_id in page


async def test_failing_and_recovery_with_the_dispatcher_loop(
    box: Relaybox, clock: FrozenClock
) -> None:
    """``run()``: on PostgreSQL plain successes ride on the next lease, so the success
    that ends an announced failure must take the recorder's way (and announce it)."""
    local(box, poll_interval=0.05)
    answers = iter([503, 503, 503, 503])

    def answer(seen: Seen) -> Reply:
        return Reply(next(answers, 200))

    sent: set[int] = set()
    both_sent = asyncio.Event()

    async def recorded(batch: list[tuple[Delivery, str]]) -> None:
        sent.update(d.id for d, label in batch if d.tenant == "t1" and label == "sent")
        if len(sent) == 2:
            both_sent.set()

    box.dispatch_hooks.after_record.append(recorded)
    async with HttpReceiver(answer) as tenant_side:
        await endpoint(box, tenant_side.url, schedule=[0.0] * 10)
        await publish_one(box)
        await publish_one(box)
        dispatcher = box.dispatcher(concurrency=1)
        task = asyncio.create_task(dispatcher.run())
        try:
            async with asyncio.timeout(60):
                await both_sent.wait()  # both committed as sent
        finally:
            dispatcher.stop()
            await task
    rows = await box.store.fetch_all("SELECT status FROM relaybox_outbox WHERE tenant = 't1'")
    assert [r["status"] for r in rows] == ["sent", "sent"]
    assert len(await ops_messages(box, "relaybox.endpoint.failing")) == 1
    assert len(await ops_messages(box, "relaybox.endpoint.recovered")) == 1


async def test_a_claim_that_dead_letters_a_dead_workers_event_announces_it(
    box: Relaybox, clock: FrozenClock
) -> None:
    local(box)
    await box.store.inbox.accept([_delivery(clock, "poison", "invoice.crash")])
    worker = box.worker(concurrency=1)
    # Its last attempt started and never finished: the worker process died.
    n, t = worker.backoff.max_attempts, clock.now()
    await box.store.fetch_all(
        f"UPDATE relaybox_inbox SET attempts = {n}, started_at = {t} RETURNING id"
    )
    await worker.run_once()
    [dead] = await ops_messages(box, "relaybox.inbox.dead")
    assert (dead["eventId"], dead["reason"]) == ("poison", "exhausted")
    assert dead["error"] == "the worker died during its last attempt"


async def test_a_failure_after_the_recovery_in_one_batch_is_ended_by_the_next_success(
    box: Relaybox, clock: FrozenClock
) -> None:
    """The recorder applies an endpoint's outcomes of a batch in order, each delivery
    leased as "failing": success (recovered), failure, success (the run ends again,
    nothing more to announce)."""
    local(box)
    endpoint_id, _ = await endpoint(box, "http://127.0.0.1:9/hook")
    async with box.store.transaction() as conn:
        for _ in range(3):
            await box.store.dispatch.endpoint_failed(conn, endpoint_id, now=clock.now())
        await box.store.credentials.endpoint_failing_level(conn, endpoint_id, 3)
        await endpoint_recovered(box, conn, [endpoint_id])
        streak = await box.store.dispatch.endpoint_failed(conn, endpoint_id, now=clock.now())
        assert streak is not None and (streak.failures, streak.failing_level) == (1, 0)
        await endpoint_recovered(box, conn, [endpoint_id])
    [row] = await box.store.fetch_all(
        f"SELECT failures, failing_since FROM relaybox_endpoints WHERE id = '{endpoint_id}'"
    )
    assert (row["failures"], row["failing_since"]) == (0, None)
    assert len(await ops_messages(box, "relaybox.endpoint.recovered")) == 1


async def test_the_application_receives_its_operational_events_in_its_own_handlers(
    box: Relaybox, clock: FrozenClock
) -> None:
    """The recipe of docs/howto/operational-events.md ("In your own handlers"): an
    operator endpoint pointing at this box's own receiver, a Standard Webhooks source
    holding its secret, handlers per type. Each event is handled once, in the handler's
    transaction; a redelivery (the same webhook-id) is a duplicate; an operational
    event nobody handles goes to dead letters without announcing itself again."""
    local(box)
    clock.set(time.time())
    async with box.store.transaction() as conn:
        await conn.execute(
            text("CREATE TABLE ops_seen (event_id TEXT, event_type TEXT, subject TEXT)")
        )

    @box.handler("s", "invoice.bad")
    async def bad(ctx: Context) -> None:
        raise PermanentError("invoice is not eligible")

    async def record(ctx: Context) -> None:
        data = ctx.payload["data"]
        await ctx.conn.execute(
            text("INSERT INTO ops_seen VALUES (:id, :type, :subject)"),
            {
                "id": ctx.event.event_id,
                "type": ctx.event.event_type,
                "subject": data.get("endpointId") or data.get("eventId"),
            },
        )

    box.handler("relaybox-ops", "relaybox.endpoint.disabled")(record)
    box.handler("relaybox-ops", "relaybox.inbox.dead")(record)

    async def seen() -> list[tuple[str, str, str]]:
        rows = await box.store.fetch_all(
            "SELECT event_id, event_type, subject FROM ops_seen ORDER BY event_type"
        )
        return [(r["event_id"], r["event_type"], r["subject"]) for r in rows]

    async with Served(box.receiver) as server:
        _, ops_secret = await endpoint(
            box, server.url + "/relaybox-ops", tenant=OPS, event_types=["relaybox.*"]
        )
        box.source("relaybox-ops", sources.standard(secrets=[ops_secret]))
        shop_id, _ = await endpoint(box, "http://127.0.0.1:9/hook")
        await disable_endpoint(box, shop_id, tenant="t1")
        await box.store.inbox.accept([_delivery(clock, "inv-1", "invoice.bad")])
        assert await box.worker(concurrency=1).run_once() == 1
        assert await dispatch_once(box) == 2  # both events, to this box's receiver
        assert await box.worker(concurrency=1).run_once() == 2
        messages = {
            r["event_type"]: r["id"]
            for r in await box.store.fetch_all(
                "SELECT id, event_type FROM relaybox_messages WHERE tenant = 'relaybox'"
            )
        }
        assert await seen() == [
            (messages["relaybox.endpoint.disabled"], "relaybox.endpoint.disabled", shop_id),
            (messages["relaybox.inbox.dead"], "relaybox.inbox.dead", "inv-1"),
        ]
        received_ops = await box.store.fetch_all(
            "SELECT status FROM relaybox_inbox WHERE source = 'relaybox-ops'"
        )
        assert [r["status"] for r in received_ops] == ["done", "done"]

        # A redelivery carries the same webhook-id: the receiver answers duplicate.
        redelivered = messages["relaybox.endpoint.disabled"]
        assert await redeliver(box, redelivered, tenant=OPS) == 1
        assert await dispatch_once(box) == 1
        assert await box.worker(concurrency=1).run_once() == 0
        assert len(await seen()) == 2
        [row] = await box.store.fetch_all(
            f"SELECT status, last_status FROM relaybox_outbox WHERE message_id = '{redelivered}'"
        )
        assert (row["status"], row["last_status"]) == ("sent", 200)

        # relaybox.endpoint.enabled has no handler: a dead letter ("unhandled") that
        # raises no relaybox.inbox.dead of its own (it would feed itself).
        await enable_endpoint(box, shop_id, tenant="t1")
        assert await dispatch_once(box) == 1
        assert await box.worker(concurrency=1).run_once() == 1
        [unhandled] = await box.store.fetch_all(
            "SELECT event_type, status, dead_reason FROM relaybox_inbox"
            " WHERE source = 'relaybox-ops' AND status = 'dead'"
        )
        assert dict(unhandled) == {
            "event_type": "relaybox.endpoint.enabled",
            "status": "dead",
            "dead_reason": "unhandled",
        }
        assert len(await ops_messages(box, "relaybox.inbox.dead")) == 1
        assert await dispatch_once(box) == 0
