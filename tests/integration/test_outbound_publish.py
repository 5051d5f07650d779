"""Publishing inside the application's transaction, fan-out, idempotency, the catalog,
and the repair tools (redeliver, recover, undelivered), on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text

from relaybox import FrozenClock, Relaybox
from relaybox.outbound import (
    Dispatcher,
    InvalidMessage,
    define_event_type,
    disable_endpoint,
    enable_endpoint,
    list_deliveries,
    recover,
    redeliver,
)
from tests.support.outbound_app import endpoint, local, outbox_rows, publish_one
from tests.support.receivers import HttpReceiver, Reply


@pytest.fixture
async def dispatcher(box: Relaybox) -> AsyncIterator[Dispatcher]:
    local(box)
    d = box.dispatcher()
    yield d
    await d.close()


async def test_publish_commits_or_rolls_back_with_the_application(
    box: Relaybox, dispatcher: Dispatcher
) -> None:
    async with box.store.transaction() as conn:
        await conn.execute(text("CREATE TABLE pets (id TEXT PRIMARY KEY, status TEXT)"))
    async with HttpReceiver() as receiver:
        await endpoint(box, receiver.url)
        with pytest.raises(RuntimeError):
            async with box.store.transaction() as conn:
                await conn.execute(text("INSERT INTO pets VALUES ('p1', 'adopted')"))
                await box.publish(conn, "pet.adopted", {"petId": "p1"}, tenant="t1")
                raise RuntimeError("the adoption failed after publishing")
        assert await box.store.fetch_all("SELECT id FROM relaybox_messages") == []
        assert await outbox_rows(box) == []
        assert await dispatcher.run_once() == 0

        async with box.store.transaction() as conn:
            await conn.execute(text("INSERT INTO pets VALUES ('p2', 'adopted')"))
            message = await box.publish(conn, "pet.adopted", {"petId": "p2"}, tenant="t1")
        assert await dispatcher.run_once() == 1
        [seen] = receiver.requests
    assert seen.webhook_id == message.id
    assert [p["id"] for p in await box.store.fetch_all("SELECT id FROM pets")] == ["p2"]


async def test_the_same_idempotency_key_returns_the_existing_message(box: Relaybox) -> None:
    local(box)
    await endpoint(box, "http://127.0.0.1:9/hook")
    first = await publish_one(box, idempotency_key="order-7-created")
    again = await publish_one(box, data={"other": 1}, idempotency_key="order-7-created")
    elsewhere = await publish_one(box, tenant="t2", idempotency_key="order-7-created")
    assert first.created and not again.created and again.id == first.id
    assert again.envelope["data"] == {"petId": "p1"}
    assert elsewhere.created and elsewhere.id != first.id  # keys are per tenant
    assert len(await outbox_rows(box)) == 1


async def test_fan_out_follows_subscriptions_tenants_and_status(box: Relaybox) -> None:
    local(box)
    url = "http://127.0.0.1:9/hook"
    pets, _ = await endpoint(box, url, event_types=["pet.*"])
    orders, _ = await endpoint(box, url, events=["order.created", "order.completed"])
    everything, _ = await endpoint(box, url)
    off, _ = await endpoint(box, url)
    await disable_endpoint(box, off, tenant="t1")
    await endpoint(box, url, tenant="t2")

    adopted = await publish_one(box, "pet.adopted")
    created = await publish_one(box, "order.created")
    failed = await publish_one(box, "payment.failed")
    assert set(adopted.endpoints) == {pets, everything}
    assert set(created.endpoints) == {orders, everything}
    assert failed.endpoints == (everything,)
    targeted = await publish_one(box, "relaybox.test", endpoint_ids=[orders, off, "ep_nope"])
    assert targeted.endpoints == (orders,)  # only the tenant's enabled endpoints


async def test_the_catalog_schema_is_checked_on_publish(box: Relaybox) -> None:
    local(box, max_payload=2048)
    schema = {
        "type": "object",
        "required": ["petId"],
        "properties": {"petId": {"type": "string"}},
    }
    await define_event_type(box, "pet.adopted", description="A pet was adopted", schema=schema)
    await publish_one(box, "pet.adopted", {"petId": "p1"})
    with pytest.raises(InvalidMessage, match="petId"):
        await publish_one(box, "pet.adopted", {"petId": 7})
    await publish_one(box, "not.in.catalog", {"anything": True})
    with pytest.raises(InvalidMessage) as too_large:
        await publish_one(box, "x.y", {"blob": "x" * 4096})
    assert too_large.value.code == "too_large"
    with pytest.raises(InvalidMessage):
        await publish_one(box, "bad type with spaces")
    with pytest.raises(InvalidMessage):
        await define_event_type(box, "broken", schema={"type": "no-such-type"})


async def test_redeliver_recover_and_undelivered(
    box: Relaybox, clock: FrozenClock, dispatcher: Dispatcher
) -> None:
    async with HttpReceiver([Reply(400), Reply(400), Reply(200)]) as receiver:
        endpoint_id, _ = await endpoint(box, receiver.url)
        first = await publish_one(box)
        clock.advance(10)
        second = await publish_one(box)
        await dispatcher.run_once()
        undelivered = await list_deliveries(box, "t1", undelivered=True)
        assert {(d["message_id"], d["dead_reason"]) for d in undelivered} == {
            (first.id, "rejected"),
            (second.id, "rejected"),
        }
        assert await list_deliveries(box, "t2", undelivered=True) == []

        # Recover since the second message: only it goes again.
        assert await recover(box, endpoint_id, since=second.created_at, tenant="t1") == 1
        assert await recover(box, endpoint_id, since=0, tenant="t2") is None
        await dispatcher.run_once()
        assert [d["message_id"] for d in await list_deliveries(box, "t1", undelivered=True)] == [
            first.id
        ]
        # Redeliver the first, and the already-sent second one, by hand.
        assert await redeliver(box, first.id, tenant="t1") == 1
        assert await redeliver(box, second.id, tenant="t1") == 1
        assert await redeliver(box, second.id, tenant="t2") == 0
        await dispatcher.run_once()
        ids = [r.webhook_id for r in receiver.requests]
    assert ids.count(first.id) == 2 and ids.count(second.id) == 3
    assert await list_deliveries(box, "t1", undelivered=True) == []


async def test_disabling_kills_waiting_rows_and_enabling_lets_recover_resend(
    box: Relaybox, dispatcher: Dispatcher
) -> None:
    async with HttpReceiver() as receiver:
        endpoint_id, _ = await endpoint(box, receiver.url)
        message = await publish_one(box)
        await disable_endpoint(box, endpoint_id, tenant="t1")
        assert await dispatcher.run_once() == 0
        [row] = await outbox_rows(box)
        assert (row["status"], row["dead_reason"]) == ("dead", "endpoint_disabled")
        assert await redeliver(box, message.id, tenant="t1") == 0  # not to a disabled one
        await enable_endpoint(box, endpoint_id, tenant="t1")
        await enable_endpoint(box, endpoint_id, tenant="t1")  # on already: no second event
        assert await recover(box, endpoint_id, since=0, tenant="t1") == 1
        assert await dispatcher.run_once() == 1
        assert [r.webhook_id for r in receiver.requests] == [message.id]
    operational = await box.store.fetch_all(
        "SELECT event_type, body FROM relaybox_messages WHERE tenant = 'relaybox'"
    )
    types = sorted(m["event_type"] for m in operational)
    assert types == ["relaybox.endpoint.disabled", "relaybox.endpoint.enabled"]  # one each
    [enabled] = [
        json.loads(m["body"])["data"]
        for m in operational
        if m["event_type"] == "relaybox.endpoint.enabled"
    ]
    assert (enabled["endpointId"], enabled["tenant"], enabled["reason"]) == (
        endpoint_id,
        "t1",
        "manual",
    )
    assert enabled["wasDisabled"] == "manual"
