"""Retention per tenant and per source, end to end: two tenants with different ages
(one set in the configuration file, one through the admin API) see their events',
deliveries' and messages' payloads purged at their own age by the maintenance job, a
source's age applies to its events without a tenant of their own, ``relaybox purge
--dry-run`` counts each row at its own age, and the admin API's ``/retention``
operations validate what they are given (400, 404, 409, 422) and persist it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

from relaybox import Context, FrozenClock, Relaybox
from relaybox.admin import build_admin
from relaybox.config import Settings
from relaybox.retention import Maintenance, count_candidates, purge
from relaybox.store import NewDelivery
from tests.integration.test_ops_cli import Invoke, cli_runner
from tests.support.outbound_app import local, publish_one

DAY = 86400.0
TOKEN = "test-admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def delivery(event_id: str, tenant: str | None, source: str, when: float) -> NewDelivery:
    raw = json.dumps({"id": event_id}).encode()
    return NewDelivery(
        source=source,
        account="a",
        event_id=event_id,
        event_type="ok",
        tenant=tenant,
        fingerprint=hashlib.sha256(raw).digest(),
        payload=raw,
        headers=None,
        version=None,
        received_at=when,
    )


def make_box(database_url: str, clock: FrozenClock, **retention: Any) -> Relaybox:
    settings = Settings(database_url=database_url, admin_token=TOKEN, retention=retention)
    box = Relaybox(settings=settings, clock=clock)
    for source in ("stripe", "github"):

        @box.handler(source, "ok")
        async def ok(ctx: Context) -> None:
            return None

    return box


async def api(box: Relaybox) -> AsyncIterator[httpx.AsyncClient]:
    app = Starlette(routes=[Mount("/admin", app=build_admin(box))])
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://admin.test", headers=AUTH
    ) as client:
        yield client


@pytest.fixture
async def box(database_url: str, clock: FrozenClock) -> AsyncIterator[Relaybox]:
    b = make_box(
        database_url,
        clock,
        payload_max_age=30 * DAY,
        outbox_payload_max_age=30 * DAY,
        tenants={"short": {"payload_max_age": 2 * DAY, "outbox_payload_max_age": 2 * DAY}},
        sources={"github": {"payload_max_age": 5 * DAY}},
    )
    await b.store.migrate()
    yield b
    await b.close()


async def finished_history(box: Relaybox, clock: FrozenClock) -> None:
    """Events and deliveries of tenants ``short`` (2 days in the file), ``long`` (60
    days through the admin API) and none, all finished at the clock's time now."""
    local(box)
    await box.store.inbox.accept(
        [
            delivery("short-1", "short", "stripe", clock.now()),
            delivery("long-1", "long", "stripe", clock.now()),
            delivery("none-1", None, "stripe", clock.now()),
            delivery("gh-1", None, "github", clock.now()),
            delivery("gh-long", "long", "github", clock.now()),
        ]
    )
    await box.worker().run_once()
    for tenant in ("short", "long", "other"):
        await publish_one(box, tenant=tenant, data={"t": tenant})
    # Webhook rows with no endpoint: give each message a delivery that was sent now.
    await box.store.fetch_all(
        "INSERT INTO relaybox_outbox (channel, key, payload, tenant, status, next_attempt_at,"
        " created_at, updated_at, message_id)"
        f" SELECT 'webhook', id, 'null', tenant, 'sent', {clock.now()}, {clock.now()},"
        f" {clock.now()}, id FROM relaybox_messages RETURNING id"
    )


async def kept(box: Relaybox) -> dict[str, set[str]]:
    inbox = await box.store.fetch_all(
        "SELECT event_id FROM relaybox_inbox WHERE payload IS NOT NULL"
    )
    outbox = await box.store.fetch_all(
        "SELECT tenant FROM relaybox_outbox WHERE purged_at IS NULL AND channel = 'webhook'"
    )
    messages = await box.store.fetch_all(
        "SELECT tenant FROM relaybox_messages WHERE purged_at IS NULL"
    )
    return {
        "inbox": {r["event_id"] for r in inbox},
        "outbox": {r["tenant"] for r in outbox},
        "messages": {r["tenant"] for r in messages},
    }


async def test_each_tenant_and_source_purged_at_its_own_age(
    box: Relaybox, clock: FrozenClock
) -> None:
    async for client in api(box):
        r = await client.put(
            "/admin/api/v1/retention/tenants/long",
            json={"payload_max_age": 60 * DAY, "outbox_payload_max_age": 60 * DAY},
        )
        assert r.status_code == 200, r.text
    start = clock.now()
    await finished_history(box, clock)
    everything = {
        "inbox": {"short-1", "long-1", "none-1", "gh-1", "gh-long"},
        "outbox": {"short", "long", "other"},
        "messages": {"short", "long", "other"},
    }
    maintenance = Maintenance(box)

    async def at(days: float) -> dict[str, set[str]]:
        clock.set(start + days * DAY)
        await maintenance.run_once()
        return await kept(box)

    assert await at(1) == everything
    counted = await count_candidates(box)
    assert counted == {"inbox": 0, "quarantine": 0, "outbox": 0, "messages": 0}
    clock.set(start + 3 * DAY)
    assert await count_candidates(box) == {"inbox": 1, "quarantine": 0, "outbox": 1, "messages": 1}
    dry = await purge(box, dry_run=True)
    assert (dry.inbox, dry.outbox, dry.messages, dry.dry_run) == (1, 1, 1, True)
    after_3 = await at(3)  # short's 2 days passed
    assert after_3 == {
        "inbox": everything["inbox"] - {"short-1"},
        "outbox": {"long", "other"},
        "messages": {"long", "other"},
    }
    # github's 5 days: its event without a tenant; long keeps its own 60 days.
    assert (await at(6))["inbox"] == {"long-1", "none-1", "gh-long"}
    after_31 = await at(31)  # the global 30 days
    assert after_31 == {"inbox": {"long-1", "gh-long"}, "outbox": {"long"}, "messages": {"long"}}
    assert await at(59) == after_31
    assert await at(61) == {"inbox": set(), "outbox": set(), "messages": set()}


async def test_removing_the_api_policy_brings_the_files_age_back(
    box: Relaybox, clock: FrozenClock
) -> None:
    async for client in api(box):
        r = await client.put(
            "/admin/api/v1/retention/tenants/short", json={"payload_max_age": 60 * DAY}
        )
        assert r.json()["payload_max_age"] == 60 * DAY and r.json()["payload_origin"] == "api"
        assert r.json()["outbox_payload_max_age"] == 2 * DAY
        assert r.json()["outbox_origin"] == "config"
        start = clock.now()
        await finished_history(box, clock)
        clock.set(start + 3 * DAY)
        await purge(box)
        state = await kept(box)
        assert "short-1" in state["inbox"] and "short" not in state["outbox"]
        r = await client.delete("/admin/api/v1/retention/tenants/short")
        assert r.status_code == 200 and r.json()["payload_origin"] == "config"
        assert (await client.delete("/admin/api/v1/retention/tenants/short")).status_code == 404
        await purge(box)
        assert "short-1" not in (await kept(box))["inbox"]


async def test_older_than_applies_one_age_to_every_row(box: Relaybox, clock: FrozenClock) -> None:
    start = clock.now()
    await finished_history(box, clock)
    clock.set(start + DAY)
    result = await purge(box, older_than=0.5 * DAY)
    assert (result.inbox, result.outbox, result.messages, result.passes) == (5, 3, 3, 4)


async def test_admin_api_validates_and_persists(
    database_url: str, clock: FrozenClock, box: Relaybox
) -> None:
    base = "/admin/api/v1/retention"
    async for client in api(box):
        r = await client.get(f"{base}/tenants/nobody")
        assert r.status_code == 200 and r.json() == {
            "tenant": "nobody",
            "payload_max_age": None,
            "payload_origin": "default",
            "outbox_payload_max_age": 30 * DAY,
            "outbox_origin": "default",
            "keys_max_age": None,  # no keys window: kept for good
            "keys_origin": "default",
            "api": None,
            "config": None,
        }
        short = (await client.get(f"{base}/tenants/short")).json()
        assert short["payload_origin"] == "config" and short["config"] == {
            "payload_max_age": 2 * DAY,
            "outbox_payload_max_age": 2 * DAY,
            "keys_max_age": None,
        }
        bad_bodies: list[Any] = [
            {"payload_max_age": 59},
            {"payload_max_age": 3651 * DAY},
            {"payload_max_age": "30d"},
            {"payload_max_age": True},
            {"payload_max_age": 3600, "extra": 1},
            [3600],
        ]
        for body in bad_bodies:
            r = await client.put(f"{base}/tenants/acme", json=body)
            assert r.status_code == 400, (body, r.text)
            assert r.json()["error"] == "invalid_request"
        r = await client.put(f"{base}/tenants/acme", content=b"{not json")
        assert r.status_code == 400
        r = await client.put(f"{base}/tenants/acme", json={})
        assert r.status_code == 422 and r.json()["error"] == "invalid_policy"
        r = await client.put(f"{base}/tenants/{'x' * 129}", json={"payload_max_age": 3600})
        assert r.status_code == 422 and r.json()["error"] == "invalid_policy"
        assert (await client.get(f"{base}/tenants/{'x' * 129}")).status_code == 404
        assert (await client.delete(f"{base}/tenants/acme")).status_code == 404
        assert (await client.get(f"{base}?limit=0")).status_code == 400
        assert (await client.get(f"{base}?limit=501")).status_code == 400
        r = await client.put(
            f"{base}/tenants/acme", json={"outbox_payload_max_age": 3600, "actor": "ops-42"}
        )
        assert r.status_code == 200
        assert r.json()["api"]["updated_by"] == "ops-42"
        assert r.json()["payload_max_age"] is None and r.json()["outbox_payload_max_age"] == 3600
    # A restart: the policy is in the database.
    again = make_box(database_url, clock, max_tenant_policies=1)
    try:
        async for client in api(again):
            acme = (await client.get(f"{base}/tenants/acme")).json()
            assert acme["outbox_origin"] == "api" and acme["outbox_payload_max_age"] == 3600
            listing = (await client.get(base)).json()
            assert [t["tenant"] for t in listing["tenants"]["items"]] == ["acme"]
            assert listing["max_tenant_policies"] == 1
            r = await client.put(f"{base}/tenants/beta", json={"payload_max_age": 3600})
            assert r.status_code == 409 and r.json()["error"] == "too_many_policies"
            r = await client.put(f"{base}/tenants/acme", json={"payload_max_age": 7200})
            assert r.status_code == 200  # an existing one may change
    finally:
        await again.close()


async def test_tenant_listing_merges_file_and_database_by_page(
    database_url: str, clock: FrozenClock
) -> None:
    b = make_box(
        database_url,
        clock,
        tenants={n: {"payload_max_age": 3600} for n in ("a", "c", "e")},
        sources={"stripe": {"payload_max_age": 7200}},
    )
    try:
        await b.store.migrate()
        async for client in api(b):
            for name in ("b", "c", "d"):
                r = await client.put(
                    f"/admin/api/v1/retention/tenants/{name}", json={"payload_max_age": 60}
                )
                assert r.status_code == 200
            seen: list[str] = []
            after = ""
            for _ in range(5):
                page = (await client.get(f"/admin/api/v1/retention?limit=2&after={after}")).json()
                seen += [t["tenant"] for t in page["tenants"]["items"]]
                if page["tenants"]["next"] is None:
                    break
                after = page["tenants"]["next"]
            assert seen == ["a", "b", "c", "d", "e"]
            assert page["sources"] == [
                {"source": "stripe", "payload_max_age": 7200, "keys_max_age": None}
            ]
            c = (await client.get("/admin/api/v1/retention/tenants/c")).json()
            assert (c["payload_max_age"], c["payload_origin"]) == (60, "api")
            assert c["config"]["payload_max_age"] == 3600
    finally:
        await b.close()


@pytest.fixture
def cli() -> Iterator[Invoke]:
    yield from cli_runner()


async def test_cli_sets_shows_and_clears_a_tenants_ages(
    box: Relaybox, database_url: str, cli: Invoke
) -> None:
    db = ("--database-url", database_url)
    out = await cli("retention", "set", "acme", "--payload-max-age", "7d", "--json", *db)
    shown = json.loads(out.stdout)
    assert (shown["payload_max_age"], shown["payload_origin"]) == (7 * DAY, "api")
    assert shown["api"]["updated_by"].startswith("cli:")
    stored = await box.store.retention.policy_get("acme")
    assert stored is not None and stored.payload_max_age == 7 * DAY
    out = await cli("retention", "show", *db)
    assert "acme: events 7d 0h (api)" in out.stdout
    assert "global: events 30d 0h" in out.stdout
    bad = await cli("retention", "set", "acme", "--payload-max-age", "30s", "--json", *db, code=2)
    assert "--payload-max-age: at least 1m 0s" in bad.stdout
    # No age given: a usage error, before the database is asked.
    empty = await cli("retention", "set", "acme", "--json", *db, code=2)
    assert json.loads(empty.stdout)["error"] == "usage"
    out = await cli("retention", "clear", "acme", "--json", *db)
    assert json.loads(out.stdout)["payload_origin"] == "default"
    gone = await cli("retention", "clear", "acme", "--json", *db, code=1)
    assert json.loads(gone.stdout)["error"] == "not_found"
    assert await box.store.retention.policy_get("acme") is None


async def test_the_maintenance_loops_scans_start_where_they_ended(
    box: Relaybox, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenant keeping longer than the global age makes the last pass a scan; the
    loop's next run starts it where the previous one ended (the rows it left are
    that tenant's, purged by its own pass when due), and a new age reads from the
    start."""
    async for client in api(box):
        r = await client.put(
            "/admin/api/v1/retention/tenants/long", json={"payload_max_age": 60 * DAY}
        )
        assert r.status_code == 200
    start = clock.now()
    await finished_history(box, clock)
    starts: list[tuple[str, str | None, Any]] = []
    scan = box.store.retention.scan

    async def spy(table: Any, **kw: Any) -> Any:
        starts.append((table, kw.get("source"), kw["after"]))
        return await scan(table, **kw)

    monkeypatch.setattr(box.store.retention, "scan", spy)
    maintenance = Maintenance(box)
    clock.set(start + 40 * DAY)
    await maintenance.run_once()
    inbox_default = [a for t, s, a in starts if t == "inbox" and s is None]
    assert inbox_default[0] is None  # the first run reads from the start
    assert (await kept(box))["inbox"] == {"long-1", "gh-long"}
    starts.clear()
    clock.set(start + 41 * DAY)
    await maintenance.run_once()
    inbox_default = [a for t, s, a in starts if t == "inbox" and s is None]
    assert inbox_default[0] == (start + 10 * DAY, 0)  # where the last one ended
    starts.clear()
    async for client in api(box):
        r = await client.put(
            "/admin/api/v1/retention/tenants/long", json={"payload_max_age": 50 * DAY}
        )
    clock.set(start + 51 * DAY)
    await maintenance.run_once()
    assert next(a for t, s, a in starts if t == "inbox" and s is None) is None  # new ages
    assert (await kept(box))["inbox"] == set()
