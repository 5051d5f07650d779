"""The tenant portal end to end in a real headless Chromium (Debian's ``chromium``
driven by Playwright), on SQLite and PostgreSQL: the application asks the API for a
portal link; the tenant opens it, adds an endpoint pointing at a local sink, sends a
test event, sees the attempt with its request and response, resends it; tenant B's
ids are out of reach; the logout button ends the session; a link past its expiry is
refused. Screenshots of every page go to ``test-artifacts/screenshots/portal-*.png``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from relaybox import Relaybox
from relaybox.config import Settings
from relaybox.outbound import create_api_key, define_event_type
from relaybox.store.outbox_rows import Delivery
from tests.conftest import KEYED, Served
from tests.e2e.test_dashboard import CHROMIUM, CHROMIUM_ARGS
from tests.support.outbound_app import endpoint, local, publish_one
from tests.support.receivers import HttpReceiver, Reply

SCREENSHOTS = Path(__file__).parents[2] / "test-artifacts" / "screenshots"


async def _portal_url(http: aiohttp.ClientSession, server: str, key: str, ttl: float) -> str:
    async with http.post(
        f"{server}/api/v1/portal/sessions",
        json={"ttl": ttl},
        headers={"Authorization": f"Bearer {key}"},
    ) as r:
        assert r.status == 201, await r.text()
        url: str = (await r.json())["url"]
        return url


async def test_browser_tenant_portal_end_to_end(database_url: str) -> None:
    from playwright.async_api import async_playwright

    # The application's pages (another origin: another port) may frame the portal.
    portal = {"frame_ancestors": "http://127.0.0.1:*"}
    box = Relaybox(settings=Settings(database_url=database_url, outbound=KEYED, portal=portal))
    local(box)
    backend = box.store.backend
    await define_event_type(
        box,
        "order.paid",
        description="An order was paid",
        schema={"type": "object", "properties": {"orderId": {"type": "string"}}},
    )
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    sink = HttpReceiver(Reply(200, b'{"received": true}', headers={"X-Sink": "yes"}))
    try:
        async with sink, Served(box.asgi(roles=("api",))) as server:
            b_recorded = asyncio.Event()

            async def recorded(batch: list[tuple[Delivery, str]]) -> None:
                if any(d.tenant == "client-b" for d, _ in batch):
                    b_recorded.set()

            box.dispatch_hooks.after_record.append(recorded)
            await box.start(("dispatcher",))
            # Tenant B's rows, which tenant A must not reach by any id.
            other_endpoint, _ = await endpoint(box, sink.url, tenant="client-b")
            other_message = await publish_one(box, "order.paid", tenant="client-b")
            await sink.wait_for(1, within=20)
            await asyncio.wait_for(b_recorded.wait(), 20)  # its attempt is committed
            [other_attempt] = await box.store.outbox.attempt_list(other_message.id, "client-b")

            _, key = await create_api_key(box, "client-a")
            async with aiohttp.ClientSession() as http:
                url = await _portal_url(http, server.url, key, 600)
                framed = await _portal_url(http, server.url, key, 600)
                short = await _portal_url(http, server.url, key, 1)
            page_html = (
                f'<!doctype html><h1>My app</h1><iframe src="{framed}" width="900" height="600">'
                "</iframe>"
            )
            app_page = HttpReceiver(
                Reply(200, page_html.encode(), headers={"Content-Type": "text/html"})
            )

            async with async_playwright() as p:
                browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = await browser.new_page(viewport={"width": 1280, "height": 900})
                page.set_default_timeout(20_000)

                async def shot(name: str) -> None:
                    path = SCREENSHOTS / f"portal-{backend}-{name}.png"
                    await page.screenshot(path=path, full_page=True)

                async with app_page:  # the portal in an iframe of the application's page
                    await page.goto(app_page.url)
                    frame = page.frame_locator("iframe")
                    await frame.locator("form#create-endpoint").wait_for()
                    await shot("embedded")

                await page.goto(url)
                await page.wait_for_selector("form#create-endpoint")
                base = page.url.rsplit("/endpoints", 1)[0]
                await shot("endpoints")
                await page.fill("input[name=url]", sink.url)
                await page.fill("input[name=description]", "my sink")
                await page.fill("input[name=event_types]", "order.* relaybox.test")
                await page.click("form#create-endpoint button[type=submit]")
                secret = await page.inner_text("[data-secret]")
                assert secret.startswith("whsec_")
                await shot("secret")
                await page.click("text=Continue to the endpoint")
                await page.wait_for_selector("form#send-test")
                await shot("endpoint")

                await page.click("form#send-test button[type=submit]")
                await page.wait_for_selector("[data-attempt='1']", timeout=30_000)
                attempt = page.locator("section.attempt").first
                request_text = await attempt.locator(".request").inner_text()
                response_text = await attempt.locator(".response").inner_text()
                assert "relaybox test event" in request_text
                assert "Response 200" in response_text and '"received": true' in response_text
                assert len(sink.requests) == 2
                await shot("message")

                await page.click("form#resend button[type=submit]")
                await page.wait_for_selector("[role=status]")
                assert "sent again" in await page.inner_text("[role=status]")
                for _ in range(60):  # the page refreshes itself while a delivery waits
                    if await page.locator("section.attempt").count() == 2:
                        break
                    await asyncio.sleep(0.5)
                    await page.reload()
                assert await page.locator("section.attempt").count() == 2
                assert len(sink.requests) == 3
                assert (
                    sink.requests[2].headers["webhook-id"] == sink.requests[1].headers["webhook-id"]
                )
                await shot("resent")

                await page.click("nav >> text=Delivery log")
                await page.select_option("select[name=status]", "sent")
                await page.click("form#log-filters button[type=submit]")
                assert await page.locator("tr[data-delivery]").count() == 1
                await shot("log")
                await page.click("nav >> text=Event types")
                await page.wait_for_selector("[data-event-type='order.paid']")
                await shot("event-types")

                for path in (
                    f"/endpoints/{other_endpoint}",
                    f"/messages/{other_message.id}",
                    f"/messages/{other_attempt.outbox_id}",
                ):
                    answer = await page.goto(base + path)
                    assert answer is not None and answer.status == 404, path
                    assert "There is no such" in await page.inner_text("[role=alert]")
                await shot("not-found")

                # Log out from a page of the session: its address opens nothing after.
                await page.goto(base + "/endpoints")
                await page.click("form#logout button[type=submit]")
                await page.wait_for_selector("#logged-out")
                assert "You have logged out" in await page.inner_text("#logged-out")
                await shot("logged-out")
                answer = await page.goto(base + "/messages")
                assert answer is not None and answer.status == 401
                assert "this session has ended" in await page.inner_text("[role=alert]")

                await asyncio.sleep(1.2)  # the short link's second is over
                answer = await page.goto(short)
                assert answer is not None and answer.status == 410
                assert "expired" in await page.inner_text("[role=alert]")
                await shot("expired")
                await browser.close()
    finally:
        await box.close()
