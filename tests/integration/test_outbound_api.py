"""The tenant API (``/api/v1``) on a real uvicorn server, on SQLite and PostgreSQL:
keys, endpoints, the simple registration API ``POST /webhooks``, messages, redelivery, recovery."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import standardwebhooks

from relaybox import FrozenClock, Relaybox
from relaybox.outbound import create_api_key, define_event_type, revoke_api_key
from tests.conftest import Served
from tests.support.outbound_app import dispatch_once, local
from tests.support.receivers import HttpReceiver, Reply


class Api:
    """A tenant's client: JSON in, (status, JSON) out."""

    def __init__(self, http: aiohttp.ClientSession, base: str, key: str) -> None:
        self.http, self.base, self.key = http, base, key

    async def call(
        self, method: str, path: str, body: Any = None, **headers: str
    ) -> tuple[int, Any]:
        auth = {"Authorization": f"Bearer {self.key}", **headers}
        async with self.http.request(method, self.base + path, json=body, headers=auth) as r:
            return r.status, (await r.json() if r.status != 204 else None)


@pytest.fixture
async def server(box: Relaybox) -> AsyncIterator[str]:
    local(box)
    async with Served(box.asgi(roles=("api",))) as served:
        yield served.url + "/api/v1"


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
async def api(box: Relaybox, server: str, http: aiohttp.ClientSession) -> Api:
    _, key = await create_api_key(box, "client-42", "tests")
    return Api(http, server, key)


async def test_every_call_needs_a_valid_key(
    box: Relaybox, server: str, http: aiohttp.ClientSession
) -> None:
    key_id, key = await create_api_key(box, "client-42")
    for auth in ({}, {"Authorization": "Bearer rbk_wrong"}, {"Authorization": f"Basic {key}"}):
        async with http.get(server + "/endpoints", headers=auth) as r:
            assert r.status == 401
            assert (await r.json())["error"] == "unauthorized"
    ok = Api(http, server, key)
    assert (await ok.call("GET", "/endpoints"))[0] == 200
    assert await revoke_api_key(box, key_id)
    assert (await ok.call("GET", "/endpoints"))[0] == 401


async def test_endpoint_crud_is_scoped_to_the_tenant(
    box: Relaybox, api: Api, server: str, http: aiohttp.ClientSession
) -> None:
    status, created = await api.call(
        "POST",
        "/endpoints",
        {"url": "https://hooks.example.com/x", "event_types": ["pet.*"], "description": "pets"},
    )
    assert status == 201 and created["secret"].startswith("whsec_")
    endpoint_id = created["id"]
    assert created["enabled"] and created["max_in_flight"] == 4

    status, patched = await api.call(
        "PATCH",
        f"/endpoints/{endpoint_id}",
        {"event_types": ["order.*"], "timeout": 5, "rate_limit": 10, "enabled": False},
    )
    assert status == 200
    assert (patched["event_types"], patched["timeout"], patched["rate_limit"]) == (
        ["order.*"],
        5.0,
        10.0,
    )
    assert (patched["enabled"], patched["disabled_reason"]) == (False, "manual")
    assert patched["description"] == "pets"

    _, other_key = await create_api_key(box, "client-7")
    other = Api(http, server, other_key)
    assert (await other.call("GET", f"/endpoints/{endpoint_id}"))[0] == 404
    assert (await other.call("DELETE", f"/endpoints/{endpoint_id}"))[0] == 404
    assert (await other.call("GET", "/endpoints"))[1] == {"data": []}

    status, listed = await api.call("GET", "/endpoints")
    assert [e["id"] for e in listed["data"]] == [endpoint_id]
    assert (await api.call("DELETE", f"/endpoints/{endpoint_id}"))[0] == 204
    assert (await api.call("GET", f"/endpoints/{endpoint_id}"))[0] == 404


BAD_ENDPOINTS: list[tuple[dict[str, Any], str]] = [
    ({"url": "https://169.254.169.254/latest"}, "invalid_endpoint"),
    ({"url": "http://93.184.215.14/x"}, "invalid_endpoint"),  # plain http: loopback only
    ({"url": "https://2130706433/"}, "invalid_endpoint"),
    ({"url": "https://ok.example/x", "timeout": 600}, "invalid_endpoint"),
    ({"url": "https://ok.example/x", "event_types": []}, "invalid_request"),
    ({"url": "https://ok.example/x", "colour": "blue"}, "invalid_request"),
]


async def test_bad_endpoints_are_refused(api: Api) -> None:
    for body, error in BAD_ENDPOINTS:
        status, answer = await api.call("POST", "/endpoints", body)
        assert (status, answer["error"]) == (422, error), body
    status, answer = await api.call("POST", "/endpoints", None)
    assert (status, answer["error"]) == (422, "invalid_request")
    assert (await api.call("GET", "/endpoints"))[1] == {"data": []}


async def test_simple_registration_flow_register_publish_deliver_redeliver(
    box: Relaybox, clock: FrozenClock, api: Api
) -> None:
    clock.set(time.time())
    await define_event_type(box, "pet.adopted", schema={"type": "object", "required": ["petId"]})
    async with HttpReceiver() as receiver:
        status, hook = await api.call(
            "POST", "/webhooks", {"url": receiver.url, "events": ["pet.adopted"]}
        )
        assert status == 201 and hook["events"] == ["pet.adopted"]

        status, bad = await api.call("POST", "/messages", {"event_type": "pet.adopted", "data": {}})
        assert (status, bad["error"]) == (422, "invalid_schema")
        body = {"event_type": "pet.adopted", "data": {"petId": "019b4132", "userId": "user-456"}}
        status, message = await api.call("POST", "/messages", body, **{"Idempotency-Key": "a-1"})
        assert status == 202
        status, again = await api.call("POST", "/messages", body, **{"Idempotency-Key": "a-1"})
        assert (status, again["id"]) == (200, message["id"])

        assert await dispatch_once(box) == 1
        [seen] = receiver.requests
        standardwebhooks.Webhook(hook["secret"]).verify(seen.body, seen.headers)
        assert seen.webhook_id == message["id"]

        status, shown = await api.call("GET", f"/messages/{message['id']}")
        assert [d["status"] for d in shown["deliveries"]] == ["sent"]
        assert shown["payload"]["data"]["petId"] == "019b4132"
        _, tried = await api.call("GET", f"/messages/{message['id']}/attempts")
        assert [(a["outcome"], a["status_code"]) for a in tried["data"]] == [("sent", 200)]

        status, redone = await api.call("POST", f"/messages/{message['id']}/redeliver")
        assert (status, redone) == (202, {"redelivered": 1})
        await dispatch_once(box)
        assert [r.webhook_id for r in receiver.requests] == [message["id"]] * 2

        _, listed = await api.call("GET", "/messages?event_type=pet.adopted&limit=10")
        assert [m["id"] for m in listed["data"]] == [message["id"]]
        _, catalog = await api.call("GET", "/event-types")
        assert catalog["data"][0]["name"] == "pet.adopted"


async def test_rotate_test_event_undelivered_and_recover(
    box: Relaybox, clock: FrozenClock, api: Api
) -> None:
    clock.set(time.time())
    async with HttpReceiver([Reply(400), Reply(200)]) as receiver:
        _, created = await api.call("POST", "/endpoints", {"url": receiver.url})
        endpoint_id, old = created["id"], created["secret"]
        status, rotated = await api.call(
            "POST", f"/endpoints/{endpoint_id}/secret/rotate", {"grace_seconds": 60}
        )
        assert status == 201
        _, secrets = await api.call("GET", f"/endpoints/{endpoint_id}/secret")
        assert [s["secret"] for s in secrets["data"]] == [rotated["secret"], old]

        status, test = await api.call("POST", f"/endpoints/{endpoint_id}/test")
        assert status == 202 and test["event_type"] == "relaybox.test"
        await dispatch_once(box)  # 400: dead
        _, undelivered = await api.call("GET", "/undelivered")
        assert [(d["message_id"], d["dead_reason"]) for d in undelivered["data"]] == [
            (test["id"], "rejected")
        ]
        status, recovered = await api.call(
            "POST", f"/endpoints/{endpoint_id}/recover", {"since": "2000-01-01T00:00:00Z"}
        )
        assert (status, recovered) == (202, {"recovered": 1})
        await dispatch_once(box)
        second = receiver.requests[1]
        for secret in (old, rotated["secret"]):
            standardwebhooks.Webhook(secret).verify(second.body, second.headers)
        _, undelivered = await api.call("GET", "/undelivered")
        assert undelivered["data"] == []


async def test_sha256_signatures_need_an_hmac_secret(api: Api) -> None:
    body = {"url": "https://ok.example/x", "signature": "sha256", "secret_type": "ed25519"}
    assert (await api.call("POST", "/endpoints", body))[0] == 422
    _, created = await api.call("POST", "/endpoints", {**body, "signature": "standard"})
    status, answer = await api.call("PATCH", f"/endpoints/{created['id']}", {"signature": "sha256"})
    assert (status, answer["error"]) == (422, "invalid_endpoint")
