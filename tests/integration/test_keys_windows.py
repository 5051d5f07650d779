"""Keys windows (retention.keys_max_age, a source's, a tenant's): keys are kept for good
by default; a window set globally, per source (its events' keys and its handlers'
business keys) or per tenant (its messages' idempotency keys: in the file or through
the admin API, the dashboard and ``relaybox retention set --keys-max-age``) makes the
maintenance purge forget the keys first seen longer ago, each at its own scope's age.
Both backends."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

from relaybox import Context, FrozenClock, Relaybox
from relaybox.admin import build_admin
from relaybox.config import Settings
from relaybox.retention import purge
from relaybox.retention.policy import KeysPass, RetentionPolicies, keys_plan
from relaybox.store import NewDelivery
from relaybox.store.inbox_rows import NewOperation
from relaybox.store.keys import day_of, scope_of
from tests.integration.test_ops_cli import Invoke, cli_runner
from tests.support.outbound_app import local, publish_one

DAY = 86400.0
TOKEN = "test-admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def delivery(event_id: str, source: str, when: float) -> NewDelivery:
    raw = json.dumps({"id": event_id}).encode()
    return NewDelivery(
        source=source,
        account="a",
        event_id=event_id,
        event_type="ok",
        tenant=None,
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
            await ctx.once(f"op:{ctx.event.event_id}", fingerprint="same")

    return box


@pytest.fixture
async def box(database_url: str, clock: FrozenClock) -> AsyncIterator[Relaybox]:
    b = make_box(
        database_url,
        clock,
        keys_max_age=10 * DAY,
        sources={"github": {"keys_max_age": 40 * DAY}},
        tenants={"short": {"keys_max_age": 2 * DAY}},
    )
    await b.store.migrate()
    yield b
    await b.close()


async def api(box: Relaybox) -> AsyncIterator[httpx.AsyncClient]:
    app = Starlette(routes=[Mount("/admin", app=build_admin(box))])
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://admin.test", headers=AUTH
    ) as client:
        yield client


async def scopes(box: Relaybox, table: str) -> list[int]:
    rows = await box.store.fetch_all(f"SELECT scope FROM {table} ORDER BY scope")
    return [r["scope"] for r in rows]


def test_keys_plan_orders_scopes_then_the_global_window() -> None:
    now = 100 * DAY
    assert keys_plan(RetentionPolicies(30 * DAY, 30 * DAY), now) == []  # kept for good
    policies = RetentionPolicies(
        30 * DAY,
        30 * DAY,
        keys_max_age=10 * DAY,
        sources_keys={"long": 40 * DAY, "brief": 2 * DAY},
        tenants_keys={"t": 60 * DAY},
    )
    assert keys_plan(policies, now) == [
        KeysPass("event", 98, scope="brief"),
        KeysPass("event", 60, scope="long"),
        KeysPass("event", 90, keep=("long",)),
        KeysPass("message", 40, scope="t"),
        KeysPass("message", 90, keep=("t",)),
        KeysPass("operation", 98, scope="brief"),
        KeysPass("operation", 60, scope="long"),
        KeysPass("operation", 90, keep=("long",)),
        KeysPass("outbox", 40),  # no scope: the longest window of all (t's)
    ]
    # A source's window alone: only its keys expire, the rest are kept for good.
    alone = RetentionPolicies(30 * DAY, 30 * DAY, sources_keys={"s": 5 * DAY})
    assert [p.kind for p in keys_plan(alone, now)] == ["event", "operation"]


async def test_each_scope_forgets_its_keys_at_its_own_age(
    box: Relaybox, clock: FrozenClock
) -> None:
    async for client in api(box):
        r = await client.put(
            "/admin/api/v1/retention/tenants/long", json={"keys_max_age": 60 * DAY}
        )
        assert r.status_code == 200, r.text
        assert (r.json()["keys_max_age"], r.json()["keys_origin"]) == (60 * DAY, "api")
    local(box)
    await box.store.inbox.accept(
        [delivery("s-1", "stripe", clock.now()), delivery("g-1", "github", clock.now())]
    )
    await box.worker().run_once()
    for tenant in ("short", "long", "other"):
        await publish_one(box, tenant=tenant, data={"t": tenant}, idempotency_key="k")
    assert len(await scopes(box, "relaybox_business_keys")) == 2
    assert len(await scopes(box, "relaybox_message_keys")) == 3

    clock.advance(5 * DAY)  # short's 2 days passed
    assert (await purge(box)).keys == 1
    assert sorted(await scopes(box, "relaybox_message_keys")) == sorted(
        [scope_of("long"), scope_of("other")]
    )
    clock.advance(15 * DAY)  # day 20: the global 10 days passed (stripe, other)
    result = await purge(box)
    assert result.keys == 3
    assert await scopes(box, "relaybox_event_keys") == [scope_of("github")]
    assert await scopes(box, "relaybox_business_keys") == [scope_of("github")]
    assert await scopes(box, "relaybox_message_keys") == [scope_of("long")]
    # Forgotten: the business key of stripe's event happens again.
    async with box.store.transaction() as conn:
        created, _ = await box.store.inbox.operation_insert(
            conn,
            NewOperation(
                business_key="op:s-1",
                fingerprint="same",
                inbox_id=None,
                source="stripe",
                tenant=None,
                now=clock.now(),
            ),
        )
        again, _ = await box.store.inbox.operation_insert(
            conn,
            NewOperation(
                business_key="op:g-1",
                fingerprint="same",
                inbox_id=None,
                source="github",
                tenant=None,
                now=clock.now(),
            ),
        )
    assert (created, again) == (True, False)
    clock.advance(30 * DAY)  # day 50: github's 40 days passed (and stripe's day-20 key)
    assert (await purge(box)).keys == 3
    assert await scopes(box, "relaybox_event_keys") == []
    assert await scopes(box, "relaybox_business_keys") == []
    assert await scopes(box, "relaybox_message_keys") == [scope_of("long")]
    [k] = await box.store.fetch_all("SELECT first_seen FROM relaybox_message_keys")
    assert k["first_seen"] == day_of(clock.now() - 50 * DAY)


async def test_keys_are_kept_for_good_by_default(database_url: str, clock: FrozenClock) -> None:
    box = make_box(database_url, clock)
    try:
        await box.store.migrate()
        await box.store.inbox.accept([delivery("s-1", "stripe", clock.now())])
        await box.worker().run_once()
        clock.advance(3000 * DAY)
        assert (await purge(box)).keys == 0
        assert len(await scopes(box, "relaybox_event_keys")) == 1
        assert len(await scopes(box, "relaybox_business_keys")) == 1
    finally:
        await box.close()


async def test_admin_api_shows_and_validates_keys_windows(box: Relaybox) -> None:
    base = "/admin/api/v1/retention"
    async for client in api(box):
        overview = (await client.get(base)).json()
        assert overview["keys_max_age"] == 10 * DAY
        [github] = overview["sources"]
        assert (github["source"], github["keys_max_age"]) == ("github", 40 * DAY)
        assert github["payload_max_age"] == 30 * DAY  # no age of its own: the global one
        short = (await client.get(f"{base}/tenants/short")).json()
        assert (short["keys_max_age"], short["keys_origin"]) == (2 * DAY, "config")
        nobody = (await client.get(f"{base}/tenants/nobody")).json()
        assert (nobody["keys_max_age"], nobody["keys_origin"]) == (10 * DAY, "default")
        for bad in ({"keys_max_age": 3600}, {"keys_max_age": "30d"}, {"keys_max_age": True}):
            r = await client.put(f"{base}/tenants/acme", json=bad)
            assert r.status_code == 400, (bad, r.text)
        r = await client.put(f"{base}/tenants/acme", json={"keys_max_age": 90 * DAY})
        assert r.status_code == 200, r.text
        assert r.json()["api"]["keys_max_age"] == 90 * DAY
        assert r.json()["payload_max_age"] is None  # only the keys window set here
        stored = await box.store.retention.policy_get("acme")
        assert stored is not None and stored.keys_max_age == 90 * DAY
        assert stored.payload_max_age is None and stored.outbox_payload_max_age is None
        r = await client.delete(f"{base}/tenants/acme")
        assert (r.json()["keys_max_age"], r.json()["keys_origin"]) == (10 * DAY, "default")


@pytest.fixture
def cli() -> Iterator[Invoke]:
    yield from cli_runner()


async def test_cli_sets_shows_and_clears_a_tenants_keys_window(
    box: Relaybox, database_url: str, cli: Invoke
) -> None:
    db = ("--database-url", database_url)
    out = await cli("retention", "set", "acme", "--keys-max-age", "90d", "--json", *db)
    shown = json.loads(out.stdout)
    assert (shown["keys_max_age"], shown["keys_origin"]) == (90 * DAY, "api")
    stored = await box.store.retention.policy_get("acme")
    assert stored is not None and stored.keys_max_age == 90 * DAY
    out = await cli("retention", "show", *db)
    assert "acme: " in out.stdout and "idempotency keys 90d 0h (api)" in out.stdout
    assert "keys for good" in out.stdout  # no configuration file given: the default
    bad = await cli("retention", "set", "acme", "--keys-max-age", "1h", "--json", *db, code=2)
    assert "--keys-max-age: at least 1d 0h" in bad.stdout
    out = await cli("retention", "clear", "acme", "--json", *db)
    assert json.loads(out.stdout)["keys_origin"] == "default"
    assert await box.store.retention.policy_get("acme") is None


async def test_cli_purge_forgets_keys_past_the_files_window(
    database_url: str, cli: Invoke, tmp_path: Any
) -> None:
    config = tmp_path / "relaybox.toml"
    config.write_text("[retention]\nkeys_max_age = 86400.0\n")
    box = Relaybox(settings=Settings(database_url=database_url))
    try:
        await box.store.migrate()
        old = time.time() - 10 * DAY
        await box.store.inbox.accept([delivery("old", "stripe", old)])
        await box.store.inbox.accept([delivery("new", "stripe", time.time())])
        out = await cli("purge", "--config", str(config), "--database-url", database_url)
        assert "forgot 1 key(s) past their keys window" in out.stdout
        [kept] = await box.store.fetch_all("SELECT first_seen FROM relaybox_event_keys")
        assert kept["first_seen"] == day_of(time.time())
    finally:
        await box.close()


# Two names on one 32-bit scope number (found by search: scope_of(a) == scope_of(b)).
COLLIDING = ("src34860", "src82798")


def test_the_colliding_names_share_a_scope() -> None:
    assert scope_of(COLLIDING[0]) == scope_of(COLLIDING[1])
    assert -(2**31) <= scope_of(COLLIDING[0]) < 2**31


def test_keys_plan_gives_names_on_one_scope_the_longest_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Names with a window of their own that share a scope number: one pass at the
    longest of their windows, and the global pass keeps that number when any of them
    keeps longer than it (a key is never forgotten before its own window says)."""
    now = 100 * DAY
    short, long = COLLIDING
    policies = RetentionPolicies(
        30 * DAY,
        30 * DAY,
        keys_max_age=10 * DAY,
        tenants_keys={short: 2 * DAY, long: 60 * DAY, "t": 5 * DAY},
    )
    assert [p for p in keys_plan(policies, now) if p.kind == "message"] == [
        KeysPass("message", 40, scope=short),  # long's 60 days, for both
        KeysPass("message", 95, scope="t"),
        KeysPass("message", 90, keep=(short,)),
    ]
    # Forced: every name on one number (the plan does not depend on which collide).
    from relaybox.store import keys

    monkeypatch.setattr(keys, "scope_of", lambda name: 7)
    forced = RetentionPolicies(
        30 * DAY,
        30 * DAY,
        keys_max_age=10 * DAY,
        sources_keys={"a": 2 * DAY, "b": 5 * DAY},
    )
    assert [p for p in keys_plan(forced, now) if p.kind == "event"] == [
        KeysPass("event", 95, scope="a"),
        KeysPass("event", 90, keep=()),  # 5 days: the global 10 forgets later
    ]
    forced = RetentionPolicies(
        30 * DAY, 30 * DAY, keys_max_age=10 * DAY, sources_keys={"a": 2 * DAY, "b": 50 * DAY}
    )
    assert [p for p in keys_plan(forced, now) if p.kind == "event"] == [
        KeysPass("event", 50, scope="a"),
        KeysPass("event", 90, keep=("a",)),
    ]


async def test_tenants_on_one_scope_keep_their_keys_for_the_longer_window(
    database_url: str, clock: FrozenClock
) -> None:
    short, long = COLLIDING
    box = make_box(
        database_url,
        clock,
        keys_max_age=10 * DAY,
        tenants={short: {"keys_max_age": 2 * DAY}, long: {"keys_max_age": 60 * DAY}},
    )
    try:
        await box.store.migrate()
        local(box)
        for tenant in (short, long, "other"):
            await publish_one(box, tenant=tenant, data={"t": tenant}, idempotency_key="k")
        clock.advance(20 * DAY)  # short's 2 days and the global 10 passed
        assert (await purge(box)).keys == 1  # other's only: short's follows long's 60
        assert await scopes(box, "relaybox_message_keys") == [scope_of(long)] * 2
        clock.advance(50 * DAY)  # day 70: long's 60 days passed
        assert (await purge(box)).keys == 2
        assert await scopes(box, "relaybox_message_keys") == []
    finally:
        await box.close()


def test_two_sources_on_one_scope_are_refused() -> None:
    from relaybox import ConfigurationError, sources

    box = Relaybox(settings=Settings())
    box.source(COLLIDING[0], sources.standard(secrets=["s" * 32]))
    with pytest.raises(ConfigurationError) as info:
        box.source(COLLIDING[1], sources.standard(secrets=["s" * 32]))
    assert COLLIDING[0] in str(info.value) and COLLIDING[1] in str(info.value)
    assert "scope" in str(info.value)
    assert list(box.sources) == [COLLIDING[0]]
    box.source(COLLIDING[0], sources.standard(secrets=["t" * 32]))  # itself again: fine
    # Named by the file: its sources, or two sources' keys windows.
    declared = {name: {"provider": "standard", "secrets": ["s" * 32]} for name in COLLIDING}
    with pytest.raises(ConfigurationError, match=COLLIDING[1]):
        Relaybox(settings=Settings(sources=declared))
    windows = {name: {"keys_max_age": 5 * DAY} for name in COLLIDING}
    with pytest.raises(ConfigurationError, match=COLLIDING[0]):
        Relaybox(settings=Settings(retention={"sources": windows}))
    # ... and a window for a name sharing the scope of a registered source.
    with pytest.raises(ConfigurationError, match=COLLIDING[1]):
        box.settings = Settings(retention={"sources": {COLLIDING[1]: windows[COLLIDING[1]]}})
