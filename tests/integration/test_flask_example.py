"""The Flask example (examples/flask_shop), on SQLite and PostgreSQL: an order that
completes publishes with the request's ``Session`` and its webhook is delivered
signed; an order whose stock runs out after publishing rolls back with its message;
a Stripe delivery to relaybox's receiver (served over HTTP as ``relaybox serve``
serves it) grants credits once through the shop's plain ``def`` handler."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import standardwebhooks
from examples.flask_shop.app import Shop, make_shop
from flask.testing import FlaskClient

from relaybox.outbound import Dispatcher
from tests.conftest import Served
from tests.support.faultapp import invoice_paid
from tests.support.outbound_app import endpoint, local, outbox_rows
from tests.support.receivers import HttpReceiver


@pytest.fixture
async def shop(database_url: str) -> AsyncIterator[Shop]:
    s = make_shop(database_url)
    await s.box.migrate()  # applied already: the fixture's database is migrated
    s.create_tables()
    local(s.box)  # a customer endpoint on 127.0.0.1, for the test
    yield s
    await s.box.close()
    s.engine.dispose()


@pytest.fixture
def client(shop: Shop) -> FlaskClient:
    return shop.app.test_client()


@pytest.fixture
async def dispatcher(shop: Shop) -> AsyncIterator[Dispatcher]:
    d = shop.box.dispatcher()
    yield d
    await d.close()


async def test_a_completed_order_publishes_with_its_session(
    shop: Shop, client: FlaskClient, dispatcher: Dispatcher
) -> None:
    async with HttpReceiver() as receiver:
        _, secret = await endpoint(shop.box, receiver.url, tenant="shop-1")
        assert client.post("/stock/mug/5").status_code == 200
        assert client.post("/orders/o_1/shop-1/mug/2").status_code == 201
        done = client.post("/orders/o_1/complete")
        assert done.status_code == 200, done.text
        message_id = done.json["message"]  # type: ignore[index]
        assert await dispatcher.run_once() == 1
        [seen] = receiver.requests
    payload = standardwebhooks.Webhook(secret).verify(seen.body, seen.headers)
    assert payload["id"] == message_id
    assert payload["data"] == {"orderId": "o_1", "product": "mug", "quantity": 2}
    [row] = await outbox_rows(shop.box)
    assert row["status"] == "sent"
    # Completing again publishes nothing new: the idempotency key names the message.
    again = client.post("/orders/o_1/complete")
    assert again.json["message"] == message_id  # type: ignore[index]
    assert len(await outbox_rows(shop.box)) == 1


async def test_an_order_out_of_stock_rolls_back_with_its_message(
    shop: Shop, client: FlaskClient, dispatcher: Dispatcher
) -> None:
    await endpoint(shop.box, "http://127.0.0.1:9/hook", tenant="shop-1")
    client.post("/stock/mug/1")
    client.post("/orders/o_2/shop-1/mug/3")
    refused = client.post("/orders/o_2/complete")
    assert refused.status_code == 409
    assert "not enough in stock" in refused.json["error"]  # type: ignore[index]
    assert await shop.box.store.fetch_all("SELECT id FROM relaybox_messages") == []
    assert await outbox_rows(shop.box) == []
    assert await dispatcher.run_once() == 0
    [order] = await shop.box.store.fetch_all("SELECT status FROM flask_orders")
    assert order == {"status": "open"}


async def test_stripe_deliveries_grant_credits_once_through_the_sync_handler(
    shop: Shop, client: FlaskClient
) -> None:
    box = shop.box
    async with Served(box.asgi(roles=("receiver",))) as server, aiohttp.ClientSession() as http:

        async def send(event: dict[str, Any]) -> str:
            body = json.dumps(event, separators=(",", ":")).encode()
            headers = box.sources["stripe"].sign(
                body, event_id=event["id"], event_type=event["type"], now=time.time()
            )
            headers["content-type"] = "application/json"
            url = server.url + "/webhooks/stripe"
            async with http.post(url, data=body, headers=headers) as response:
                assert response.status == 200, await response.text()
                return str((await response.json())["status"])

        paid = invoice_paid("evt_1", "in_1", account="acct_shop")
        assert await send(paid) == "accepted"
        assert await send(paid) == "duplicate"
        assert await send(invoice_paid("evt_2", "in_1", account="acct_shop")) == "accepted"
    assert await box.worker().run_once() == 2
    assert client.get("/credits/workspace_1").json == {"workspace": "workspace_1", "credits": 100}
    statuses = await box.store.fetch_all("SELECT status FROM relaybox_inbox")
    assert statuses == [{"status": "done"}] * 2
