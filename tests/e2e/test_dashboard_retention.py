"""The dashboard's Retention page: the global, per-source and per-tenant ages with
where each comes from, and the forms that set and remove a tenant's ages (CSRF,
durations, bounds, the flash after the redirect); then the same in a real headless
Chromium (Debian's ``chromium`` driven by Playwright), with screenshots in
``test-artifacts/screenshots/``."""

from __future__ import annotations

import re

import httpx
from starlette.applications import Starlette
from starlette.routing import Mount

from relaybox import FrozenClock, Relaybox
from relaybox.admin import build_admin
from relaybox.config import Settings
from tests.conftest import Served
from tests.e2e.test_dashboard import CHROMIUM, CHROMIUM_ARGS, SCREENSHOTS, login
from tests.integration.test_admin_api import TOKEN

DAY = 86400.0


def make_box(database_url: str, clock: FrozenClock | None = None) -> Relaybox:
    settings = Settings(
        database_url=database_url,
        admin_token=TOKEN,
        retention={
            "payload_max_age": 30 * DAY,
            "sources": {"stripe": {"payload_max_age": 7 * DAY}},
            "tenants": {"filed": {"outbox_payload_max_age": 90 * DAY}},
        },
    )
    return Relaybox(settings=settings, clock=clock) if clock else Relaybox(settings=settings)


def row(html: str, tenant: str) -> str:
    found = re.search(rf'<tr data-retention-tenant="{tenant}">(.*?)</tr>', html, re.S)
    assert found, html
    return found.group(1)


async def test_retention_page_sets_and_removes_a_tenants_ages(
    database_url: str, clock: FrozenClock
) -> None:
    box = make_box(database_url, clock)
    app = Starlette(routes=[Mount("/admin", app=build_admin(box))])
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://admin.test"
        ) as client:
            csrf = await login(client)
            page = (await client.get("/admin/retention")).text
            assert 'href="/admin/retention"' in page  # in the navigation
            assert '<tr data-retention-source="stripe">' in page and "7d 0h" in page
            assert "90d 0h" in row(page, "filed") and 'data-origin="config"' in row(page, "filed")
            assert 'name="clear"' not in row(page, "filed")  # nothing set here to remove

            async def post(path: str, **form: str) -> str:
                r = await client.post(path, data={"back": "/admin/retention", **form})
                assert r.status_code == 303, r.text
                return str(r.headers["location"])

            forged = await client.post(
                "/admin/retention/set", data={"tenant": "acme", "payload_max_age": "1d"}
            )
            assert forged.status_code == 403
            assert await box.store.retention.policy_get("acme") is None
            for bad, code in (
                ({"payload_max_age": "soon"}, "bad_age"),
                ({"payload_max_age": "30s"}, "bad_age"),
                ({"payload_max_age": "3651d"}, "bad_age"),
                ({}, "invalid_policy"),
            ):
                where = await post("/admin/retention/set", csrf=csrf, tenant="acme", **bad)
                assert where.endswith(f"error={code}"), (bad, where)
            assert await box.store.retention.policy_get("acme") is None
            where = await post(
                "/admin/retention/set",
                csrf=csrf,
                tenant="acme",
                payload_max_age="12h",
                outbox_payload_max_age="",
            )
            assert where == "/admin/retention?notice=retention_set"
            stored = await box.store.retention.policy_get("acme")
            assert stored is not None and stored.payload_max_age == 12 * 3600
            assert stored.outbox_payload_max_age is None and stored.updated_by == "dashboard"
            page = (await client.get(where)).text
            assert "The tenant&#39;s retention was saved" in page
            acme = row(page, "acme")
            assert "12h 0m" in acme and 'data-origin="api"' in acme and 'name="clear"' in acme
            # A keys window alone (at least a day), shown with where it comes from.
            where = await post("/admin/retention/set", csrf=csrf, tenant="keyed", keys_max_age="1h")
            assert where.endswith("error=bad_age"), where
            where = await post(
                "/admin/retention/set", csrf=csrf, tenant="keyed", keys_max_age="30d"
            )
            assert where == "/admin/retention?notice=retention_set"
            keyed = await box.store.retention.policy_get("keyed")
            assert keyed is not None and keyed.keys_max_age == 30 * DAY
            page = (await client.get(where)).text
            assert "data-keys-window" in page and "kept for good" in page
            assert "30d 0h" in row(page, "keyed")
            where = await post("/admin/retention/clear", csrf=csrf, tenant="acme")
            assert where == "/admin/retention?notice=retention_cleared"
            assert 'data-retention-tenant="acme"' not in (await client.get(where)).text
            where = await post("/admin/retention/clear", csrf=csrf, tenant="acme")
            assert where.endswith("error=not_found")
            bad_query = await client.get("/admin/retention?limit=0")
            assert bad_query.status_code == 400
    finally:
        await box.close()


async def test_browser_sets_and_removes_a_tenants_retention(database_url: str) -> None:
    from playwright.async_api import async_playwright

    box = make_box(database_url)
    await box.store.migrate()
    backend = box.store.backend
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    try:
        async with Served(box.asgi(roles=("admin",))) as server, async_playwright() as p:
            browser = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(15_000)
            await page.goto(f"{server.url}/admin/")
            await page.fill("input[name=token]", TOKEN)
            await page.click("button[type=submit]")
            await page.click("nav >> text=Retention")
            await page.wait_for_selector("tr[data-retention-source=stripe]")
            assert await page.inner_text("h1") == "Retention"
            form = page.locator("#retention-set")
            await form.locator("input[name=tenant]").fill("acme")
            await form.locator("input[name=payload_max_age]").fill("seven days")
            await form.locator("button[name=save]").click()
            await page.wait_for_selector("[role=alert]")
            assert "An age takes 7d" in await page.inner_text("[role=alert]")
            form = page.locator("#retention-set")
            await form.locator("input[name=tenant]").fill("acme")
            await form.locator("input[name=payload_max_age]").fill("7d")
            await form.locator("input[name=outbox_payload_max_age]").fill("90d")
            await form.locator("button[name=save]").click()
            acme = page.locator("tr[data-retention-tenant=acme]")
            await acme.wait_for()
            assert "saved" in await page.inner_text("[role=status]")
            events = await acme.locator("[data-age=payload_max_age]").inner_text()
            deliveries = await acme.locator("[data-age=outbox_payload_max_age]").inner_text()
            assert events == "7d 0h (api)" and deliveries == "90d 0h (api)"
            await page.screenshot(path=SCREENSHOTS / f"{backend}-retention.png", full_page=True)
            stored = await box.store.retention.policy_get("acme")
            assert stored is not None and stored.payload_max_age == 7 * DAY
            await acme.locator("button[name=clear]").click()
            await page.wait_for_selector("[role=status]")
            assert await page.locator("tr[data-retention-tenant=acme]").count() == 0
            assert await page.locator("tr[data-retention-tenant=filed]").count() == 1
            assert await box.store.retention.policy_get("acme") is None
            await browser.close()
    finally:
        await box.close()
