"""Hardening of the admin app (``/admin``: API and dashboard) and the tenant API
(``/api/v1``) against what a client on the network can send, over real HTTP:

* bodies bounded before they are read: a 300 MiB chunked body to the login form,
  the tenant API and the admin API is a quick 413 and does not grow a real
  ``relaybox serve`` process's memory;
* NUL characters and lone surrogates are 4xx answers, never 500;
* the dashboard's security headers, logout that ends the session for every process,
  login throttling, notices and errors shown by code only;
* the per-tenant publish rate limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import psutil
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

from relaybox import FrozenClock, Relaybox
from relaybox.admin import build_admin
from relaybox.config import Settings
from relaybox.outbound import create_api_key
from tests.conftest import Served
from tests.integration.test_admin_api import AUTH, TOKEN, delivery, seed
from tests.support.outbound_app import local
from tests.support.procs import Procs, free_port, wait_http

MiB = 1024 * 1024


# -- bodies over the limit ---------------------------------------------------------


def chunks(total: int, size: int = MiB) -> Iterator[bytes]:
    """``total`` bytes of chunked transfer coding, one frame at a time: the body
    is never built in memory."""
    piece = b"a" * size
    frame = f"{size:x}\r\n".encode() + piece + b"\r\n"
    for _ in range(total // size):
        yield frame
    yield b"0\r\n\r\n"


async def stream_post(
    port: int, path: str, headers: dict[str, str], body: Iterator[bytes] | None
) -> tuple[int, int, dict[str, str], float]:
    """POST ``body`` (chunked frames; ``None``: send only the head) over a raw
    connection, stopping as soon as the answer arrives. Returns (status, body bytes
    sent, answer headers, seconds)."""
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    if body is not None:
        head.append("Transfer-Encoding: chunked")
    head += [f"{k}: {v}" for k, v in headers.items()]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
    answer = asyncio.ensure_future(reader.readuntil(b"\r\n\r\n"))
    sent = 0
    try:
        for frame in body or ():
            writer.write(frame)
            drain = asyncio.ensure_future(writer.drain())
            await asyncio.wait({drain, answer}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
            if answer.done():
                drain.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                    await drain
                break
            drain.result()
            sent += len(frame)
    except ConnectionError:
        pass  # the server closed the connection after its answer: read that answer
    raw = await asyncio.wait_for(answer, 60)
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()
    lines = raw.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    found = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return status, sent, {k.lower(): v for k, v in found.items()}, time.monotonic() - started


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    yield p
    p.cleanup()


async def test_huge_bodies_are_refused_before_they_are_read(
    database_url: str, procs: Procs
) -> None:
    """A real ``relaybox serve`` (api and admin roles): 300 MiB chunked to the login
    form, the tenant API's POST /messages and an admin API POST, and a 300 MiB
    Content-Length with no body at all, are each a 413 within seconds; the server's
    resident memory grows by less than 16 MiB over all of them."""
    box = Relaybox(settings=Settings(database_url=database_url))
    _, key = await create_api_key(box, "client-42")
    await box.close()
    port = free_port()
    args = ["serve", "--database-url", database_url, "--roles", "api,admin", "--no-migrate"]
    args += ["--host", "127.0.0.1", "--port", str(port)]
    server = procs.start("serve", args, {"RELAYBOX_ADMIN_TOKEN": TOKEN})
    await wait_http(f"http://127.0.0.1:{port}/healthz", proc=server)
    tenant = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    admin = {**AUTH, "Content-Type": "application/json"}
    cases = [
        ("/admin/login", form),
        ("/api/v1/messages", tenant),
        ("/admin/api/v1/replay", admin),
    ]
    async with aiohttp.ClientSession() as http:  # warm every path up with a small body
        base = f"http://127.0.0.1:{port}"
        async with http.post(base + "/admin/login", data={"token": "wrong-token"}) as r:
            assert r.status == 401
        body = {"event_type": "pet.adopted", "data": {"n": 1}}
        async with http.post(base + "/api/v1/messages", json=body, headers=tenant) as r:
            assert r.status == 202, await r.text()
        replay = {"source": "none", "reason": "warm-up"}
        async with http.post(base + "/admin/api/v1/replay", json=replay, headers=AUTH) as r:
            assert r.status == 200, await r.text()
    process = psutil.Process(server.pid)
    before = process.memory_info().rss
    for path, headers in cases:
        status, sent, _, took = await stream_post(port, path, headers, chunks(300 * MiB))
        assert status == 413, (path, status)
        assert sent < 64 * MiB and took < 20, (path, sent, took)
        declared = {**headers, "Content-Length": str(300 * MiB)}
        status, sent, _, took = await stream_post(port, path, declared, None)
        assert status == 413 and took < 10, (path, status, took)
    grown = process.memory_info().rss - before
    assert grown < 16 * MiB, f"the server grew by {grown / MiB:.1f} MiB"
    assert server.alive()


# -- one server for the rest ---------------------------------------------------------


@contextlib.asynccontextmanager
async def serve_box(
    database_url: str, clock: FrozenClock, **outbound: Any
) -> AsyncIterator[tuple[Relaybox, str]]:
    """The tenant API and the admin app of one box on a real server."""
    box = Relaybox(settings=Settings(database_url=database_url, admin_token=TOKEN), clock=clock)
    local(box, **outbound)
    try:
        async with Served(box.asgi(roles=("api", "admin"))) as served:
            yield box, served.url
    finally:
        await box.close()


@pytest.fixture
async def site(database_url: str, clock: FrozenClock) -> AsyncIterator[tuple[Relaybox, str]]:
    async with serve_box(database_url, clock) as found:
        yield found


async def tenant_client(box: Relaybox, url: str, tenant: str = "client-42") -> httpx.AsyncClient:
    _, key = await create_api_key(box, tenant)
    return httpx.AsyncClient(
        base_url=url + "/api/v1", headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


async def login(client: httpx.AsyncClient) -> str:
    """Log in (``client`` is based at ``/admin``); return the CSRF token of the pages."""
    r = await client.post("/login", data={"token": TOKEN, "next": "/admin/dead"})
    assert r.status_code == 303, r.text
    page = await client.get("/dead")
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert match, page.text
    return match.group(1)


# -- text no database stores ---------------------------------------------------------


SURROGATE = '{"event_type": "pet.adopted", "data": {"name": "\\ud800"}}'


async def test_nul_and_lone_surrogates_are_4xx_on_the_tenant_api(site: Any) -> None:
    box, url = site
    async with await tenant_client(box, url) as api:
        json_headers = {"Content-Type": "application/json"}
        answers = {
            "endpoint id": await api.get("/endpoints/ep_%00x"),
            "endpoint deliveries": await api.get("/endpoints/%00/deliveries"),
            "message id": await api.get("/messages/msg_%00"),
            "attempts": await api.get("/messages/%00/attempts"),
            "event_type filter": await api.get("/messages", params={"event_type": "a\x00"}),
            "before cursor": await api.get("/messages", params={"before": "\x00"}),
            "endpoint_id filter": await api.get("/undelivered", params={"endpoint_id": "\x00"}),
            "long filter": await api.get("/messages", params={"event_type": "a" * 5000}),
            "idempotency_key": await api.post(
                "/messages", json={"event_type": "pet.adopted", "idempotency_key": "k\x00"}
            ),
            "lone surrogate in data": await api.post(
                "/messages", content=SURROGATE, headers=json_headers
            ),
            "description": await api.post(
                "/endpoints", json={"url": "http://127.0.0.1:9/hook", "description": "a\x00"}
            ),
            "surrogate key": await api.post(
                "/endpoints",
                content='{"url": "http://127.0.0.1:9/hook", "\\udfff": 1}',
                headers=json_headers,
            ),
            "deep nesting": await api.post(
                "/messages", content="[" * 100_000, headers=json_headers
            ),
        }
        for what, r in answers.items():
            assert 400 <= r.status_code < 500, (what, r.status_code, r.text)
            assert r.json()["error"], what
        assert answers["endpoint id"].status_code == 404
        assert answers["message id"].status_code == 404
        assert answers["event_type filter"].status_code == 422
        surrogate = answers["lone surrogate in data"]
        assert surrogate.status_code == 422 and "lone surrogate" in surrogate.json()["message"]
        assert "data.name" in surrogate.json()["message"]
        # A NUL inside published data is JSON like any other character: stored escaped.
        ok = await api.post("/messages", json={"event_type": "pet.adopted", "data": {"a": "\x00"}})
        assert ok.status_code == 202, ok.text
        assert ok.json()["payload"]["data"] == {"a": "\x00"}
        # Nothing broke for anyone else.
        assert (await api.get("/messages")).status_code == 200


async def test_nul_and_lone_surrogates_are_4xx_on_the_admin_api_and_pages(
    site: Any, clock: FrozenClock
) -> None:
    box, url = site
    ids = await seed(box, clock)
    dead = ids["bad-1"]
    async with httpx.AsyncClient(base_url=url + "/admin", timeout=30) as admin:
        json_headers = {**AUTH, "Content-Type": "application/json"}
        answers = {
            "inbox source filter": await admin.get(
                "/api/v1/inbox", params={"source": "s\x00"}, headers=AUTH
            ),
            "dead tenant filter": await admin.get(
                "/api/v1/dead", params={"tenant": "\x00"}, headers=AUTH
            ),
            "messages filter": await admin.get(
                "/api/v1/messages", params={"tenant": "t\x00"}, headers=AUTH
            ),
            "endpoint id": await admin.get("/api/v1/endpoints/ep_%00", headers=AUTH),
            "replay source": await admin.post(
                "/api/v1/replay", json={"source": "s\x00", "reason": "r"}, headers=AUTH
            ),
            "discard reason": await admin.post(
                f"/api/v1/dead/{dead}/discard",
                content='{"reason": "x\\ud800"}',
                headers=json_headers,
            ),
            "retry actor": await admin.post(
                f"/api/v1/dead/{dead}/retry",
                json={"reason": "r", "actor": "\x00"},
                headers=AUTH,
            ),
        }
        for what, r in answers.items():
            assert 400 <= r.status_code < 500, (what, r.status_code, r.text)
        assert answers["replay source"].status_code == 400
        assert "NUL" in answers["replay source"].json()["message"]
        assert answers["discard reason"].status_code == 400
        [row] = await box.store.fetch_all(f"SELECT status FROM relaybox_inbox WHERE id = {dead}")
        assert row["status"] == "dead"  # nothing was done

        csrf = await login(admin)
        page = await admin.get("/inbox", params={"source": "s\x00"})
        assert page.status_code == 400 and "NUL" in page.text
        page = await admin.get("/messages", params={"tenant": "t\x00"})
        assert page.status_code == 400
        form = await admin.post(
            f"/dead/{dead}/discard", data={"csrf": csrf, "back": "/admin/dead", "reason": "\x00"}
        )
        assert form.status_code == 400
        [row] = await box.store.fetch_all(f"SELECT status FROM relaybox_inbox WHERE id = {dead}")
        assert row["status"] == "dead"


async def test_lone_surrogates_in_stored_payloads_are_shown_escaped_on_the_admin_api_and_pages(
    site: Any, clock: FrozenClock
) -> None:
    """A provider's payload is kept as the bytes it sent, and JSON may escape a lone
    surrogate anywhere in it (only the identity fields are refused at the edge). Rows
    written straight to the store, an event and a quarantined copy whose payloads and
    headers hold ``\\ud800``: every admin answer and page that shows them answers,
    with the escape as the provider wrote it (they used to answer 500)."""
    box, url = site
    raw = b'{"id": "evt_s", "account": "acct_\\ud800", "data": {"note": "x\\udfff"}}'
    headers = '{"x-note": "\\ud800"}'
    for payload in (raw, raw.replace(b"x", b"y")):  # the event, then a copy quarantined
        found = hashlib.sha256(payload).digest()
        row = delivery(clock, "evt_s", "ok", None, payload=payload, fingerprint=found,
                       headers=headers)  # fmt: skip
        await box.store.inbox.accept([row])
    [event] = await box.store.fetch_all("SELECT id FROM relaybox_inbox WHERE event_id = 'evt_s'")
    async with httpx.AsyncClient(base_url=url + "/admin", timeout=30) as admin:
        r = await admin.get(f"/api/v1/inbox/{event['id']}", headers=AUTH)
        assert r.status_code == 200, r.text
        assert b'"acct_\\ud800"' in r.content and b'"x\\udfff"' in r.content
        assert r.json()["payload"]["account"] == "acct_\ud800"  # what the provider sent
        assert r.json()["headers"]["x-note"] == "\ud800"
        listed = await admin.get("/api/v1/quarantine", headers=AUTH)
        [entry] = listed.json()["items"]
        r = await admin.get(f"/api/v1/quarantine/{entry['id']}", headers=AUTH)
        assert r.status_code == 200, r.text
        assert r.json()["original"]["payload"]["data"]["note"] == "x\udfff"

        await login(admin)
        for path in (f"/inbox/{event['id']}", f"/quarantine/{entry['id']}"):
            page = await admin.get(path)
            assert page.status_code == 200, (path, page.text[:300])
            assert "acct_\\ud800" in page.text, path


# -- the dashboard -------------------------------------------------------------------


async def test_every_admin_answer_carries_the_security_headers(site: Any) -> None:
    _, url = site
    async with httpx.AsyncClient(base_url=url + "/admin", timeout=30) as admin:
        answers = [
            await admin.get("/login"),
            await admin.get("/"),  # 401: the login form
            await admin.get("/api/v1/stats"),  # 401 JSON
            await admin.get("/api/v1/stats", headers=AUTH),
        ]
        await login(admin)
        answers += [await admin.get("/"), await admin.get("/dead"), await admin.get("/nowhere")]
    for r in answers:
        h = r.headers
        assert h["x-frame-options"] == "DENY", r.url
        assert h["content-security-policy"] == "frame-ancestors 'none'", r.url
        assert h["x-content-type-options"] == "nosniff", r.url
        assert h["referrer-policy"] == "same-origin", r.url


async def test_a_deployment_may_allow_framing_by_its_own_origin(database_url: str) -> None:
    settings = Settings(
        database_url=database_url,
        admin_token=TOKEN,
        admin={"frame_ancestors": "'self' https://ops.example.com"},
    )
    box = Relaybox(settings=settings)
    app = Starlette(routes=[Mount("/admin", app=build_admin(box))])
    try:
        async with Served(app) as served, httpx.AsyncClient(base_url=served.url) as client:
            r = await client.get("/admin/login")
        csp = "frame-ancestors 'self' https://ops.example.com"
        assert r.headers["content-security-policy"] == csp
        assert "x-frame-options" not in r.headers
        assert r.headers["x-content-type-options"] == "nosniff"
    finally:
        await box.close()


async def test_logout_ends_the_session_in_every_process(
    site: Any, database_url: str, clock: FrozenClock
) -> None:
    """The cookie a browser had before logging out no longer opens a page, on this
    process or on another one serving the same database."""
    _box, url = site
    other = Relaybox(settings=Settings(database_url=database_url, admin_token=TOKEN), clock=clock)
    other_app = Starlette(routes=[Mount("/admin", app=build_admin(other))])
    try:
        async with (
            Served(other_app) as second,
            httpx.AsyncClient(base_url=url + "/admin", timeout=30) as browser,
        ):
            csrf = await login(browser)
            cookie = browser.cookies["relaybox_admin"]
            stolen = {"Cookie": f"relaybox_admin={cookie}"}
            async with httpx.AsyncClient(base_url=second.url + "/admin", timeout=30) as elsewhere:
                assert (await elsewhere.get("/dead", headers=stolen)).status_code == 200
                out = await browser.post("/logout", data={"csrf": csrf})
                assert out.status_code == 303 and out.headers["location"] == "/admin/login"
                for client in (browser, elsewhere):
                    client.cookies.clear()
                    r = await client.get("/dead", headers=stolen)
                    assert r.status_code == 401 and 'name="token"' in r.text
                    action = await client.post("/dead/1/retry", data={"csrf": csrf}, headers=stolen)
                    assert action.status_code == 401
            assert (await browser.get("/dead")).status_code == 401
            await login(browser)  # a new session works
            assert (await browser.get("/dead")).status_code == 200
    finally:
        await other.close()


async def test_wrong_logins_are_throttled_per_address(site: Any) -> None:
    _box, url = site
    async with httpx.AsyncClient(base_url=url + "/admin", timeout=30) as client:
        for _ in range(5):
            r = await client.post("/login", data={"token": "not-the-token-at-all"})
            assert r.status_code == 401 and "wrong token" in r.text
        sixth = await client.post("/login", data={"token": "not-the-token-at-all"})
        assert sixth.status_code == 429
        assert 1 <= int(sixth.headers["retry-after"]) <= 60
        assert "too many wrong tokens" in sixth.text
        right = await client.post("/login", data={"token": TOKEN})
        assert right.status_code == 429  # not even a right guess is looked at now
        assert "relaybox_admin" not in client.cookies
        # The bearer API is a different door: not throttled by the form.
        assert (await client.get("/api/v1/stats", headers=AUTH)).status_code == 200


async def test_wrong_logins_are_throttled_overall(database_url: str) -> None:
    settings = Settings(
        database_url=database_url,
        admin_token=TOKEN,
        admin={"login_failures_per_address": 100, "login_failures_total": 3},
    )
    box = Relaybox(settings=settings)
    app = Starlette(routes=[Mount("/admin", app=build_admin(box))])
    try:
        async with Served(app) as served, httpx.AsyncClient(base_url=served.url) as client:
            statuses = [
                (await client.post("/admin/login", data={"token": f"guess-{i}"})).status_code
                for i in range(4)
            ]
        assert statuses == [401, 401, 401, 429]
    finally:
        await box.close()


async def test_notices_and_errors_are_shown_by_code_only(site: Any) -> None:
    _box, url = site
    async with httpx.AsyncClient(base_url=url + "/admin", timeout=30) as admin:
        await login(admin)
        for query in (
            {"error": "<script>alert(1)</script>"},
            {"notice": "Your token expired: log in again at https://evil.example"},
            {"error": "Please call +1 555 0100"},
            {"notice": "retried", "n": "3 (call +1 555 0100)"},
        ):
            page = await admin.get("/dead", params=query)
            assert page.status_code == 200
            assert 'class="notice"' not in page.text and 'class="error"' not in page.text
            assert "alert(1)" not in page.text and "evil.example" not in page.text
            assert "555 0100" not in page.text
        page = (await admin.get("/dead", params={"notice": "discarded"})).text
        assert '<div class="notice" role="status">The dead letter was discarded.</div>' in page
        page = (await admin.get("/dead", params={"notice": "retried", "n": "3"})).text
        assert "3 event(s) back to pending." in page
        page = (await admin.get("/dead", params={"error": "not_dead"})).text
        assert '<div class="error" role="alert">The event is not a dead letter' in page


async def test_dashboard_forms_are_bounded(site: Any, clock: FrozenClock) -> None:
    box, url = site
    ids = await seed(box, clock)
    async with httpx.AsyncClient(base_url=url + "/admin", timeout=30) as admin:
        csrf = await login(admin)
        big = await admin.post(
            f"/dead/{ids['bad-1']}/retry",
            data={"csrf": csrf, "back": "/admin/dead", "reason": "x" * (64 * 1024)},
        )
        assert big.status_code == 413 and "the form is" in big.text
        assert big.headers["x-frame-options"] == "DENY"
        [row] = await box.store.fetch_all(
            f"SELECT status FROM relaybox_inbox WHERE id = {ids['bad-1']}"
        )
        assert row["status"] == "dead"


# -- publishing ------------------------------------------------------------------------


async def test_publishing_is_rate_limited_per_tenant(database_url: str, clock: FrozenClock) -> None:
    """A burst of 3, then one message every 1000 s."""
    async with (
        serve_box(database_url, clock, publish_rate=0.001, publish_burst=3) as (box, url),
        await tenant_client(box, url) as api,
        await tenant_client(box, url, "client-7") as neighbour,
    ):
        body = {"event_type": "pet.adopted", "data": {"n": 1}}
        statuses = [(await api.post("/messages", json=body)).status_code for _ in range(3)]
        assert statuses == [202, 202, 202]
        over = await api.post("/messages", json=body)
        assert over.status_code == 429 and over.json()["error"] == "rate_limited"
        assert 1 <= int(over.headers["retry-after"]) <= 1000
        [count] = await box.store.fetch_all(
            "SELECT COUNT(*) AS n FROM relaybox_messages WHERE tenant = 'client-42'"
        )
        assert count["n"] == 3  # the refused one was not written
        # Another tenant has its own bucket; reading is not limited.
        assert (await neighbour.post("/messages", json=body)).status_code == 202
        assert (await api.get("/messages")).status_code == 200


async def test_logout_without_the_sessions_table_says_what_it_could_not_do(
    database_url: str, clock: FrozenClock
) -> None:
    """A database one migration behind: pages work (no session can have been
    revoked), and logout forgets the cookie but says the session stays valid."""
    box = Relaybox(settings=Settings(database_url=database_url, admin_token=TOKEN), clock=clock)
    async with box.store.transaction() as conn:
        await conn.exec_driver_sql("DROP TABLE relaybox_admin_revoked_sessions")
    app = Starlette(routes=[Mount("/admin", app=build_admin(box))])
    try:
        async with (
            Served(app) as served,
            httpx.AsyncClient(base_url=served.url + "/admin") as client,
        ):
            csrf = await login(client)
            out = await client.post("/logout", data={"csrf": csrf})
            assert out.status_code == 503 and "Logged out in this browser only" in out.text
            assert "relaybox_admin" not in client.cookies
    finally:
        await box.close()


# -- the limiters themselves -------------------------------------------------------------


class Ticks:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_token_buckets_refill_and_stay_bounded() -> None:
    from relaybox.limits import TokenBuckets

    ticks = Ticks()
    buckets = TokenBuckets(rate=2.0, burst=3, max_keys=4, clock=ticks)
    assert [buckets.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert buckets.take("a") == pytest.approx(0.5)  # one token per 0.5 s
    ticks.now += 0.5
    assert buckets.take("a") == 0.0
    assert buckets.take("b") == 0.0  # its own bucket
    for key in "cdefgh":
        buckets.take(key)
    assert len(buckets._buckets) <= 4


def test_failure_throttle_window_and_bound() -> None:
    from relaybox.limits import FailureThrottle

    ticks = Ticks()
    throttle = FailureThrottle(per_key=2, total=5, window=60, max_keys=3, clock=ticks)
    throttle.failed("x")
    assert throttle.blocked("x") == 0
    ticks.now += 10
    throttle.failed("x")
    assert throttle.blocked("x") == 50  # until the first failure leaves the window
    assert throttle.blocked("y") == 0
    ticks.now += 50
    assert throttle.blocked("x") == 0
    throttle.failed("x")
    throttle.succeeded("x")
    assert throttle.blocked("x") == 0
    for key in ("p", "q", "r"):
        throttle.failed(key)
    assert throttle.blocked("anyone") == 10  # the last five failures began at +10 s
    assert len(throttle._keys) <= 3
