"""The admin JSON API: every route refuses without the token; with it, answers match
the OpenAPI document (property tests drawn from the document itself); the operator
flows (filters and pages, event detail, replay, dead letters, quarantine, and the
outbound sections against real deliveries to a local receiver) on both backends; and
the committed document is current."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from starlette.applications import Starlette
from starlette.routing import Mount

from relaybox import Context, FrozenClock, PermanentError, Relaybox
from relaybox.admin import build_admin
from relaybox.admin.openapi import REGENERATE, openapi_document, render
from relaybox.config import Settings
from relaybox.outbound.catalog import define_event_type
from relaybox.store import NewDelivery
from tests.support.outbound_app import endpoint, local, outbox_rows, publish_one
from tests.support.receivers import HttpReceiver, Reply

TOKEN = "test-admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DOC = openapi_document()
OPERATIONS = [
    (method.upper(), path, op)
    for path, item in sorted(DOC["paths"].items())
    for method, op in sorted(item.items())
]


def delivery(clock: FrozenClock, event_id: str, event_type: str, body: Any, **kw: Any) -> Any:
    raw = json.dumps(body).encode()
    fields = {
        "source": "s",
        "account": "a",
        "event_id": event_id,
        "event_type": event_type,
        "tenant": "t",
        "fingerprint": hashlib.sha256(raw).digest(),
        "payload": raw,
        "headers": json.dumps({"x-test": "1"}),
        "version": None,
        "received_at": clock.now(),
    }
    fields.update(kw)
    return NewDelivery(**fields)


async def seed(box: Relaybox, clock: FrozenClock) -> dict[str, int]:
    """done (with a business key and an outbox row), dead invalid, dead unhandled,
    pending, a quarantined copy of the done one; returns inbox ids by name."""

    @box.handler("s", "ok")
    async def ok(ctx: Context) -> None:
        await ctx.once(f"s:{ctx.payload['n']}:grant", fingerprint="100")
        await ctx.outbox.add("email", f"s:{ctx.payload['n']}:mail", {"n": ctx.payload["n"]})

    @box.handler("s", "bad")
    async def bad(ctx: Context) -> None:
        raise PermanentError("invoice has no customer")

    await box.store.inbox.accept(
        [
            delivery(clock, "ok-1", "ok", {"n": 1, "items": [1, 2]}),
            delivery(clock, "bad-1", "bad", {"n": 2}),
            delivery(clock, "lost-1", "mystery", {"n": 3}, tenant="t2", source="other"),
        ]
    )
    await box.worker().run_once()
    clock.advance(60)
    await box.store.inbox.accept(
        [
            delivery(clock, "ok-1", "ok", {"n": 1, "items": [1, 3], "extra": True}),
            delivery(clock, "new-1", "ok", {"n": 4}),
        ]
    )
    rows = await box.store.fetch_all("SELECT id, event_id FROM relaybox_inbox")
    return {r["event_id"]: r["id"] for r in rows}


@pytest.fixture
async def admin(database_url: str, clock: FrozenClock) -> AsyncIterator[tuple[Relaybox, Any]]:
    box = Relaybox(settings=Settings(database_url=database_url, admin_token=TOKEN), clock=clock)
    app = Starlette(routes=[Mount("/admin", app=build_admin(box))])
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://admin.test"
    ) as client:
        yield box, client
    await box.close()


def concrete(path: str, ids: dict[str, int] | None = None) -> str:
    return re.sub(r"{\w+}", str(min((ids or {"x": 1}).values())), path)


# -- 401 everywhere ---------------------------------------------------------------


@pytest.fixture
async def closed_client(tmp_path: Path) -> AsyncIterator[Any]:
    """The admin app over a database that is never opened: the token is checked
    before routing, so refusing needs no database (and no backend parameter)."""
    box = Relaybox(
        settings=Settings(database_url=f"sqlite:///{tmp_path}/unused.db", admin_token=TOKEN)
    )
    app = Starlette(routes=[Mount("/admin", app=build_admin(box))])
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://admin.test"
    ) as client:
        yield client
    await box.close()
    assert not (tmp_path / "unused.db").exists()


@pytest.mark.parametrize(("method", "path", "op"), OPERATIONS, ids=lambda v: str(v)[:40])
async def test_every_route_refuses_without_the_token(
    closed_client: Any, method: str, path: str, op: dict[str, Any]
) -> None:
    url = "/admin/api/v1" + concrete(path)
    wrong = ({}, {"Authorization": "Bearer wrong-token-0000000000"}, {"Authorization": TOKEN})
    for headers in wrong:
        response = await closed_client.request(method, url, headers=headers, json={"reason": "x"})
        assert response.status_code == 401, (method, path, headers)
        assert response.headers["www-authenticate"].startswith("Bearer")
        body = response.json()
        assert body["error"] == "unauthorized"
        validate(op, 401, body)


async def test_unknown_admin_paths_refuse_before_routing(admin: tuple[Relaybox, Any]) -> None:
    _, client = admin
    assert (await client.get("/admin/api/v1/nothing-here")).status_code == 401
    assert (await client.get("/admin/api/v1/nothing-here", headers=AUTH)).status_code == 404
    assert (await client.get("/admin/anything")).status_code == 401  # the login page


async def test_without_a_configured_token_admin_is_closed(database_url: str) -> None:
    box = Relaybox(settings=Settings(database_url=database_url))
    app = Starlette(routes=[Mount("/admin", app=build_admin(box))])
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://admin.test"
    ) as client:
        response = await client.get("/admin/api/v1/stats", headers={"Authorization": "Bearer "})
        login = await client.post("/admin/login", data={"token": ""})
    await box.close()
    assert response.status_code == 401
    assert "admin_token is not configured" in response.json()["message"]
    assert login.status_code == 401 and "admin_token is not configured" in login.text


# -- the documented shapes, property-tested from the document -------------------


def validate(op: dict[str, Any], status: int, body: Any) -> None:
    documented = op["responses"].get(str(status))
    assert documented is not None, f"{op['operationId']} answered undocumented {status}: {body}"
    schema = documented["content"]["application/json"]["schema"]
    Draft202012Validator({**schema, "components": DOC["components"]}).validate(body)


def resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = DOC["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def from_schema(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values valid for the JSON Schema subset pydantic emits here."""
    schema = resolve(schema)
    if "anyOf" in schema or "oneOf" in schema:
        return st.one_of([from_schema(s) for s in schema.get("anyOf", schema.get("oneOf"))])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "const" in schema:
        return st.just(schema["const"])
    kind = schema.get("type")
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        return st.integers(schema.get("minimum", -5), schema.get("maximum", 10**6))
    if kind == "number":
        return st.floats(1.7e9, 1.9e9, allow_nan=False)
    if kind == "string":
        return st.text(
            min_size=schema.get("minLength", 0), max_size=min(schema.get("maxLength", 20), 20)
        )
    if kind == "array":
        return st.lists(
            from_schema(schema["items"]), min_size=schema.get("minItems", 0), max_size=3
        )
    if kind == "object":
        props = schema.get("properties", {})
        required = set(schema.get("required", []))
        return st.fixed_dictionaries(
            {k: from_schema(v) for k, v in props.items() if k in required},
            optional={k: from_schema(v) for k, v in props.items() if k not in required},
        )
    raise AssertionError(f"no strategy for {schema}")


def query_text(value: Any) -> str:
    return json.dumps(value) if isinstance(value, bool) else str(value)


@st.composite
def requests(draw: st.DrawFn, ids: list[int]) -> tuple[dict[str, Any], str, str, Any, Any]:
    method, path, op = draw(st.sampled_from(OPERATIONS))
    identifier = draw(st.sampled_from(ids) | st.integers(0, 10**6))
    url = "/admin/api/v1" + re.sub(r"{\w+}", str(identifier), path)
    params = {}
    for p in op.get("parameters", []):
        if p["in"] == "query" and draw(st.booleans()):
            value = draw(from_schema(p["schema"]))
            if value is not None:
                params[p["name"]] = query_text(value)
    body = None
    if "requestBody" in op:
        schema = op["requestBody"]["content"]["application/json"]["schema"]
        # Mostly valid bodies, sometimes anything at all: both must get a documented answer.
        body = draw(
            from_schema(schema)
            | st.none()
            | st.integers()
            | st.dictionaries(st.text(max_size=5), st.integers(), max_size=2)
        )
    return op, method, url, params, body


@pytest.fixture
async def seeded(
    admin: tuple[Relaybox, Any], clock: FrozenClock
) -> tuple[Relaybox, Any, list[int]]:
    box, client = admin
    return box, client, list((await seed(box, clock)).values())


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
async def test_answers_match_the_openapi_document(
    seeded: tuple[Relaybox, Any, list[int]], data: st.DataObject
) -> None:
    """One seeded database for every example (hypothesis reuses the fixture): actions
    change it as the run goes, so later examples meet retried, discarded and
    resolved rows too; every answer must still be one the document describes."""
    _, client, ids = seeded
    op, method, url, params, body = data.draw(requests(ids))
    kwargs: dict[str, Any] = {"params": params, "headers": AUTH}
    if body is not None or "requestBody" in op:
        kwargs["content"] = json.dumps(body)
    response = await client.request(method, url, **kwargs)
    event(f"{op['operationId']} -> {response.status_code}")  # --hypothesis-show-statistics
    assert response.headers["content-type"].startswith("application/json")
    validate(op, response.status_code, response.json())
    assert response.status_code < 500


# -- operator flows ---------------------------------------------------------------


async def test_filters_and_cursor_pages(admin: tuple[Relaybox, Any], clock: FrozenClock) -> None:
    box, client = admin
    ids = await seed(box, clock)

    async def listing(**params: Any) -> list[str]:
        r = await client.get("/admin/api/v1/inbox", params=params, headers=AUTH)
        assert r.status_code == 200, r.text
        return [e["event_id"] for e in r.json()["items"]]

    def newest_first(*names: str) -> list[str]:
        # Ids follow insertion order within the store's batch, not the test's list.
        return sorted(names, key=lambda n: -ids[n])

    assert await listing() == newest_first("new-1", "lost-1", "bad-1", "ok-1")
    assert await listing(status="dead") == newest_first("lost-1", "bad-1")
    assert await listing(source="other") == ["lost-1"]
    assert await listing(type="ok") == ["new-1", "ok-1"]  # ok-1 came a minute earlier
    assert await listing(tenant="t2") == ["lost-1"]
    assert await listing(since=clock.now()) == ["new-1"]
    assert await listing(until=clock.now()) == newest_first("lost-1", "bad-1", "ok-1")
    seen, cursor = [], None
    while True:
        params = {"limit": 1} | ({"cursor": cursor} if cursor else {})
        page = (await client.get("/admin/api/v1/inbox", params=params, headers=AUTH)).json()
        seen += [e["id"] for e in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == sorted(ids.values(), reverse=True)
    bad = await client.get("/admin/api/v1/inbox", params={"cursor": "nope"}, headers=AUTH)
    assert bad.status_code == 400 and bad.json()["error"] == "invalid_request"
    typo = await client.get("/admin/api/v1/inbox", params={"stauts": "dead"}, headers=AUTH)
    assert typo.status_code == 400


async def test_event_detail_has_attempts_keys_outbox_and_quarantine(
    admin: tuple[Relaybox, Any], clock: FrozenClock
) -> None:
    box, client = admin
    ids = await seed(box, clock)
    e = (await client.get(f"/admin/api/v1/inbox/{ids['ok-1']}", headers=AUTH)).json()
    assert e["status"] == "done" and e["payload"] == {"n": 1, "items": [1, 2]}
    assert e["headers"] == {"x-test": "1"}
    assert e["attempt_log"] == []  # a first-try success is recorded on the row alone
    assert [k["business_key"] for k in e["business_keys"]] == ["s:1:grant"]
    assert [(o["channel"], o["key"]) for o in e["outbox"]] == [("email", "s:1:mail")]
    assert len(e["quarantine"]) == 1
    dead = (await client.get(f"/admin/api/v1/inbox/{ids['bad-1']}", headers=AUTH)).json()
    assert dead["dead_reason"] == "invalid"
    assert [(a["attempt"], a["outcome"], a["error"]) for a in dead["attempt_log"]] == [
        (1, "invalid", "invoice has no customer")
    ]
    missing = await client.get("/admin/api/v1/inbox/999999", headers=AUTH)
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"


async def test_dead_letters_retry_one_many_and_discard(
    admin: tuple[Relaybox, Any], clock: FrozenClock
) -> None:
    box, client = admin
    ids = await seed(box, clock)
    dead = (await client.get("/admin/api/v1/dead", headers=AUTH)).json()["items"]
    assert {e["event_id"]: e["dead_reason"] for e in dead} == {
        "bad-1": "invalid",
        "lost-1": "unhandled",
    }
    only = await client.get("/admin/api/v1/dead", params={"reason": "unhandled"}, headers=AUTH)
    assert [e["event_id"] for e in only.json()["items"]] == ["lost-1"]

    body = {"reason": "handler fixed", "actor": "alice"}
    retried = await client.post(f"/admin/api/v1/dead/{ids['bad-1']}/retry", json=body, headers=AUTH)
    assert retried.status_code == 200, retried.text
    assert retried.json()["replayed"] == [ids["bad-1"]]
    again = await client.post(f"/admin/api/v1/dead/{ids['bad-1']}/retry", json=body, headers=AUTH)
    assert again.status_code == 409 and again.json()["error"] == "not_dead"
    e = (await client.get(f"/admin/api/v1/inbox/{ids['bad-1']}", headers=AUTH)).json()
    assert e["status"] == "pending" and e["attempts"] == 0
    assert [(r["actor"], r["reason"], r["previous_status"]) for r in e["replays"]] == [
        ("alice", "handler fixed", "dead")
    ]

    no_reason = await client.post(
        f"/admin/api/v1/dead/{ids['lost-1']}/discard", json={}, headers=AUTH
    )
    assert no_reason.status_code == 400
    discarded = await client.post(
        f"/admin/api/v1/dead/{ids['lost-1']}/discard",
        json={"reason": "test event from a sandbox"},
        headers=AUTH,
    )
    assert discarded.status_code == 200 and discarded.json()["id"] == ids["lost-1"]
    assert (await client.get("/admin/api/v1/dead", headers=AUTH)).json()["items"] == []
    stats = (await client.get("/admin/api/v1/stats", headers=AUTH)).json()
    assert (stats["dead"], stats["discarded"]) == (0, 1)

    await box.worker().run_once()  # bad-1 dies again: retry them all by filter
    many = await client.post(
        "/admin/api/v1/dead/retry",
        json={"reason": "bulk", "source": "s", "dead_reason": "invalid"},
        headers=AUTH,
    )
    assert many.status_code == 200
    assert many.json()["matched"] == 1 and many.json()["replayed"] == [ids["bad-1"]]


async def test_quarantine_compare_and_resolve(
    admin: tuple[Relaybox, Any], clock: FrozenClock
) -> None:
    box, client = admin
    ids = await seed(box, clock)
    [entry] = (await client.get("/admin/api/v1/quarantine", headers=AUTH)).json()["items"]
    assert entry["inbox_id"] == ids["ok-1"] and entry["original_status"] == "done"
    q = (await client.get(f"/admin/api/v1/quarantine/{entry['id']}", headers=AUTH)).json()
    assert q["original"]["payload"] == {"n": 1, "items": [1, 2]}
    assert q["quarantined"]["payload"] == {"n": 1, "items": [1, 3], "extra": True}
    assert [(d["path"], d["change"]) for d in q["differences"]] == [
        ("$.items[1]", "changed"),
        ("$.extra", "added"),
    ]
    body = {"resolution": "kept_original", "reason": "provider resent with new fields"}
    url = f"/admin/api/v1/quarantine/{entry['id']}/resolve"
    resolved = await client.post(url, json=body, headers=AUTH)
    assert resolved.status_code == 200 and resolved.json()["resolution"] == "kept_original"
    assert (await client.post(url, json=body, headers=AUTH)).status_code == 409
    assert (await client.get("/admin/api/v1/quarantine", headers=AUTH)).json()["items"] == []
    everything = await client.get(
        "/admin/api/v1/quarantine", params={"resolved": "true"}, headers=AUTH
    )
    [done] = everything.json()["items"]
    assert done["resolved_by"] == "admin-api"
    original = (await client.get(f"/admin/api/v1/inbox/{ids['ok-1']}", headers=AUTH)).json()
    assert original["payload"] == {"n": 1, "items": [1, 2]}  # never overwritten


async def test_replay_of_a_finished_event(admin: tuple[Relaybox, Any], clock: FrozenClock) -> None:
    box, client = admin
    ids = await seed(box, clock)
    url = f"/admin/api/v1/inbox/{ids['ok-1']}/replay"
    r = await client.post(url, json={"reason": "check the grant"}, headers=AUTH)
    assert r.status_code == 200 and r.json()["replayed"] == [ids["ok-1"]]
    pending = await client.post(url, json={"reason": "twice"}, headers=AUTH)
    assert pending.status_code == 409 and pending.json()["error"] == "pending"
    await box.worker().run_once()
    keys = await box.store.fetch_all("SELECT business_key FROM relaybox_operations")
    # new-1 ran for the first time; the replayed ok-1 found its grant already recorded.
    assert sorted(k["business_key"] for k in keys) == ["s:1:grant", "s:4:grant"]
    selection = await client.post(
        "/admin/api/v1/replay", json={"reason": "all done ones", "statuses": ["done"]}, headers=AUTH
    )
    assert selection.status_code == 200
    assert sorted(selection.json()["replayed"]) == sorted([ids["ok-1"], ids["new-1"]])
    empty = await client.post("/admin/api/v1/replay", json={"reason": "x"}, headers=AUTH)
    assert empty.status_code == 400  # a replay needs a selection


def test_the_committed_openapi_document_is_current() -> None:
    committed = Path(__file__).parents[2] / "docs" / "admin-openapi.json"
    assert committed.exists(), f"docs/admin-openapi.json is missing: run `{REGENERATE}`"
    assert committed.read_text() == render(DOC), (
        f"docs/admin-openapi.json is stale: run `{REGENERATE}` and commit it"
    )


def test_ops_queries_have_the_same_names_and_parameters_on_both_backends() -> None:
    """``postgres_ops.sql`` ($n) and ``sqlite_ops.sql`` (?n) must define the same
    blocks with the same parameter numbers: the callers pass one tuple to either."""
    from relaybox.store.backend import load_queries

    pg = {k: v for k, v in load_queries("postgres").items() if k.startswith("ops_")}
    lite = {k: v for k, v in load_queries("sqlite").items() if k.startswith("ops_")}
    # The maintenance lock is PostgreSQL's own (store/postgres.py); SQLite needs none.
    postgres_only = {"ops_maintenance_try_lock", "ops_maintenance_unlock"}
    assert pg.keys() - postgres_only == lite.keys()
    for name in lite:
        numbers_pg = sorted({int(n) for n in re.findall(r"\$(\d+)", pg[name])})
        numbers_lite = sorted({int(n) for n in re.findall(r"\?(\d+)", lite[name])})
        assert numbers_pg == numbers_lite, name
        assert "?" not in re.sub(r"\?\d+", "", lite[name]), f"{name}: use numbered ?n"


async def test_nul_characters_are_refused_not_a_server_error(
    admin: tuple[Relaybox, Any], clock: FrozenClock
) -> None:
    """Found by the property test: PostgreSQL text cannot hold U+0000, so it is a 400
    (or a 404 for an id), never a 500 from the database."""
    box, client = admin
    ids = await seed(box, clock)
    bad_reason = await client.post(
        f"/admin/api/v1/dead/{ids['bad-1']}/retry", json={"reason": "a\x00b"}, headers=AUTH
    )
    assert bad_reason.status_code == 400
    bad_filter = await client.get("/admin/api/v1/inbox", params={"source": "\x00"}, headers=AUTH)
    assert bad_filter.status_code == 400
    bad_id = await client.get("/admin/api/v1/messages/%00", headers=AUTH)
    assert bad_id.status_code == 404


# -- the outbound sections (endpoints, messages) -----------------------------------


async def test_endpoints_and_messages_through_the_admin(
    database_url: str, clock: FrozenClock
) -> None:
    box = Relaybox(settings=Settings(database_url=database_url, admin_token=TOKEN), clock=clock)
    local(box)
    dispatcher = box.dispatcher()
    app = Starlette(routes=[Mount("/admin", app=build_admin(box))])
    try:
        async with (
            HttpReceiver([Reply(200), Reply(500)]) as receiver,
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://admin.test"
            ) as client,
        ):
            endpoint_id, _ = await endpoint(box, receiver.url, tenant="t1")
            await define_event_type(
                box, "pet.adopted", description="a pet found a home", schema={"type": "object"}
            )
            first = await publish_one(box, "pet.adopted", {"petId": "p1"})
            clock.advance(1)  # newest first is by publication time
            second = await publish_one(box, "pet.adopted", {"petId": "p2"})
            assert await dispatcher.run_once() == 2
            api = await _api(client, endpoint_id, first.id, second.id)
            pages = await _pages(client, endpoint_id, first.id)
    finally:
        await dispatcher.close()
        await box.close()
    assert api and pages


async def _api(client: Any, endpoint_id: str, first: str, second: str) -> bool:
    listed = (await client.get("/admin/api/v1/endpoints", headers=AUTH)).json()["items"]
    [e] = listed
    assert e["id"] == endpoint_id and e["tenant"] == "t1"
    assert (e["health"]["attempts"], e["health"]["succeeded"]) == (2, 1)
    assert e["health"]["success_rate"] == 0.5
    assert e["health"]["pending"] == 1  # the 500 is retried later
    detail = (await client.get(f"/admin/api/v1/endpoints/{endpoint_id}", headers=AUTH)).json()
    assert sorted(a["status_code"] for a in detail["recent_attempts"]) == [200, 500]
    gone = await client.get("/admin/api/v1/endpoints/ep_nope", headers=AUTH)
    assert gone.status_code == 404 and gone.json()["error"] == "not_found"

    page = (await client.get("/admin/api/v1/messages", params={"limit": 1}, headers=AUTH)).json()
    assert [m["id"] for m in page["items"]] == [second] and page["next_cursor"]
    rest = await client.get(
        "/admin/api/v1/messages", params={"cursor": page["next_cursor"]}, headers=AUTH
    )
    assert [m["id"] for m in rest.json()["items"]] == [first]
    message = (await client.get(f"/admin/api/v1/messages/{first}", headers=AUTH)).json()
    assert message["payload"]["data"] == {"petId": "p1"}
    assert [(d["endpoint_id"], d["status"]) for d in message["deliveries"]] == [
        (endpoint_id, "sent")
    ]
    assert [a["status_code"] for a in message["attempts"]] == [200]

    types = (await client.get("/admin/api/v1/event-types", headers=AUTH)).json()["items"]
    assert types == [
        {
            "name": "pet.adopted",
            "description": "a pet found a home",
            "schema": {"type": "object"},
            "subject": None,
        }
    ]
    body = {"reason": "customer lost it"}
    again = await client.post(f"/admin/api/v1/messages/{first}/redeliver", json=body, headers=AUTH)
    assert again.status_code == 200 and again.json()["redelivered"] == 1
    pending = await client.post(
        f"/admin/api/v1/messages/{second}/redeliver", json=body, headers=AUTH
    )
    assert pending.status_code == 409  # its delivery has not finished: nothing to resend
    return True


async def _pages(client: Any, endpoint_id: str, message_id: str) -> bool:
    await client.post("/admin/login", data={"token": TOKEN, "next": "/admin/"})
    overview = (await client.get("/admin/")).text
    assert "Delivery success rate per endpoint" in overview and "50.0%" in overview
    nav = re.findall(r'<a href="/admin(/\w*)"', overview)
    assert "/endpoints" in nav and "/messages" in nav
    endpoints = (await client.get("/admin/endpoints")).text
    assert (
        f'data-endpoint-id="{endpoint_id}"' in endpoints and 'data-success-rate="0.5"' in endpoints
    )
    detail = (await client.get(f"/admin/endpoints/{endpoint_id}")).text
    assert "Recent attempts" in detail and "500" in detail
    messages = (await client.get("/admin/messages")).text
    assert f'data-message-id="{message_id}"' in messages
    message = (await client.get(f"/admin/messages/{message_id}")).text
    csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', message)
    assert csrf and "Redeliver" in message
    r = await client.post(
        f"/admin/messages/{message_id}/redeliver",
        data={"csrf": csrf.group(1), "back": f"/admin/messages/{message_id}"},
    )
    assert "error=" in r.headers["location"]  # redelivered by the API a moment ago: pending
    return True


async def test_endpoint_disable_enable_recover_through_the_api(
    admin: tuple[Relaybox, Any], clock: FrozenClock
) -> None:
    box, client = admin
    local(box)
    endpoint_id, _ = await endpoint(box, "http://127.0.0.1:9/hook", tenant="t1")
    await publish_one(box, "pet.adopted", {"petId": "p1"})
    url = f"/admin/api/v1/endpoints/{endpoint_id}"

    async def act(action: str, **body: Any) -> Any:
        return await client.post(f"{url}/{action}", json=body, headers=AUTH)

    assert (await act("disable")).status_code == 400  # a reason is required
    off = await act("disable", reason="receiver migrating", actor="alice")
    assert off.status_code == 200, off.text
    assert off.json()["status"] == "disabled"
    assert off.json()["disabled_reason"] == "manual by alice: receiver migrating"
    listed = (await client.get("/admin/api/v1/endpoints", headers=AUTH)).json()["items"]
    assert [(e["status"], e["disabled_reason"]) for e in listed] == [
        ("disabled", "manual by alice: receiver migrating")
    ]
    twice = await act("disable", reason="again")
    assert twice.status_code == 409 and twice.json()["error"] == "already_disabled"
    early = await act("recover", reason="fixed", since=clock.now() - 3600)
    assert early.status_code == 409 and early.json()["error"] == "endpoint_disabled"
    on = await act("enable", reason="receiver moved")
    assert on.status_code == 200 and on.json()["status"] == "enabled"
    assert on.json()["disabled_reason"] is None
    assert (await act("enable", reason="x")).json()["error"] == "already_enabled"
    [enabled] = await box.store.fetch_all(
        "SELECT body FROM relaybox_messages WHERE event_type = 'relaybox.endpoint.enabled'"
    )
    data = json.loads(enabled["body"])["data"]
    assert data["reason"].startswith("manual by ") and data["reason"].endswith(": receiver moved")
    assert data["wasDisabled"] == "manual by alice: receiver migrating"
    window = await act("recover", reason="fixed", since=clock.now() + 1)
    assert window.status_code == 200 and window.json()["recovered"] == 0  # created before
    back = await act("recover", reason="fixed", since=clock.now() - 3600)
    assert back.status_code == 200 and back.json()["recovered"] == 1
    assert [r["status"] for r in await outbox_rows(box)] == ["pending"]
    for action, body in (("disable", {}), ("enable", {}), ("recover", {"since": 0})):
        gone = await client.post(
            f"/admin/api/v1/endpoints/ep_nope/{action}", json={"reason": "x", **body}, headers=AUTH
        )
        assert gone.status_code == 404 and gone.json()["error"] == "not_found"


async def test_outbound_sections_wait_for_their_tables(tmp_path: Any) -> None:
    """On a database one migration behind, the outbound pages and routes say so."""
    from relaybox.store import open_store

    url = f"sqlite:///{tmp_path}/old.db"
    store = open_store(url)
    async with store.connect() as conn:
        await conn.exec_driver_sql("CREATE TABLE relaybox_inbox (id INTEGER PRIMARY KEY)")
    await store.close()
    box = Relaybox(settings=Settings(database_url=url, admin_token=TOKEN))
    app = Starlette(routes=[Mount("/admin", app=build_admin(box))])
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://admin.test"
    ) as client:
        api = await client.get("/admin/api/v1/endpoints", headers=AUTH)
        await client.post("/admin/login", data={"token": TOKEN, "next": "/admin/"})
        page = await client.get("/admin/messages")
    await box.close()
    assert api.status_code == 404 and api.json()["error"] == "not_migrated"
    assert page.status_code == 404 and "run migrations" in page.text
