"""The petstore example: a client registers ``POST /api/v1/webhooks`` with
``url`` and ``events``; the store's own code publishes the six events in its
transactions; the client's receiver gets them signed, on SQLite and PostgreSQL. The
dispatcher is driven a step at a time and the outbox read with ``relaybox.testing``."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
import standardwebhooks
from examples.petstore import app as petstore

from relaybox import FrozenClock, PermanentError
from relaybox.outbound import create_api_key
from relaybox.testing import Harness
from tests.conftest import Served
from tests.support.outbound_app import local
from tests.support.receivers import HttpReceiver


@pytest.fixture
async def store(database_url: str, clock: FrozenClock) -> AsyncIterator[Harness]:
    clock.set(time.time())  # the client verifies the signature's timestamp on its own clock
    box = petstore.build(database_url, clock=clock)
    local(box)  # the client's receiver is a plain-HTTP server on this machine
    await petstore.setup(box)
    kit = Harness.of(box)
    yield kit
    await kit.close()


async def test_a_client_registers_and_receives_the_petstore_events(store: Harness) -> None:
    kit, box = store, store.box
    _, key = await create_api_key(box, "shop-1")
    async with (
        HttpReceiver() as client,
        Served(box.asgi(roles=("api",))) as api,
        aiohttp.ClientSession() as http,
    ):
        async with http.post(
            f"{api.url}/api/v1/webhooks",
            json={"url": client.url, "events": list(petstore.EVENT_TYPES)},
            headers={"Authorization": f"Bearer {key}"},
        ) as answer:
            assert answer.status == 201
            secret = (await answer.json())["secret"]

        await petstore.create_order(box, "shop-1", "order-789", "pet-1", 2500)
        await petstore.record_payment(box, "shop-1", "order-789", ok=True)
        await petstore.complete_order(box, "shop-1", "order-789", "user-456")
        await petstore.create_order(box, "shop-1", "order-790", "pet-2", 900)
        await petstore.record_payment(box, "shop-1", "order-790", ok=False, reason="declined")
        with pytest.raises(PermanentError):  # rolled back: no event for it
            await petstore.adopt_pet(box, "shop-1", "pet-1", "user-999")
        await petstore.create_order(box, "shop-2", "order-1", "pet-9", 100)  # another client

        # shop-2 has no endpoint: its event has no delivery; shop-1's nine are all due.
        assert await kit.deliveries(tenant="shop-2") == []
        assert len(await kit.deliveries(tenant="shop-1", status="pending")) == 9
        assert await kit.drain_dispatcher() == 9
        assert await kit.deliveries(status="pending") == []

        verifier = standardwebhooks.Webhook(secret)
        received = [verifier.verify(r.body, r.headers) for r in client.requests]
    assert sorted(e["type"] for e in received) == sorted(
        [
            "order.created",
            "pet.status_changed",  # pet-1: new -> pending
            "payment.succeeded",
            "order.completed",
            "pet.status_changed",  # pet-1: pending -> adopted
            "pet.adopted",
            "order.created",
            "pet.status_changed",  # pet-2: new -> pending
            "payment.failed",
        ]
    )
    adopted = next(e for e in received if e["type"] == "pet.adopted")
    assert adopted["data"]["petId"] == "pet-1" and adopted["data"]["orderId"] == "order-789"
    assert adopted["apiVersion"] == "v1"
    assert {e["id"] for e in received} == {r.webhook_id for r in client.requests}
    for event in received:  # one delivery per message, recorded as sent
        [sent] = await kit.deliveries(message_id=event["id"])
        assert (sent["status"], sent["tenant"]) == ("sent", "shop-1")
