"""A tenant routes an endpoint to an operator's broker destination by name
(``"url": "broker:<name>"``) through the tenant API, on SQLite and PostgreSQL: the
published envelope lands in the configured Redis stream under the delivery's stable
key; an unknown name, or anything naming a host, is a 422."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aredis

from relaybox import Relaybox
from relaybox.outbound import configure, create_api_key
from tests.conftest import Served
from tests.support.outbound_app import dispatch_once, local, outbox_rows

REDIS = ("127.0.0.1", 6379)


@pytest.fixture
async def stream() -> AsyncIterator[tuple[str, aredis.Redis]]:
    name = f"relaybox-test-{uuid.uuid4().hex[:12]}"
    client = aredis.Redis(host=REDIS[0], port=REDIS[1], socket_timeout=5)
    try:
        yield name, client
    finally:
        await client.delete(name)
        await client.aclose()


async def test_a_tenant_routes_an_endpoint_to_a_broker_by_name(
    box: Relaybox, stream: tuple[str, aredis.Redis]
) -> None:
    name, client = stream
    local(box)
    configure(box, brokers={"feed": {"kind": "redis", "url": "redis://127.0.0.1:6379/0",
                                     "stream": name}})  # fmt: skip
    _, key = await create_api_key(box, "client-42", "tests")
    auth = {"Authorization": f"Bearer {key}"}
    async with (
        Served(box.asgi(roles=("api",))) as served,
        aiohttp.ClientSession(served.url + "/api/v1/", headers=auth) as http,
    ):

        async def call(method: str, path: str, body: Any) -> tuple[int, Any]:
            async with http.request(method, path, json=body) as r:
                return r.status, await r.json()

        for url in ("broker:nope", "broker:", "broker:redis://127.0.0.1:6379/0", "redis://x"):
            status, answer = await call("POST", "endpoints", {"url": url})
            assert status == 422, (url, answer)
        status, created = await call("POST", "endpoints", {"url": "broker:feed"})
        assert status == 201, created
        status, moved = await call("PATCH", f"endpoints/{created['id']}", {"url": "broker:nope"})
        assert status == 422, moved
        status, message = await call(
            "POST", "messages", {"event_type": "order.paid", "data": {"orderId": "o-1"}}
        )
        assert status == 202, message

    assert await dispatch_once(box) == 1
    [row] = await outbox_rows(box)
    assert row["status"] == "sent", row
    entries = await client.xrange(name)
    [(_, fields)] = entries
    assert fields[b"id"].decode() == row["key"]  # the delivery's stable key
    envelope = json.loads(fields[b"body"])
    assert envelope["id"] == message["id"] and envelope["data"] == {"orderId": "o-1"}
