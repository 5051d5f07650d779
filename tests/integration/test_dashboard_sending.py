"""The dashboard's sending views over real HTTP, on SQLite and PostgreSQL: endpoint
create, edit, rotate and test event; the delivery log's filters (status, tenant, type,
time in the CLI's grammar, message id, idempotency key) and its attempts-per-minute
chart; a message's attempts with request and response headers."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from relaybox import Relaybox
from relaybox.config import Settings
from tests.conftest import KEYED, Served
from tests.integration.test_admin_api import TOKEN
from tests.support.outbound_app import dispatch_once, local, publish_one
from tests.support.receivers import HttpReceiver, Reply


@pytest.fixture
async def admin(database_url: str) -> AsyncIterator[tuple[Relaybox, str, Any]]:
    box = Relaybox(settings=Settings(database_url=database_url, admin_token=TOKEN, outbound=KEYED))
    local(box)
    async with (
        Served(box.asgi(roles=("admin",))) as served,
        aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http,
    ):
        async with http.post(
            served.url + "/admin/login", data={"token": TOKEN, "next": "/admin/"}
        ) as r:
            assert r.status == 200
        yield box, served.url + "/admin", http
    await box.close()


async def csrf_of(http: Any, url: str) -> str:
    async with http.get(url) as r:
        match = re.search(r'name="csrf" value="([0-9a-f]+)"', await r.text())
    assert match
    return match.group(1)


async def test_endpoint_create_edit_rotate_test_and_the_log(admin: Any) -> None:
    box, base, http = admin
    csrf = await csrf_of(http, base + "/endpoints")
    sink = HttpReceiver(Reply(200, b"thanks"))
    async with sink:
        form = {"csrf": csrf, "tenant": "shop-1", "url": sink.url, "event_types": "order.*"}
        async with http.post(base + "/endpoints/new", data=form) as r:
            text = await r.text()
            assert r.status == 200 and "whsec_" in text
        [endpoint_id] = set(re.findall(r"ep_[0-9a-f]{27}", text))
        bad = {"csrf": csrf, "tenant": "shop-1", "url": "ftp://nope"}
        async with http.post(base + "/endpoints/new", data=bad) as r:
            assert r.status == 422
        async with http.post(base + "/endpoints/new", data={**form, "csrf": "0" * 64}) as r:
            assert r.status == 403

        edit = {"csrf": csrf, "back": f"/admin/endpoints/{endpoint_id}", "description": "orders"}
        async with http.post(
            f"{base}/endpoints/{endpoint_id}/edit", data={**edit, "event_types": "order.* x.*"}
        ) as r:
            assert r.status == 200 and "The endpoint was saved." in await r.text()
        found = await box.store.outbox.endpoint_get(endpoint_id, "shop-1")
        assert found.description == "orders" and found.event_types == ["order.*", "x.*"]

        async with http.post(f"{base}/endpoints/{endpoint_id}/rotate", data={"csrf": csrf}) as r:
            assert r.status == 200 and "Secret rotated" in await r.text()
        async with http.post(
            f"{base}/endpoints/{endpoint_id}/test", data={"csrf": csrf}, allow_redirects=False
        ) as r:
            assert r.status == 303
            message_id = r.headers["location"].rsplit("/", 1)[1]
        assert await dispatch_once(box) == 1
        async with http.get(f"{base}/messages/{message_id}") as r:
            page = await r.text()
        request, response = page.split('class="request"')[1].split('class="response"')
        assert "webhook-signature: v1," in request and "relaybox test event" in request
        assert "Content-Length: 6" in response and "thanks" in response

        keyed = await publish_one(box, "order.paid", tenant="shop-1", idempotency_key="k-9")
        other = await publish_one(box, "order.paid", tenant="shop-2")

        async def log(**query: str) -> str:
            async with http.get(base + "/deliveries", params=query) as r:
                assert r.status == 200, await r.text()
                return await r.text()

        everything = await log()
        assert message_id in everything and keyed.id in everything
        assert "<svg" in everything and 'data-kind="sent"' in everything
        assert message_id in await log(status="sent")
        assert message_id not in await log(status="pending")
        assert keyed.id in await log(status="pending", tenant="shop-1")
        assert keyed.id not in await log(tenant="shop-2") and other.id not in everything
        assert keyed.id in await log(q="k-9") and message_id not in await log(q="k-9")
        assert message_id in await log(q=message_id) and keyed.id not in await log(q=message_id)
        # Keys as typed, as the portal and the tenant API match them; a key that looks
        # like a message id is still found as a key.
        spaced = await publish_one(box, "order.paid", tenant="shop-1", idempotency_key=" k-9")
        id_like = await publish_one(box, "order.paid", tenant="shop-1", idempotency_key="msg_o7")
        assert spaced.id in await log(q=" k-9") and keyed.id not in await log(q=" k-9")
        assert spaced.id not in await log(q="k-9") and spaced.id not in await log(q="K-9")
        assert id_like.id in await log(q="msg_o7") and keyed.id not in await log(q="msg_o7")
        assert message_id in await log(q=f" {message_id} ")  # an id pasted with spaces
        assert keyed.id in await log(type="order.paid") and message_id not in await log(
            type="order.paid"
        )
        assert keyed.id in await log(since="1h") and keyed.id not in await log(until="1h")
        async with http.get(base + "/deliveries", params={"since": "last tuesday"}) as r:
            assert r.status == 400
        async with http.get(base + "/deliveries", params={"status": "nope"}) as r:
            assert r.status == 400
