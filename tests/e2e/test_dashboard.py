"""The dashboard: login and sessions, CSRF on every action, escaping, the quarantine
diff, endpoint Disable / Enable / Recover over real HTTP; and the end-to-end run in a
real headless Chromium (Debian's ``chromium`` driven by Playwright): log in, find a
dead event, press Retry, see it done, disable an endpoint and enable it again, with a
screenshot of every page in ``test-artifacts/screenshots/``."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

from relaybox import Context, FrozenClock, PermanentError, Relaybox
from relaybox.admin import build_admin
from relaybox.config import Settings
from tests.conftest import Served
from tests.integration.test_admin_api import TOKEN, delivery, seed
from tests.integration.test_metrics import make_box, post
from tests.support.outbound_app import endpoint, local, outbox_rows, publish_one

SCREENSHOTS = Path(__file__).parents[2] / "test-artifacts" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
async def dash(database_url: str, clock: FrozenClock) -> AsyncIterator[tuple[Relaybox, Any]]:
    box = Relaybox(settings=Settings(database_url=database_url, admin_token=TOKEN), clock=clock)
    app = Starlette(routes=[Mount("/admin", app=build_admin(box))])
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://admin.test"
    ) as client:
        yield box, client
    await box.close()


async def login(client: Any) -> str:
    """Log in; return the CSRF token the pages carry."""
    r = await client.post("/admin/login", data={"token": TOKEN, "next": "/admin/dead"})
    assert r.status_code == 303 and r.headers["location"] == "/admin/dead"
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/admin" in cookie
    page = await client.get("/admin/dead")
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert match, page.text
    return match.group(1)


async def test_pages_need_a_session_and_login_checks_the_token(dash: Any) -> None:
    _, client = dash
    for path in ("/admin/", "/admin/inbox", "/admin/dead", "/admin/quarantine", "/admin/inbox/1"):
        r = await client.get(path)
        assert r.status_code == 401 and 'name="token"' in r.text, path
        assert f'name="next" value="{path}"' in r.text
    wrong = await client.post("/admin/login", data={"token": "nope", "next": "/admin/"})
    assert wrong.status_code == 401 and "wrong token" in wrong.text
    offsite = await client.post(
        "/admin/login", data={"token": TOKEN, "next": "https://evil.example/admin/"}
    )
    assert offsite.headers["location"] == "/admin/"  # never an open redirect
    assert (await client.get("/admin/")).status_code == 200


async def test_sessions_expire_and_logout_ends_them(dash: Any, clock: FrozenClock) -> None:
    box, client = dash
    csrf = await login(client)
    clock.advance(box.settings.admin.session_ttl + 1)
    assert (await client.get("/admin/")).status_code == 401
    csrf = await login(client)
    out = await client.post("/admin/logout", data={"csrf": csrf})
    assert out.status_code == 303 and out.headers["location"] == "/admin/login"
    assert (await client.get("/admin/")).status_code == 401


async def test_actions_need_the_csrf_token(dash: Any, clock: FrozenClock) -> None:
    box, client = dash
    ids = await seed(box, clock)
    csrf = await login(client)
    url = f"/admin/dead/{ids['bad-1']}/retry"
    forged = await client.post(url, data={"back": "/admin/dead"})
    assert forged.status_code == 403
    wrong = await client.post(url, data={"csrf": "0" * 64, "back": "/admin/dead"})
    assert wrong.status_code == 403
    [row] = await box.store.fetch_all(
        f"SELECT status FROM relaybox_inbox WHERE id = {ids['bad-1']}"
    )
    assert row["status"] == "dead"  # nothing happened
    ok = await client.post(url, data={"csrf": csrf, "back": f"/admin/inbox/{ids['bad-1']}"})
    assert ok.status_code == 303
    assert ok.headers["location"].startswith(f"/admin/inbox/{ids['bad-1']}?notice=")
    page = await client.get(ok.headers["location"])
    assert "1 event(s) back to pending" in page.text
    assert '<meta http-equiv="refresh" content="1">' in page.text  # pending: it refreshes
    discard = await client.post(
        f"/admin/dead/{ids['lost-1']}/discard", data={"csrf": csrf, "back": "/admin/dead"}
    )
    assert "error=" in discard.headers["location"]  # a discard needs a reason
    discard = await client.post(
        f"/admin/dead/{ids['lost-1']}/discard",
        data={"csrf": csrf, "back": "/admin/dead", "reason": "sandbox"},
    )
    assert "notice=" in discard.headers["location"]
    assert "lost-1" not in (await client.get("/admin/dead")).text


async def test_payloads_are_escaped(dash: Any, clock: FrozenClock) -> None:
    box, client = dash
    evil = {"name": "<script>alert(1)</script>"}
    await box.store.inbox.accept([delivery(clock, "<b>x</b>", "t", evil)])
    await login(client)
    page = (await client.get("/admin/inbox/1")).text
    listing = (await client.get("/admin/inbox")).text
    for html in (page, listing):
        assert "<script>alert" not in html and "<b>x</b>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


async def test_quarantine_side_by_side_and_resolve(dash: Any, clock: FrozenClock) -> None:
    box, client = dash
    await seed(box, clock)
    csrf = await login(client)
    listing = (await client.get("/admin/quarantine")).text
    qid = re.search(r'data-quarantine-id="(\d+)"', listing)
    assert qid
    page = (await client.get(f"/admin/quarantine/{qid.group(1)}")).text
    assert 'class="diff"' in page and "$.items[1]" in page and "$.extra" in page
    r = await client.post(
        f"/admin/quarantine/{qid.group(1)}/resolve",
        data={
            "csrf": csrf,
            "back": f"/admin/quarantine/{qid.group(1)}",
            "resolution": "kept_original",
            "reason": "benign resend",
        },
    )
    assert "notice=" in r.headers["location"]
    assert "kept_original" in (await client.get(r.headers["location"])).text


# -- endpoint actions ---------------------------------------------------------------


async def test_endpoint_disable_enable_recover_over_http(
    database_url: str, clock: FrozenClock
) -> None:
    """The three endpoint buttons, against a real server: CSRF, the flash notice or
    error after the redirect, the status and disabled reason on both pages, and what
    each did to the deliveries (the same functions the CLI and the tenant API call)."""
    box = Relaybox(settings=Settings(database_url=database_url, admin_token=TOKEN), clock=clock)
    local(box)
    endpoint_id, _ = await endpoint(box, "http://127.0.0.1:9/hook")
    await publish_one(box, data={"petId": "p1"})
    await publish_one(box, data={"petId": "p2"})
    app = Starlette(routes=[Mount("/admin", app=build_admin(box))])
    page_url = f"/admin/endpoints/{endpoint_id}"
    try:
        async with Served(app) as server, httpx.AsyncClient(base_url=server.url) as client:
            csrf = await login(client)
            page = (await client.get(page_url)).text
            assert 'data-endpoint-status="enabled"' in page
            assert 'name="disable"' in page and 'name="enable"' not in page

            async def post(action: str, **form: str) -> str:
                r = await client.post(f"{page_url}/{action}", data={"back": page_url, **form})
                assert r.status_code == 303, r.text
                assert r.headers["location"].startswith(page_url + "?")
                return (await client.get(r.headers["location"])).text

            forged = await client.post(f"{page_url}/disable", data={"back": page_url})
            assert forged.status_code == 403
            assert [r["status"] for r in await outbox_rows(box)] == ["pending", "pending"]

            page = await post("disable", csrf=csrf, reason="receiver migrating")
            assert 'class="notice"' in page and "The endpoint was disabled" in page
            assert 'data-endpoint-status="disabled"' in page and 'name="enable"' in page
            reason = "manual by dashboard: receiver migrating"
            assert reason in page
            listing = (await client.get("/admin/endpoints")).text
            assert 'data-endpoint-status="disabled"' in listing and reason in listing
            rows = await outbox_rows(box)
            assert {(r["status"], r["dead_reason"]) for r in rows} == {
                ("dead", "endpoint_disabled")
            }
            [event] = await box.store.fetch_all(
                "SELECT body FROM relaybox_messages WHERE event_type = 'relaybox.endpoint.disabled'"
            )
            assert json.loads(event["body"])["data"]["reason"] == reason

            again = await post("disable", csrf=csrf)
            assert 'class="error"' in again and "already disabled" in again
            early = await post("recover", csrf=csrf, since="1h")
            assert "enable it first" in early
            assert {r["status"] for r in await outbox_rows(box)} == {"dead"}

            page = await post("enable", csrf=csrf, reason="receiver moved")
            assert "The endpoint was enabled." in page
            assert 'data-endpoint-status="enabled"' in page and "data-disabled-reason" not in page
            bad = await post("recover", csrf=csrf, since="last tuesday")
            assert 'class="error"' in bad and "since and until take 24h" in bad
            later = await post("recover", csrf=csrf, since="1h", until="2h")
            assert "until must be after since" in later
            page = await post("recover", csrf=csrf, since="1h", reason="receiver fixed")
            assert "2 dead deliver(ies) queued again." in page
            assert {(r["status"], r["attempts"]) for r in await outbox_rows(box)} == {
                ("pending", 0)
            }
            assert "already enabled" in await post("enable", csrf=csrf)
            missing = await client.post(
                "/admin/endpoints/ep_nope/disable", data={"csrf": csrf, "back": page_url}
            )
            assert "error=" in missing.headers["location"]
    finally:
        await box.close()


# -- end to end in a real browser -------------------------------------------------


async def test_browser_login_find_dead_event_retry_and_see_it_done(database_url: str) -> None:
    from playwright.async_api import async_playwright

    box = make_box(database_url, worker={"poll_interval": 0.2})
    fixed = False

    @box.handler("std", "invoice.paid")
    async def grant(ctx: Context) -> None:
        if not fixed:
            raise PermanentError("invoice.paid without a customer (bug #12)")
        await ctx.once(f"std:{ctx.payload['data']['id']}:grant")

    backend = box.store.backend
    local(box)
    endpoint_id, _ = await endpoint(box, "http://127.0.0.1:9/hook")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    try:
        committed: set[int] = set()  # inbox rows whose outcome the worker committed
        commit = asyncio.Event()

        async def after_commit(ids: list[int]) -> None:
            committed.update(ids)
            commit.set()

        box.hooks.after_commit.append(after_commit)
        async with Served(box.asgi(roles=("receiver", "admin"))) as server:
            await box.start(("worker",))
            async with aiohttp.ClientSession() as session:
                await post(session, server.url, "evt_paid_1", "invoice.paid", {"id": "in_1"})
                await post(session, server.url, "evt_ok_1", "ok", {"id": "in_2"})
                await post(session, server.url, "evt_ok_1", "ok", {"id": "in_2", "v": 2})
            rows = await box.store.fetch_all(
                "SELECT id FROM relaybox_inbox WHERE event_id = 'evt_paid_1'"
            )
            dead_id = rows[0]["id"]
            async with asyncio.timeout(20):  # the worker sends it to dead letters
                while dead_id not in committed:
                    commit.clear()
                    await commit.wait()
            rows = await box.store.fetch_all(
                "SELECT id, status FROM relaybox_inbox WHERE event_id = 'evt_paid_1'"
            )
            assert rows[0]["status"] == "dead"
            fixed = True  # the operator deployed the fix; now retry from the dashboard

            async with async_playwright() as p:
                browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = await browser.new_page(viewport={"width": 1280, "height": 900})
                page.set_default_timeout(15_000)

                async def shot(name: str) -> None:
                    await page.screenshot(
                        path=SCREENSHOTS / f"{backend}-{name}.png", full_page=True
                    )

                await page.goto(f"{server.url}/admin/")
                assert await page.locator("input[name=token]").count() == 1
                await shot("login")
                await page.fill("input[name=token]", TOKEN)
                await page.click("button[type=submit]")
                await page.wait_for_selector("[data-metric=dead]")
                assert await page.inner_text("[data-metric=dead]") == "1"
                await shot("overview")
                await page.click("nav >> text=Inbox")
                await page.wait_for_selector(f"tr[data-event-id='{dead_id}']")
                await shot("inbox")
                await page.click("nav >> text=Dead letters")
                row = page.locator(f"tr[data-event-id='{dead_id}']")
                await row.wait_for()
                assert "evt_paid_1" in await row.inner_text()
                await shot("dead-letters")
                await row.locator("button[name=retry]").click()
                await page.wait_for_selector("[data-status=done]", timeout=20_000)
                assert "1 event(s) back to pending" in await page.content()
                await shot("event-done")
                await page.click("nav >> text=Quarantine")
                link = page.locator("tr[data-quarantine-id] a").first
                await link.click()
                await page.wait_for_selector("table.diff")
                await shot("quarantine-diff")
                await page.click("nav >> text=Quarantine")
                await shot("quarantine")
                for section in ("Endpoints", "Messages"):
                    await page.click(f"nav >> text={section}")
                    await page.wait_for_selector("h1")
                    assert await page.inner_text("h1") == section
                    await shot(section.lower())
                await page.click("nav >> text=Endpoints")
                await page.click(f"tr[data-endpoint-id='{endpoint_id}'] a")
                await page.fill("input[name=reason]", "receiver migrating")
                await page.click("button[name=disable]")
                await page.wait_for_selector("[data-endpoint-status=disabled]")
                reason = await page.inner_text("[data-disabled-reason]")
                assert reason == "manual by dashboard: receiver migrating"
                await shot("endpoint-disabled")
                await page.click("button[name=enable]")
                await page.wait_for_selector("[data-endpoint-status=enabled]")
                assert await page.inner_text("[role=status]") == "The endpoint was enabled."
                await browser.close()
    finally:
        await box.close()
    keys = await _business_keys(database_url)
    assert "std:in_1:grant" in keys


async def _business_keys(database_url: str) -> list[str]:
    box = Relaybox(settings=Settings(database_url=database_url))
    try:
        rows = await box.store.fetch_all("SELECT business_key FROM relaybox_operations")
        return [r["business_key"] for r in rows]
    finally:
        await box.close()
