"""Ordered delivery through each surface, on SQLite and PostgreSQL: the tenant API
(``ordered``, ``on_dead``, ``ordering_key``; 422 for bad values), the admin API
(an endpoint's blocked keys, setEndpointOrdering, releaseOrderingKey) and the CLI
(``endpoints update --ordered``, ``messages publish --ordering-key``,
``endpoints blocked-keys``, ``endpoints release-key``), with a dead head made by real
failed deliveries to a local receiver."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
import pytest
from click.testing import CliRunner
from starlette.applications import Starlette
from starlette.routing import Mount

from relaybox import FrozenClock, Relaybox
from relaybox.admin import build_admin
from relaybox.cli import main
from relaybox.config import Settings
from relaybox.outbound import create_api_key
from tests.conftest import KEYED, Served
from tests.support.outbound_app import dispatch_once, endpoint, local, outbox_rows, publish_one
from tests.support.receivers import HttpReceiver, Reply, Seen

TOKEN = "test-admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
APP = "tests.support.outbound_app:box"


@pytest.fixture
async def box(database_url: str, clock: FrozenClock) -> AsyncIterator[Relaybox]:
    b = Relaybox(
        settings=Settings(database_url=database_url, outbound=KEYED, admin_token=TOKEN),
        clock=clock,
    )
    local(b)
    yield b
    await b.close()


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, database_url: str) -> Any:
    for key in list(os.environ):
        if key.startswith("RELAYBOX_") and not key.startswith("RELAYBOX_TEST_"):
            monkeypatch.delenv(key)
    runner = CliRunner()

    def invoke(*args: str, code: int = 0) -> str:
        result = runner.invoke(
            main, [*args, "--app", APP, "--database-url", database_url], prog_name="relaybox"
        )
        assert result.exit_code == code, (result.output, result.exception)
        return result.stdout

    async def in_thread(*args: str, code: int = 0) -> str:
        """The command runs its own event loop: off this test's loop, in a thread."""
        return await asyncio.to_thread(invoke, *args, code=code)

    return in_thread


async def test_tenant_api_ordered_endpoint_and_keyed_message(box: Relaybox) -> None:
    _, key = await create_api_key(box, "client-42", "tests")
    auth = {"Authorization": f"Bearer {key}"}
    async with (
        Served(box.asgi(roles=("api",))) as served,
        aiohttp.ClientSession(served.url + "/api/v1/", headers=auth) as http,
    ):

        async def call(method: str, path: str, body: Any) -> tuple[int, Any]:
            async with http.request(method, path, json=body) as r:
                return r.status, await r.json()

        status, created = await call(
            "POST",
            "endpoints",
            {"url": "https://hooks.example.com/x", "ordered": True, "on_dead": "skip"},
        )
        assert status == 201, created
        assert (created["ordered"], created["on_dead"]) == (True, "skip")
        status, patched = await call("PATCH", f"endpoints/{created['id']}", {"on_dead": "hold"})
        assert status == 200 and (patched["ordered"], patched["on_dead"]) == (True, "hold")
        status, patched = await call("PATCH", f"endpoints/{created['id']}", {"ordered": False})
        assert status == 200 and (patched["ordered"], patched["on_dead"]) == (False, "hold")
        for bad in ({"on_dead": "maybe"}, {"ordered": "sometimes"}):
            status, answer = await call("PATCH", f"endpoints/{created['id']}", bad)
            assert status == 422, answer

        first = await call("POST", "messages", {"event_type": "a.b", "ordering_key": "o-1"})
        second = await call("POST", "messages", {"event_type": "a.b", "ordering_key": "o-1"})
        assert (first[0], second[0]) == (202, 202)
        assert [m["sequence"] for m in (first[1], second[1])] == [1, 2]
        assert second[1]["ordering_key"] == "o-1"
        assert second[1]["payload"]["orderingKey"] == "o-1"
        assert second[1]["payload"]["sequence"] == 2
        for bad_key in ("", "x" * 257, "a\x00b", 5):
            status, answer = await call(
                "POST", "messages", {"event_type": "a.b", "ordering_key": bad_key}
            )
            assert status == 422, answer


async def test_admin_and_cli_show_set_and_release_a_held_key(box: Relaybox, cli: Any) -> None:
    def reply(seen: Seen) -> Reply:
        envelope = json.loads(seen.body)
        return (
            Reply(500) if (envelope["orderingKey"], envelope["sequence"]) == ("k", 1) else Reply()
        )

    admin = Starlette(routes=[Mount("/admin", app=build_admin(box))])
    async with (
        HttpReceiver(reply) as receiver,
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=admin), base_url="http://admin.test", headers=AUTH
        ) as client,
    ):
        eid, _ = await endpoint(box, receiver.url, schedule=[0.0])
        api = f"/admin/api/v1/endpoints/{eid}"
        # An operator switches ordering on (admin API), then the CLI sets on_dead.
        r = await client.post(api + "/ordering", json={"ordered": True, "reason": "ledger"})
        assert r.status_code == 200 and r.json()["ordered"] is True, r.text
        assert (await client.post(api + "/ordering", json={"reason": "x"})).status_code == 400
        missing = "/admin/api/v1/endpoints/ep_nope/ordering"
        assert (
            await client.post(missing, json={"ordered": True, "reason": "x"})
        ).status_code == 404
        shown = json.loads(await cli("endpoints", "update", eid, "--ordered", "--on-dead", "hold"))
        assert (shown["ordered"], shown["on_dead"]) == (True, "hold")

        await cli(
            "messages", "publish", "--tenant", "t1", "--type", "pet.adopted", "--ordering-key", "k"
        )
        await publish_one(box, ordering_key="k")
        await publish_one(box, ordering_key="other")
        for _ in range(4):  # k1 fails twice (dead); "other" goes; k2 waits
            await dispatch_once(box)
        keys = sorted(json.loads(s.body)["orderingKey"] for s in receiver.requests)
        assert keys == ["k", "k", "other"]
        assert [r["status"] for r in await outbox_rows(box)] == ["dead", "pending", "sent"]

        detail = (await client.get(api)).json()
        assert (detail["ordered"], detail["on_dead"]) == (True, "hold")
        assert detail["blocked_keys"] == [
            {"ordering_key": "k", "sequence": 1, "dead": 1, "waiting": 1}
        ]
        scraped = (await box.metrics.scrape(box)).decode()
        assert "\nrelaybox_outbound_blocked_keys 1.0\n" in scraped
        await client.post("/admin/login", data={"token": TOKEN, "next": "/admin/"})
        page = (await client.get(f"/admin/endpoints/{eid}")).text
        assert "ordered per key" in page and "data-blocked-keys" in page
        assert "<code>k</code>" in page
        listed = json.loads(await cli("endpoints", "blocked-keys", "--json"))["items"]
        assert [(b["endpoint_id"], b["ordering_key"]) for b in listed] == [(eid, "k")]
        assert "k" in await cli("endpoints", "blocked-keys", eid)

        body = {"ordering_key": "k", "reason": "refunded by hand"}
        released = await client.post(api + "/release-key", json=body)
        assert released.status_code == 200 and released.json()["released"] == 1, released.text
        again = await client.post(api + "/release-key", json=body)
        assert again.status_code == 409 and again.json()["error"] == "key_not_held", again.text
        await cli("endpoints", "release-key", eid, "k", "--reason", "again", code=1)
        assert (await client.get(api)).json()["blocked_keys"] == []
        for _ in range(30):  # a scrape reuses a snapshot up to 1 s old
            scraped = (await box.metrics.scrape(box)).decode()
            if "\nrelaybox_outbound_blocked_keys 0.0\n" in scraped:
                break
            await asyncio.sleep(0.1)
        assert "\nrelaybox_outbound_blocked_keys 0.0\n" in scraped

        await dispatch_once(box)  # k2 goes now
        statuses = [r["status"] for r in await outbox_rows(box)]
        assert statuses == ["dead", "sent", "sent"]
