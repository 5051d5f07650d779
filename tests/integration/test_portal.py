"""The tenant portal over real HTTP, on SQLite and PostgreSQL: links and sessions
(signature, expiry of both), the API that makes links, CSRF on every form, the pages
and actions, and strict tenant isolation: every route of tenant A's portal answers
404 for tenant B's endpoint, message and attempt ids."""

from __future__ import annotations

import asyncio
import html
import re
from collections.abc import AsyncIterator
from html.parser import HTMLParser

import aiohttp
import pytest

from relaybox import FrozenClock, Relaybox
from relaybox.outbound import create_api_key, define_event_type, endpoints, revoke_api_key
from relaybox.portal import TokenRefused, open_link, portal_link
from tests.conftest import Served
from tests.support.outbound_app import dispatch_once, endpoint, local, publish_one
from tests.support.receivers import HttpReceiver, Reply


class Portal:
    """One tenant's browser: follows the link, keeps the session's address and CSRF token."""

    def __init__(self, http: aiohttp.ClientSession, server: str) -> None:
        self.http, self.server = http, server
        self.base = ""
        self.csrf = ""

    async def enter(self, url: str) -> None:
        async with self.http.get(url, allow_redirects=False) as r:
            assert r.status == 303, await r.text()
            location = r.headers["location"]
        self.base = location.rsplit("/endpoints", 1)[0]
        status, text = await self.get("/endpoints")
        assert status == 200, text
        match = re.search(r'name="csrf" value="([0-9a-f]+)"', text)
        assert match
        self.csrf = match.group(1)

    async def get(self, path: str, **params: str) -> tuple[int, str]:
        async with self.http.get(self.server + self.base + path, params=params) as r:
            return r.status, await r.text()

    async def post(
        self, path: str, data: dict[str, str] | None = None, *, csrf: bool = True
    ) -> tuple[int, str, str]:
        form = {**(data or {}), **({"csrf": self.csrf} if csrf else {})}
        async with self.http.post(
            self.server + self.base + path, data=form, allow_redirects=False
        ) as r:
            return r.status, r.headers.get("location", ""), await r.text()


@pytest.fixture
async def server(box: Relaybox) -> AsyncIterator[str]:
    local(box)
    async with Served(box.asgi(roles=("api",))) as served:
        yield served.url


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def portal_for(
    box: Relaybox, http: aiohttp.ClientSession, server: str, tenant: str
) -> Portal:
    portal = Portal(http, server)
    await portal.enter(server + portal_link(box, tenant).url)
    return portal


def ids_in(text: str, prefix: str) -> set[str]:
    return set(re.findall(rf"\b{prefix}_[0-9a-f]{{27}}\b", text))


async def test_links_are_signed_for_one_tenant_and_expire(
    box: Relaybox, clock: FrozenClock
) -> None:
    local(box)
    link = portal_link(box, "client-42", ttl=60)
    assert link.expires_at == clock.now() + 60 and not link.single_use
    token = link.url.rsplit("/", 1)[1]
    session = await open_link(box, token)
    assert session.tenant == "client-42" and session.key_id is None
    assert (await open_link(box, token)).tenant == "client-42"  # not single-use: again
    forged = token.replace("l.", "s.", 1)
    with pytest.raises(TokenRefused):
        await open_link(box, forged)  # a link is not a session, and the signature covers it
    kind, tenant, expires, nonce, key, sig = token.split(".")
    with pytest.raises(TokenRefused):  # a later expiry breaks the signature
        await open_link(box, ".".join([kind, tenant, str(int(expires) + 3600), nonce, key, sig]))
    with pytest.raises(TokenRefused):  # so does a key id, or a link made single-use
        await open_link(box, ".".join([kind, tenant, expires, nonce, "key_x", sig]))
    with pytest.raises(TokenRefused):
        await open_link(box, ".".join(["u", tenant, expires, nonce, key, sig]))
    with pytest.raises(TokenRefused):  # the five-part tokens of earlier versions
        await open_link(box, ".".join([kind, tenant, expires, nonce, sig]))
    clock.advance(61)
    with pytest.raises(TokenRefused) as refused:
        await open_link(box, token)
    assert refused.value.expired and refused.value.status == 410
    with pytest.raises(ValueError):
        portal_link(box, "client-42", ttl=box.settings.portal.max_link_ttl + 1)


async def test_the_api_makes_links_and_sessions_expire(
    box: Relaybox, server: str, http: aiohttp.ClientSession, clock: FrozenClock
) -> None:
    _, key = await create_api_key(box, "client-42")
    auth = {"Authorization": f"Bearer {key}"}
    async with http.post(server + "/api/v1/portal/sessions", json={"ttl": 120}, headers=auth) as r:
        assert r.status == 201
        answer = await r.json()
    assert answer["url"].startswith(server + "/portal/enter/")
    assert answer["expires_at"].endswith("Z")
    async with http.post(
        server + "/api/v1/portal/sessions", json={"ttl": 10**7}, headers=auth
    ) as r:
        assert r.status == 422
    async with http.post(server + "/api/v1/portal/sessions", json={}) as r:
        assert r.status == 401

    portal = Portal(http, server)
    await portal.enter(answer["url"])
    clock.advance(121)  # the link is spent; the session it started goes on
    async with http.get(answer["url"], allow_redirects=False) as r:
        assert r.status == 410 and "expired" in await r.text()
    assert (await portal.get("/endpoints"))[0] == 200
    clock.advance(box.settings.portal.session_ttl)
    status, text = await portal.get("/endpoints")
    assert status == 401 and "expired" in text
    status, _, _ = await portal.post("/endpoints", {"url": "http://127.0.0.1:9/x"})
    assert status == 401


async def _api_link(
    http: aiohttp.ClientSession, server: str, key: str, **asked: object
) -> dict[str, object]:
    async with http.post(
        server + "/api/v1/portal/sessions", json=asked, headers={"Authorization": f"Bearer {key}"}
    ) as r:
        assert r.status == 201, await r.text()
        answer: dict[str, object] = await r.json()
        return answer


async def test_logout_ends_the_session_for_every_process(
    box: Relaybox, server: str, http: aiohttp.ClientSession, clock: FrozenClock
) -> None:
    """Every page (an error page within the session too) has the logout button; a
    logout needs the session's CSRF token, and ends the session: its address opens
    nothing any more, here and in another process over the same database."""
    endpoint_id, _ = await endpoint(box, "http://127.0.0.1:9/x", tenant="client-42")
    message = await publish_one(box, "order.paid", tenant="client-42")
    portal = await portal_for(box, http, server, "client-42")
    for path in (
        "/endpoints",
        f"/endpoints/{endpoint_id}",
        "/event-types",
        "/subscriptions",
        "/messages",
        f"/messages/{message.id}",
        "/messages/msg_nope",  # a 404 page of the session
    ):
        _, page = await portal.get(path)
        [form] = re.findall(r'<form method="post" action="([^"]+)" id="logout"', page)
        assert form == portal.base + "/logout", path
        assert f'name="csrf" value="{portal.csrf}"' in page

    status, _, _ = await portal.post("/logout", csrf=False)
    assert status == 403  # a forged logout is refused: the session goes on
    assert (await portal.get("/endpoints"))[0] == 200
    other = await portal_for(box, http, server, "client-42")  # a second session

    local(box)
    async with Served(box.asgi(roles=("api",))) as elsewhere:  # another process
        assert (await http.get(elsewhere.url + portal.base + "/endpoints")).status == 200
        status, location, _ = await portal.post("/logout")
        assert status == 303 and location == "/portal/logged-out"
        async with http.get(server + location) as r:
            assert r.status == 200 and "You have logged out" in await r.text()
        for origin in (server, elsewhere.url):
            async with http.get(origin + portal.base + "/endpoints") as r:
                text = await r.text()
                assert r.status == 401 and "this session has ended" in text
                assert "Session ended" in text and portal.base not in text
        status, _, _ = await portal.post(f"/endpoints/{endpoint_id}/disable")
        assert status == 401
        found = await box.store.outbox.endpoint_get(endpoint_id, "client-42")
        assert found is not None and found.status == "enabled"
        assert (await portal.post("/logout"))[0] == 401  # once is enough
    assert (await other.get("/endpoints"))[0] == 200  # only that session ended

    # The revocation is kept while the session could be used, then maintenance drops it.
    count = "SELECT COUNT(*) AS n FROM relaybox_portal_revoked_tokens"
    await box.maintenance().run_once()
    assert (await box.store.fetch_all(count))[0]["n"] == 1
    clock.advance(box.settings.portal.session_ttl + 61)
    await box.maintenance().run_once()
    assert (await box.store.fetch_all(count))[0]["n"] == 0


async def test_revoking_the_api_key_ends_the_sessions_of_its_links(
    box: Relaybox, server: str, http: aiohttp.ClientSession
) -> None:
    """Links the tenant API made carry the key that asked for them: once the key is
    revoked, their sessions end and their unopened links open nothing. Another key's
    sessions, and those of links the application made itself, go on."""
    revoked_id, revoked = await create_api_key(box, "client-42")
    _, kept = await create_api_key(box, "client-42")
    doomed = Portal(http, server)
    await doomed.enter(str((await _api_link(http, server, revoked))["url"]))
    unopened = str((await _api_link(http, server, revoked))["url"])
    survivor = Portal(http, server)
    await survivor.enter(str((await _api_link(http, server, kept))["url"]))
    own = await portal_for(box, http, server, "client-42")  # box.portal_link: no key

    assert await revoke_api_key(box, revoked_id)
    status, text = await doomed.get("/endpoints")
    assert status == 401 and "this session has ended" in text
    status, _, _ = await doomed.post("/endpoints", {"url": "http://127.0.0.1:9/x"})
    assert status == 401
    assert await box.store.outbox.endpoint_list("client-42", limit=10) == []
    async with http.get(unopened, allow_redirects=False) as r:
        assert r.status == 401 and "no longer valid" in await r.text()
    assert (await survivor.get("/endpoints"))[0] == 200
    assert (await own.get("/endpoints"))[0] == 200


async def test_a_single_use_link_opens_one_session(
    box: Relaybox, server: str, http: aiohttp.ClientSession
) -> None:
    _, key = await create_api_key(box, "client-42")
    answer = await _api_link(http, server, key, single_use=True)
    assert answer["single_use"] is True
    url = str(answer["url"])
    portal = Portal(http, server)
    await portal.enter(url)
    async with http.get(url, allow_redirects=False) as r:
        text = await r.text()
        assert r.status == 410 and "this link has been used" in text and "Link used" in text
    assert (await portal.get("/endpoints"))[0] == 200  # its session goes on

    # Opened by several at once, it starts one session.
    url = str((await _api_link(http, server, key, single_use=True))["url"])

    async def opening() -> int:
        async with http.get(url, allow_redirects=False) as r:
            return r.status

    assert sorted(await asyncio.gather(*(opening() for _ in range(6)))) == [303] + [410] * 5

    # Links are not single-use unless asked (or the setting says so).
    answer = await _api_link(http, server, key)
    assert answer["single_use"] is False
    for _ in range(2):
        await Portal(http, server).enter(str(answer["url"]))
    async with http.post(
        server + "/api/v1/portal/sessions",
        json={"single_use": "yes"},
        headers={"Authorization": f"Bearer {key}"},
    ) as r:
        assert r.status == 422
    link = box.portal_link("client-42", single_use=True)
    await Portal(http, server).enter(server + link.url)
    async with http.get(server + link.url, allow_redirects=False) as r:
        assert r.status == 410
    box.settings.portal.single_use_links = True
    assert (await _api_link(http, server, key))["single_use"] is True
    assert (await _api_link(http, server, key, single_use=False))["single_use"] is False
    assert box.portal_link("client-42").single_use


async def test_forms_need_the_sessions_csrf_token(
    box: Relaybox, server: str, http: aiohttp.ClientSession
) -> None:
    portal = await portal_for(box, http, server, "client-42")
    status, _, _ = await portal.post("/endpoints", {"url": "http://127.0.0.1:9/x"}, csrf=False)
    assert status == 403
    other = await portal_for(box, http, server, "client-42")  # another session's token
    status, _, _ = await portal.post(
        "/endpoints", {"url": "http://127.0.0.1:9/x", "csrf": other.csrf}, csrf=False
    )
    assert status == 403
    assert (await portal.get("/endpoints"))[1].count("data-endpoint=") == 0


async def test_pages_headers_and_theme(box: Relaybox, http: aiohttp.ClientSession) -> None:
    box.settings.portal.frame_ancestors = "https://app.example"
    box.settings.portal.theme = {"accent": "#0a7f5a"}
    local(box)
    async with Served(box.asgi(roles=("api",))) as served:
        portal = await portal_for(box, http, served.url, "client-42")
        async with http.get(served.url + portal.base + "/endpoints") as r:
            csp = r.headers["content-security-policy"]
            assert "frame-ancestors https://app.example" in csp
            assert "x-frame-options" not in r.headers
            assert r.headers["referrer-policy"] == "no-referrer"
            assert r.headers["cache-control"] == "no-store"
            assert "--rb-accent:#0a7f5a;" in await r.text()


async def test_manage_endpoints_secrets_tests_and_the_log(
    box: Relaybox, server: str, http: aiohttp.ClientSession
) -> None:
    await define_event_type(
        box,
        "order.paid",
        description="An order was paid",
        schema={"type": "object", "properties": {"orderId": {"type": "string"}}},
    )
    portal = await portal_for(box, http, server, "client-42")
    receiver = HttpReceiver(Reply(200, b'{"ok": true}'))
    async with receiver:
        status, _, text = await portal.post(
            "/endpoints", {"url": receiver.url, "event_types": "order.* relaybox.test"}
        )
        assert status == 200 and "data-secret" in text
        [secret] = re.findall(r"whsec_[A-Za-z0-9+/=]+", text)
        [endpoint_id] = ids_in(text, "ep")

        status, page = await portal.get(f"/endpoints/{endpoint_id}")
        assert status == 200 and secret not in page  # shown once, on creation
        status, _, revealed = await portal.post(f"/endpoints/{endpoint_id}/secret")
        assert status == 200 and secret not in revealed and "data-shown-before" in revealed
        status, _, rotated = await portal.post(
            f"/endpoints/{endpoint_id}/secret/rotate", {"grace_hours": "2"}
        )
        [new] = re.findall(r"whsec_[A-Za-z0-9+/=]+", rotated)
        assert new != secret and "Keeps signing until" not in rotated
        _, _, revealed = await portal.post(f"/endpoints/{endpoint_id}/secret")
        assert not re.findall(r"whsec_[A-Za-z0-9+/=]+", revealed)  # both shown once already
        stored = await endpoints.endpoint_secrets(box, endpoint_id, "client-42")
        assert [s["secret"] for s in stored or []] == [new, secret]  # overlap: both sign

        status, location, _ = await portal.post(
            f"/endpoints/{endpoint_id}", {"url": receiver.url, "description": "orders"}
        )
        assert status == 303 and location.endswith("notice=saved")
        assert "orders" in (await portal.get(f"/endpoints/{endpoint_id}"))[1]

        status, location, _ = await portal.post(
            f"/endpoints/{endpoint_id}/test", {"event_type": "order.paid"}
        )
        assert status == 303 and "/messages/msg_" in location
        message_id = location.rsplit("/messages/", 1)[1].split("?")[0]
        assert await dispatch_once(box) == 1
        [seen] = receiver.requests
        assert b'"orderId": "string"' in seen.body or b'"orderId":"string"' in seen.body
        status, page = await portal.get(f"/messages/{message_id}")
        assert status == 200 and 'data-attempt="1"' in page and "HTTP 200" in page
        assert "&#34;ok&#34;: true" in page  # the response's first bytes
        request, response = page.split('class="request"')[1].split('class="response"')
        assert "webhook-signature: v1," in request and "webhook-id: msg_" in request
        assert "User-Agent: relaybox-webhooks/1" in request
        assert "Content-Length: 12" in response  # the sink's answer headers

        _, log = await portal.get("/messages", status="sent")
        assert message_id in log
        assert message_id not in (await portal.get("/messages", status="dead"))[1]
        assert message_id in (await portal.get("/messages", event_type="order.paid"))[1]
        assert message_id in (await portal.get("/messages", message_id=message_id))[1]
        assert message_id not in (await portal.get("/messages", idempotency_key="nope"))[1]

        status, location, _ = await portal.post(f"/messages/{message_id}/resend")
        assert status == 303 and "notice=resent" in location
        assert await dispatch_once(box) == 1
        assert len(receiver.requests) == 2
        assert receiver.requests[1].headers["webhook-id"] == seen.headers["webhook-id"]

        _, types = await portal.get("/event-types")
        assert "An order was paid" in types and "&#34;orderId&#34;: &#34;string&#34;" in types
        _, subs = await portal.get("/subscriptions")
        assert "order.paid" in subs

        status, location, _ = await portal.post(f"/endpoints/{endpoint_id}/pause")
        assert "notice=paused" in location
        _, page = await portal.get(f"/endpoints/{endpoint_id}")
        assert 'id="paused"' in page and 'id="resume"' in page
        found = await box.store.outbox.endpoint_get(endpoint_id, "client-42")
        assert found is not None and found.paused_at is not None
        status, location, _ = await portal.post(f"/endpoints/{endpoint_id}/resume")
        assert "notice=resumed" in location
        _, page = await portal.get(f"/endpoints/{endpoint_id}")
        assert 'id="paused"' not in page and 'id="pause"' in page

        status, location, _ = await portal.post(f"/endpoints/{endpoint_id}/disable")
        assert "notice=disabled" in location
        assert "status-disabled" in (await portal.get(f"/endpoints/{endpoint_id}"))[1]
        status, _, text = await portal.post(f"/endpoints/{endpoint_id}/test")
        assert status == 409
        await portal.post(f"/endpoints/{endpoint_id}/enable")
        assert "status-enabled" in (await portal.get(f"/endpoints/{endpoint_id}"))[1]
        status, location, _ = await portal.post(f"/endpoints/{endpoint_id}/delete")
        assert location.endswith("/endpoints?notice=deleted")
        assert (await portal.get(f"/endpoints/{endpoint_id}"))[0] == 404


async def test_payload_filters_are_edited_checked_and_applied_at_fan_out(
    box: Relaybox, server: str, http: aiohttp.ClientSession
) -> None:
    portal = await portal_for(box, http, server, "client-42")
    receiver = HttpReceiver(Reply(200, b"ok"))

    async def delivered_to(endpoint_id: str, message_id: str) -> bool:
        rows = await box.store.outbox.delivery_list(
            "client-42", message_id=message_id, endpoint_id=None, undelivered=False, limit=5
        )
        return any(r.endpoint_id == endpoint_id for r in rows)

    async with receiver:
        # Refused filters: the form again with the problem and what was typed, 422,
        # and no endpoint stored.
        for typed, problem in (
            ('{"data.amount": {"$gte": 100}', "filter: not valid JSON"),
            ('{"data.amount": {"$greater": 100}}', "data.amount.$greater: unknown operator"),
            ('["data.amount"]', "filter: an object of conditions, not a list"),
        ):
            status, _, text = await portal.post(
                "/endpoints",
                {"url": receiver.url, "event_types": "order.*", "filter": typed},
            )
            assert status == 422, text
            [shown] = re.findall(
                r'<div class="error" role="alert" id="form-error"[^>]*>([^<]*)', text
            )
            assert problem in html.unescape(shown)
            assert 'id="create-endpoint"' in text and typed in html.unescape(text)
            assert await box.store.outbox.endpoint_list("client-42", limit=10) == []

        status, _, text = await portal.post(
            "/endpoints",
            {
                "url": receiver.url,
                "event_types": "order.*",
                "filter": '{"data.amount": {"$gte": 100}, "data.currency": "EUR"}',
            },
        )
        assert status == 200, text
        [endpoint_id] = ids_in(text, "ep")
        found = await box.store.outbox.endpoint_get(endpoint_id, "client-42")
        assert found is not None
        assert found.payload_filter == {"data.amount": {"$gte": 100}, "data.currency": "EUR"}
        _, subs = await portal.get("/subscriptions")
        [shown] = re.findall(rf'<code data-filter="{endpoint_id}">([^<]*)</code>', subs)
        assert html.unescape(shown) == '{"data.amount": {"$gte": 100}, "data.currency": "EUR"}'

        # Applied at fan-out: only the message the filter holds for gets a delivery.
        small = await publish_one(
            box, "order.paid", {"amount": 50, "currency": "EUR"}, tenant="client-42"
        )
        dollars = await publish_one(
            box, "order.paid", {"amount": 500, "currency": "USD"}, tenant="client-42"
        )
        large = await publish_one(
            box, "order.paid", {"amount": 150, "currency": "EUR"}, tenant="client-42"
        )
        assert not await delivered_to(endpoint_id, small.id)
        assert not await delivered_to(endpoint_id, dollars.id)
        assert await delivered_to(endpoint_id, large.id)
        assert await dispatch_once(box) == 1
        [seen] = receiver.requests
        assert seen.headers["webhook-id"] == large.id

        # An invalid edit stores nothing: the filter stays, and the form shows the text.
        typed = '{"$or": [{"data.amount": {"$lt": 10}}, "EUR"]}'
        status, _, text = await portal.post(
            f"/endpoints/{endpoint_id}", {"url": receiver.url, "filter": typed}
        )
        assert status == 422
        assert "$or[1]: a filter (an object), not a string" in text
        assert 'id="edit-endpoint"' in text and typed in html.unescape(text)
        found = await box.store.outbox.endpoint_get(endpoint_id, "client-42")
        assert found is not None
        assert found.payload_filter == {"data.amount": {"$gte": 100}, "data.currency": "EUR"}

        # A valid edit replaces it; the endpoint's page shows it in the form.
        status, location, _ = await portal.post(
            f"/endpoints/{endpoint_id}",
            {"url": receiver.url, "filter": '{"data.amount": {"$lt": 100}}'},
        )
        assert status == 303 and location.endswith("notice=saved")
        _, page = await portal.get(f"/endpoints/{endpoint_id}")
        assert '"$lt": 100' in html.unescape(page)
        small = await publish_one(box, "order.paid", {"amount": 50}, tenant="client-42")
        large = await publish_one(box, "order.paid", {"amount": 150}, tenant="client-42")
        assert await delivered_to(endpoint_id, small.id)
        assert not await delivered_to(endpoint_id, large.id)

        # A blank filter removes it: every message of the endpoint's types again.
        status, _, _ = await portal.post(
            f"/endpoints/{endpoint_id}", {"url": receiver.url, "filter": ""}
        )
        assert status == 303
        found = await box.store.outbox.endpoint_get(endpoint_id, "client-42")
        assert found is not None and found.payload_filter is None
        assert "none: every message of those types" in (await portal.get("/subscriptions"))[1]
        large = await publish_one(box, "order.paid", {"amount": 150}, tenant="client-42")
        assert await delivered_to(endpoint_id, large.id)


async def test_a_filter_nested_too_deep_to_read_is_refused_like_any_bad_filter(
    box: Relaybox, server: str, http: aiohttp.ClientSession
) -> None:
    """A filter nested 10,000 deep (deeper than the JSON parser's stack) on the create
    and edit forms: 422 and the form again with the problem, as the tenant API refuses
    it (400 there: its whole body is that JSON); nothing stored. It was a 500."""
    portal = await portal_for(box, http, server, "client-42")
    deep = '{"data.a": {"$eq": ' + "[" * 10_000 + "]" * 10_000 + "}}"
    problem = "filter: nested too deep to read, over the limit of 8"
    status, _, text = await portal.post(
        "/endpoints", {"url": "https://hooks.example.com/x", "filter": deep}
    )
    assert status == 422, text
    assert problem in html.unescape(text) and 'id="create-endpoint"' in text
    assert await box.store.outbox.endpoint_list("client-42", limit=10) == []
    endpoint_id, _ = await endpoint(box, "https://hooks.example.com/x", tenant="client-42")
    status, _, text = await portal.post(
        f"/endpoints/{endpoint_id}", {"url": "https://hooks.example.com/x", "filter": deep}
    )
    assert status == 422, text
    assert problem in html.unescape(text) and 'id="edit-endpoint"' in text
    found = await box.store.outbox.endpoint_get(endpoint_id, "client-42")
    assert found is not None and found.payload_filter is None


async def test_idempotency_key_search_is_exact_in_the_portal_and_the_api(
    box: Relaybox, server: str, http: aiohttp.ClientSession
) -> None:
    _, key = await create_api_key(box, "client-42")
    auth = {"Authorization": f"Bearer {key}"}
    await endpoint(box, "http://127.0.0.1:9/x", tenant="client-42")
    keys = ["Order-1001", "order-1001", " order-1001", "order-1001-b"]
    published: dict[str, str] = {}
    for idempotency_key in keys:
        body = {"event_type": "order.paid", "data": {}, "idempotency_key": idempotency_key}
        async with http.post(server + "/api/v1/messages", json=body, headers=auth) as r:
            assert r.status == 202  # a new message: the API tells these keys apart
            published[idempotency_key] = (await r.json())["id"]
    body = {"event_type": "order.paid", "data": {}, "idempotency_key": "order-1001"}
    async with http.post(server + "/api/v1/messages", json=body, headers=auth) as r:
        assert r.status == 200  # the same key: the same message
        assert (await r.json())["id"] == published["order-1001"]

    async def api_search(idempotency_key: str) -> set[str]:
        async with http.get(
            server + "/api/v1/messages", params={"idempotency_key": idempotency_key}, headers=auth
        ) as r:
            assert r.status == 200
            return {m["id"] for m in (await r.json())["data"]}

    # The portal's search and the API's listing find the same: each key its own message.
    portal = await portal_for(box, http, server, "client-42")
    for idempotency_key, message_id in published.items():
        _, page = await portal.get("/messages", idempotency_key=idempotency_key)
        assert log_rows(page) == {message_id} == await api_search(idempotency_key)
        assert f'value="{html.escape(idempotency_key)}"' in page  # the form keeps it as typed
    for near in ("ORDER-1001", "order-1001 ", "order-100", "order", "%", "order-1001%"):
        _, page = await portal.get("/messages", idempotency_key=near)
        assert log_rows(page) == set() == await api_search(near), near
    _, page = await portal.get("/messages", idempotency_key="")  # empty: no filter
    assert log_rows(page) == set(published.values()) == await api_search("")


async def test_the_portal_and_the_api_draw_from_one_publish_bucket(
    box: Relaybox, server: str, http: aiohttp.ClientSession
) -> None:
    """A burst of 4 and one token every 1000 s, spent by the tenant API's publish and
    test routes, the portal's test events and resends, and the API's redeliver alike:
    together they send 4 messages, the rest is refused (429, with Retry-After) and
    writes nothing. Another tenant has its own bucket."""
    local(box, publish_rate=0.001, publish_burst=4)
    endpoint_id, _ = await endpoint(box, "http://127.0.0.1:9/x", tenant="client-42")
    _, key = await create_api_key(box, "client-42")
    auth = {"Authorization": f"Bearer {key}"}
    api = server + "/api/v1"
    body = {"event_type": "order.paid", "data": {"n": 1}}
    portal = await portal_for(box, http, server, "client-42")

    async with http.post(api + "/messages", json=body, headers=auth) as r:
        assert r.status == 202
        first = (await r.json())["id"]
    async with http.post(api + f"/endpoints/{endpoint_id}/test", json={}, headers=auth) as r:
        assert r.status == 202
    sent = []
    for _ in range(3):
        sent.append(await portal.post(f"/endpoints/{endpoint_id}/test"))
    assert [status for status, _, _ in sent] == [303, 303, 429]
    status, _, text = sent[2]
    assert "Too many messages" in text and "Nothing was sent" in text
    assert 'class="tabs"' in text and 'id="logout"' in text  # the session's tabs stay

    async with http.post(
        server + portal.base + f"/endpoints/{endpoint_id}/test",
        data={"csrf": portal.csrf},
        allow_redirects=False,
    ) as r:
        assert r.status == 429 and 1 <= int(r.headers["retry-after"]) <= 1000
    async with http.post(api + "/messages", json=body, headers=auth) as r:
        assert r.status == 429 and (await r.json())["error"] == "rate_limited"
        assert 1 <= int(r.headers["retry-after"]) <= 1000
    async with http.post(api + f"/endpoints/{endpoint_id}/test", json={}, headers=auth) as r:
        assert r.status == 429
    # Sending a message again takes a token as well, through either door.
    async with box.store.transaction() as conn:
        await conn.exec_driver_sql(
            f"UPDATE relaybox_outbox SET status = 'dead' WHERE message_id = '{first}'"
        )
    status, _, text = await portal.post(f"/messages/{first}/resend")
    assert status == 429 and "Too many messages" in text
    async with http.post(api + f"/messages/{first}/redeliver", json={}, headers=auth) as r:
        assert r.status == 429
    [row] = await box.store.fetch_all(
        "SELECT COUNT(*) AS n FROM relaybox_messages WHERE tenant = 'client-42'"
    )
    assert row["n"] == 4
    [row] = await box.store.fetch_all(
        f"SELECT status FROM relaybox_outbox WHERE message_id = '{first}'"
    )
    assert row["status"] == "dead"  # the refused resends changed nothing

    other, _ = await endpoint(box, "http://127.0.0.1:9/y", tenant="client-b")
    neighbour = await portal_for(box, http, server, "client-b")
    status, _, _ = await neighbour.post(f"/endpoints/{other}/test")
    assert status == 303


async def test_bad_input_is_a_4xx_page(
    box: Relaybox, server: str, http: aiohttp.ClientSession
) -> None:
    portal = await portal_for(box, http, server, "client-42")
    for form in (
        {"url": "ftp://example.com/x"},
        {"url": "http://127.0.0.1:9/x", "rate_limit": "fast"},
        {"url": "http://127.0.0.1:9/x", "event_types": "bad pattern!"},
        {"url": "x" * 3000},
    ):
        status, _, text = await portal.post("/endpoints", form)
        assert status == 422, (form, text)
    status, _, _ = await portal.post("/endpoints", {"url": "a" * 70_000})
    assert status == 413
    assert (await portal.get("/messages", status="x\x00"))[0] == 422
    assert (await portal.get("/endpoints/" + "e" * 700))[0] == 404
    async with http.get(server + "/portal/s/garbage/endpoints") as r:
        assert r.status == 401
    async with http.get(server + "/portal/enter/l.Zm9v.1.x.y") as r:
        assert r.status == 401


async def test_each_signing_secret_is_revealed_once(
    box: Relaybox, server: str, http: aiohttp.ClientSession
) -> None:
    """An endpoint the application made through the API: its secret was never shown in
    the portal, so the first *Reveal secret* shows it, and no later one; two reveals at
    once show it to one of them only. A rotation shows the new secret, once."""
    endpoint_id, secret = await endpoint(box, "http://127.0.0.1:9/hook", tenant="client-42")
    portal = await portal_for(box, http, server, "client-42")
    pages = await asyncio.gather(
        *(portal.post(f"/endpoints/{endpoint_id}/secret") for _ in range(4))
    )
    assert {status for status, _, _ in pages} == {200}
    assert [secret in text for _, _, text in pages].count(True) == 1
    _, _, again = await portal.post(f"/endpoints/{endpoint_id}/secret")
    assert secret not in again and "Rotate secret" in again
    _, _, rotated = await portal.post(f"/endpoints/{endpoint_id}/secret/rotate")
    [new] = re.findall(r"whsec_[A-Za-z0-9+/=]+", rotated)
    assert new != secret and secret not in rotated
    _, _, after = await portal.post(f"/endpoints/{endpoint_id}/secret")
    assert new not in after and secret not in after
    # The tenant API (the application's own key) still reads both: it is not the portal.
    stored = await endpoints.endpoint_secrets(box, endpoint_id, "client-42")
    assert [s["secret"] for s in stored or []] == [new, secret]


SHARED_KEY = "order-1001"


def log_rows(page: str) -> set[str]:
    """The message ids in the rows of a delivery-log page (not in its search form)."""
    [table] = re.findall(r'<table class="deliveries">.*?</table>', page, re.S)
    return ids_in(table, "msg")


async def _searches_find_nothing_of_b(
    box: Relaybox,
    http: aiohttp.ClientSession,
    server: str,
    portal: Portal,
    b_message: str,
    a_message: str,
) -> None:
    """Tenant A searching its delivery log, in the portal and through the tenant API,
    by B's message id, B's idempotency key and B's event type: only A's own message."""
    for search, expected in (
        ({"message_id": b_message}, set()),
        ({"idempotency_key": SHARED_KEY}, {a_message}),
        ({"event_type": "order.paid"}, {a_message}),
        ({"event_type": "order.paid", "status": "sent"}, set()),  # B's is the sent one
        ({}, {a_message}),
    ):
        status, page = await portal.get("/messages", **search)
        assert status == 200 and log_rows(page) == expected, search
    _, key = await create_api_key(box, "client-a")
    auth = {"Authorization": f"Bearer {key}"}
    api = server + "/api/v1"
    for query in ({"event_type": "order.paid"}, {"idempotency_key": SHARED_KEY}, {}):
        async with http.get(api + "/messages", params=query, headers=auth) as r:
            assert r.status == 200
            assert [m["id"] for m in (await r.json())["data"]] == [a_message], query
    for path in (f"/messages/{b_message}", f"/messages/{b_message}/attempts"):
        async with http.get(api + path, headers=auth) as r:
            assert r.status == 404, path
    async with http.get(api + "/undelivered", headers=auth) as r:
        assert {d["message_id"] for d in (await r.json())["data"]} == {a_message}


PAGES = [
    ("GET", "/endpoints/{endpoint}"),
    ("POST", "/endpoints/{endpoint}"),
    ("POST", "/endpoints/{endpoint}/enable"),
    ("POST", "/endpoints/{endpoint}/disable"),
    ("POST", "/endpoints/{endpoint}/pause"),
    ("POST", "/endpoints/{endpoint}/resume"),
    ("POST", "/endpoints/{endpoint}/delete"),
    ("POST", "/endpoints/{endpoint}/secret"),
    ("POST", "/endpoints/{endpoint}/secret/rotate"),
    ("POST", "/endpoints/{endpoint}/test"),
    ("GET", "/messages/{message}"),
    ("POST", "/messages/{message}/resend"),
    ("GET", "/messages/{attempt}"),
    ("GET", "/endpoints/{attempt}"),
]


@pytest.mark.parametrize(("method", "route"), PAGES)
async def test_a_tenant_reaches_no_other_tenants_ids(
    box: Relaybox,
    server: str,
    http: aiohttp.ClientSession,
    method: str,
    route: str,
) -> None:
    receiver = HttpReceiver(Reply(200, b"ok"))
    async with receiver:
        other_endpoint, other_secret = await endpoint(box, receiver.url, tenant="client-b")
        message = await publish_one(
            box, "order.paid", tenant="client-b", idempotency_key=SHARED_KEY
        )
        assert await dispatch_once(box) == 1
        attempts = await box.store.outbox.attempt_list(message.id, "client-b")
        assert attempts
        ids = {"endpoint": other_endpoint, "message": message.id, "attempt": attempts[0].outbox_id}
        # A has a message of the same type under the same idempotency key (keys are
        # per tenant), never dispatched: A's searches find it, and nothing of B's.
        await endpoint(box, "http://127.0.0.1:9/a", tenant="client-a")
        own = await publish_one(box, "order.paid", tenant="client-a", idempotency_key=SHARED_KEY)
        portal = await portal_for(box, http, server, "client-a")
        path = route.format(**ids)
        if method == "GET":
            status, text = await portal.get(path)
        else:
            status, _, text = await portal.post(path, {"url": "http://127.0.0.1:9/x"})
        assert status == 404, (path, status)
        assert other_secret not in text and ids["endpoint"] not in text
        # Nothing of B's shows in A's listings either, and B's rows are untouched.
        for listing in ("/endpoints", "/messages", "/subscriptions"):
            _, page = await portal.get(listing)
            assert other_endpoint not in page and message.id not in page
        await _searches_find_nothing_of_b(box, http, server, portal, message.id, own.id)
        found = await box.store.outbox.endpoint_get(other_endpoint, "client-b")
        assert found is not None and found.status == "enabled" and found.paused_at is None
        [row] = await box.store.outbox.delivery_list(
            "client-b", message_id=message.id, endpoint_id=None, undelivered=False, limit=5
        )
        assert row.status == "sent" and row.attempts == 1
        assert len(receiver.requests) == 1


class _LabelChildren(HTMLParser):
    """The tags directly inside each ``<label>`` (a flex column in the portal's forms:
    each direct child is a line of its own)."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.direct: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.stack and self.stack[-1] == "label":
            self.direct.append(tag)
        if tag not in ("input", "br", "img"):
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        while self.stack and self.stack.pop() != tag:
            pass


async def test_form_labels_keep_their_inline_code_in_the_sentence(
    box: Relaybox, http: aiohttp.ClientSession, server: str
) -> None:
    """A form label is a flex column (its text above its field): a ``<code>`` placed
    directly in it became a line of its own, cutting the sentence in three."""
    endpoint_id, _ = await endpoint(box, "https://hooks.example.com/x", tenant="client-42")
    portal = await portal_for(box, http, server, "client-42")
    for path in ("/endpoints", f"/endpoints/{endpoint_id}", "/messages"):
        status, text = await portal.get(path)
        assert status == 200, text
        labels = _LabelChildren()
        labels.feed(text)
        assert "code" not in labels.direct, (path, labels.direct)
    _, page = await portal.get("/endpoints")
    assert "<span>Event types (patterns such as <code>order.*</code>" in page
