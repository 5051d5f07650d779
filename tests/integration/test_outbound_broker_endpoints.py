"""A tenant routes an endpoint to an operator's broker destination by name
(``"url": "broker:<name>"``) through the tenant API, on SQLite and PostgreSQL: the
published envelope, with its tenant, lands in the configured Redis stream under the
delivery's stable key; an unknown name, anything naming a host, or a destination that
does not grant the tenant (``tenants``) is a 422, in the tenant API, the portal and for
the operator alike; a grant revoked later stops the deliveries as ``blocked``."""

from __future__ import annotations

import html
import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aredis

from relaybox import Relaybox
from relaybox.outbound import EndpointSpec, configure, create_api_key, create_endpoint
from relaybox.outbound.endpoints import InvalidEndpoint
from tests.conftest import Served
from tests.integration.test_portal import portal_for
from tests.support.outbound_app import dispatch_once, endpoint, local, outbox_rows, publish_one

REDIS = ("127.0.0.1", 6379)
GRANT_SETTING = "outbound.brokers.<name>.tenants"


@pytest.fixture
async def stream() -> AsyncIterator[tuple[str, aredis.Redis]]:
    name = f"relaybox-test-{uuid.uuid4().hex[:12]}"
    client = aredis.Redis(host=REDIS[0], port=REDIS[1], socket_timeout=5)
    try:
        yield name, client
    finally:
        await client.delete(name)
        await client.aclose()


def _redis(stream: str, **more: Any) -> dict[str, Any]:
    return {"kind": "redis", "url": f"redis://{REDIS[0]}:{REDIS[1]}/0", "stream": stream, **more}


class TenantApi:
    def __init__(self, http: aiohttp.ClientSession, base: str, key: str) -> None:
        self.http, self.base = http, base
        self.auth = {"Authorization": f"Bearer {key}"}

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        async with self.http.request(method, self.base + path, json=body, headers=self.auth) as r:
            return r.status, await r.json()


async def test_a_tenant_routes_an_endpoint_to_a_broker_by_name(
    box: Relaybox, stream: tuple[str, aredis.Redis]
) -> None:
    name, client = stream
    local(box)
    configure(box, brokers={"feed": _redis(name, tenants=["client-42"])})
    _, key = await create_api_key(box, "client-42", "tests")
    async with (
        Served(box.asgi(roles=("api",))) as served,
        aiohttp.ClientSession() as http,
    ):
        api = TenantApi(http, served.url + "/api/v1/", key)
        for url in ("broker:nope", "broker:", "broker:redis://127.0.0.1:6379/0", "redis://x"):
            status, answer = await api.call("POST", "endpoints", {"url": url})
            assert status == 422, (url, answer)
        status, created = await api.call("POST", "endpoints", {"url": "broker:feed"})
        assert status == 201, created
        status, moved = await api.call(
            "PATCH", f"endpoints/{created['id']}", {"url": "broker:nope"}
        )
        assert status == 422, moved
        status, message = await api.call(
            "POST", "messages", {"event_type": "order.paid", "data": {"orderId": "o-1"}}
        )
        assert status == 202, message

        assert await dispatch_once(box) == 1
        [row] = await outbox_rows(box)
        assert row["status"] == "sent", row
        entries = await client.xrange(name)
        [(_, fields)] = entries
        # the delivery's stable key: <message id>:<endpoint id>
        assert fields[b"id"].decode() == row["key"] == f"{message['id']}:{created['id']}"
        assert fields[b"tenant"] == b"client-42"
        envelope = json.loads(fields[b"body"])
        assert envelope["id"] == message["id"] and envelope["data"] == {"orderId": "o-1"}
        assert envelope["tenant"] == "client-42"

        # The tenant API names the way out: the broker's name and kind, not "webhook".
        status, shown = await api.call("GET", f"messages/{message['id']}")
        assert status == 200, shown
        [delivery] = shown["deliveries"]
        assert (delivery["channel"], delivery["kind"]) == ("feed", "redis"), delivery
        status, listed = await api.call("GET", f"endpoints/{created['id']}/deliveries")
        assert [(d["channel"], d["kind"]) for d in listed["data"]] == [("feed", "redis")]


async def test_a_broker_takes_the_endpoints_of_the_tenants_it_grants_only(
    box: Relaybox, stream: tuple[str, aredis.Redis]
) -> None:
    name, _ = stream
    local(box)
    configure(
        box,
        brokers={
            "feed": _redis(name, tenants=["client-42"]),
            "audit": _redis(name),  # the default: no tenant (handlers only)
            "open": _redis(name, tenants=["*"]),
        },
    )
    _, mine = await create_api_key(box, "client-42", "tests")
    _, theirs = await create_api_key(box, "intruder", "tests")
    async with (
        Served(box.asgi(roles=("api",))) as served,
        aiohttp.ClientSession() as http,
    ):
        granted = TenantApi(http, served.url + "/api/v1/", mine)
        intruder = TenantApi(http, served.url + "/api/v1/", theirs)

        refusals = {}
        for api, url in [
            (intruder, "broker:feed"),
            (intruder, "broker:audit"),
            (intruder, "broker:nope"),
            (granted, "broker:audit"),
        ]:
            status, answer = await api.call("POST", "endpoints", {"url": url})
            assert status == 422 and answer["error"] == "invalid_endpoint", answer
            assert GRANT_SETTING in answer["message"], answer
            refusals[url] = answer["message"]
        # A name the operator has and one it has not get the same answer.
        assert refusals["broker:feed"].replace("feed", "nope") == refusals["broker:nope"]
        status, _ = await intruder.call("POST", "webhooks", {"url": "broker:feed"})
        assert status == 422
        status, opened = await intruder.call("POST", "endpoints", {"url": "broker:open"})
        assert status == 201, opened
        status, moved = await intruder.call(
            "PATCH", f"endpoints/{opened['id']}", {"url": "broker:feed"}
        )
        assert status == 422 and GRANT_SETTING in moved["message"], moved
        status, created = await granted.call("POST", "endpoints", {"url": "broker:feed"})
        assert status == 201, created

        # The portal's forms: the same rule, a 422 page, nothing stored.
        portal = await portal_for(box, http, served.url, "intruder")
        status, _, text = await portal.post("/endpoints", {"url": "broker:feed"})
        assert status == 422 and GRANT_SETTING in html.unescape(text)
        status, _, text = await portal.post(f"/endpoints/{opened['id']}", {"url": "broker:feed"})
        assert status == 422 and GRANT_SETTING in html.unescape(text)
        status, listed = await intruder.call("GET", "endpoints")
        assert [e["url"] for e in listed["data"]] == ["broker:open"]

    # The operator (admin API, dashboard, CLI: create_endpoint) is held to the grant
    # too: the endpoint would be the tenant's, and its deliveries would be blocked.
    with pytest.raises(InvalidEndpoint, match=r"outbound\.brokers\.<name>\.tenants"):
        await create_endpoint(box, "intruder", EndpointSpec(url="broker:audit"))


async def test_a_grant_revoked_later_blocks_the_deliveries_and_handlers_go_on(
    box: Relaybox, stream: tuple[str, aredis.Redis]
) -> None:
    name, client = stream
    local(box)
    configure(box, brokers={"feed": _redis(name, tenants=["client-42"])})
    endpoint_id, _ = await endpoint(box, "broker:feed", tenant="client-42")
    first = await publish_one(box, "order.paid", tenant="client-42")
    assert await dispatch_once(box) == 1

    configure(box, brokers={"feed": _redis(name)})  # the grant is revoked
    second = await publish_one(box, "order.paid", tenant="client-42")
    async with box.store.transaction() as conn:  # a handler's row, with an event's tenant
        await box.store.inbox.outbox_insert(
            conn,
            channel="feed",
            key="handler-1",
            payload=json.dumps({"order": 1}),
            tenant="client-42",
            inbox_id=None,
            now=box.clock.now(),
        )
    assert await dispatch_once(box) == 2
    rows = {r["key"]: r for r in await outbox_rows(box)}
    assert rows[f"{first.id}:{endpoint_id}"]["status"] == "sent"
    blocked = rows[f"{second.id}:{endpoint_id}"]
    assert (blocked["status"], blocked["dead_reason"]) == ("dead", "blocked"), blocked
    assert "not granted to tenant 'client-42'" in blocked["last_error"], blocked
    assert "outbound.brokers.feed.tenants" in blocked["last_error"], blocked
    assert rows["handler-1"]["status"] == "sent"  # the operator's own rows: no grant needed

    entries = [fields for _, fields in await client.xrange(name)]
    assert [f[b"id"].decode() for f in entries] == [f"{first.id}:{endpoint_id}", "handler-1"]
    assert b"tenant" not in entries[1]  # a handler's row is the operator's: no tenant mark
