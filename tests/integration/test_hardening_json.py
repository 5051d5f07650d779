"""Strict JSON in and out, on SQLite and PostgreSQL: ``NaN``, ``Infinity``,
``-Infinity`` and ``1e999`` (which Python's ``json`` reads as floats) are refused
before anything is written, by the tenant API, the admin API, the portal's forms, the
CLI, ``publish()``, ``publish_sync()``, ``ctx.outbox.add`` and the filter and catalog
checks; a message an earlier version stored with one is still listed and shown."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner

from relaybox import Context, FrozenClock, Relaybox
from relaybox.cli import main
from relaybox.config import Settings
from relaybox.outbound import EndpointSpec, create_api_key, create_endpoint, define_event_type
from relaybox.outbound.catalog import InvalidMessage
from relaybox.outbound.filters import InvalidFilter
from tests.conftest import KEYED, Served
from tests.integration.test_admin_api import AUTH, TOKEN
from tests.integration.test_portal import portal_for
from tests.integration.test_worker import delivery
from tests.support.outbound_app import endpoint, local, publish_one

NOT_JSON = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"]
"""Numbers Python's json reads (as nan, inf, -inf) that JSON has not."""


class Http:
    """The api and admin roles of ``box`` on a real server, with a tenant's key."""

    def __init__(self, http: aiohttp.ClientSession, base: str, key: str) -> None:
        self.http, self.base, self.key = http, base, key

    async def call(
        self, method: str, path: str, raw: str | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        sent = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}
        async with self.http.request(
            method, self.base + path, data=raw, headers={**sent, **(headers or {})}
        ) as r:
            text = await r.text()
            return r.status, (json.loads(text) if text else None)


@pytest.fixture
async def served(database_url: str, clock: FrozenClock) -> AsyncIterator[tuple[Relaybox, Http]]:
    settings = Settings(database_url=database_url, admin_token=TOKEN, outbound=KEYED)
    box = Relaybox(settings=settings, clock=clock)
    local(box)
    _, key = await create_api_key(box, "t1", "tests")
    try:
        async with (
            Served(box.asgi(roles=("api", "admin"))) as server,
            aiohttp.ClientSession() as http,
        ):
            yield box, Http(http, server.url, key)
    finally:
        await box.close()


async def written(box: Relaybox) -> dict[str, int]:
    counts = {}
    for table in ("relaybox_messages", "relaybox_outbox"):
        [row] = await box.store.fetch_all(f"SELECT count(*) AS n FROM {table}")
        counts[table] = row["n"]
    return counts


@pytest.mark.parametrize("number", NOT_JSON)
async def test_the_tenant_api_refuses_a_number_json_has_not_before_writing_anything(
    served: tuple[Relaybox, Http], number: str
) -> None:
    """The publish is answered 400 and nothing is written (no message, no delivery),
    so the message list keeps working and the same idempotency key with valid data
    publishes. It had been committed and fanned out, then answered 500, and the list
    and the message page answered 500 from then on."""
    box, api = served
    await endpoint(box, "http://127.0.0.1:9/hook")
    key = {"Idempotency-Key": "order-7"}
    for data in (f'{{"v": {number}}}', f'{{"v": [1, {{"w": {number}}}]}}'):
        raw = f'{{"event_type": "x.y", "data": {data}}}'
        status, answer = await api.call("POST", "/api/v1/messages", raw, key)
        assert (status, answer["error"]) == (400, "malformed_json"), answer
        assert number.lstrip("-") in answer["message"], answer
        assert "JSON number" in answer["message"]
    assert await written(box) == {"relaybox_messages": 0, "relaybox_outbox": 0}
    status, listed = await api.call("GET", "/api/v1/messages")
    assert (status, listed["data"]) == (200, [])
    valid = '{"event_type": "x.y", "data": {"v": 1e308}}'
    status, made = await api.call("POST", "/api/v1/messages", valid, key)
    assert status == 202, made
    for path in ("/api/v1/messages", f"/api/v1/messages/{made['id']}"):
        status, _ = await api.call("GET", path)
        assert status == 200
    assert await written(box) == {"relaybox_messages": 1, "relaybox_outbox": 1}


async def test_an_endpoint_filter_with_a_number_json_has_not_is_refused_everywhere(
    served: tuple[Relaybox, Http], database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The filter grammar already refused a non-finite number (422 ``invalid_filter``,
    ``create_endpoint`` raises); a body holding one is now refused as not JSON
    before that: the tenant API and the admin API answer 400, the portal's form 422
    (its answer to a refused form), the CLI exits 2. Nothing is stored, and the
    endpoint still shows."""
    box, api = served
    spec = '{"data.v": {"$gt": NaN}}'
    raw = f'{{"url": "http://127.0.0.1:9/hook", "filter": {spec}}}'
    status, answer = await api.call("POST", "/api/v1/endpoints", raw)
    assert (status, answer["error"]) == (400, "malformed_json"), answer
    assert (await api.call("GET", "/api/v1/endpoints"))[1]["data"] == []

    endpoint_id, _ = await endpoint(box, "http://127.0.0.1:9/hook")
    body = f'{{"filter": {spec.replace("NaN", "Infinity")}}}'
    path = f"/admin/api/v1/endpoints/{endpoint_id}/filter"
    status, answer = await api.call("PUT", path, body, AUTH)
    assert (status, answer["error"]) == (400, "invalid_request"), answer
    assert "Infinity is not a JSON number" in answer["message"]

    async with aiohttp.ClientSession() as http:
        portal = await portal_for(box, http, api.base, "t1")
        form = {"url": "http://127.0.0.1:9/other", "filter": spec.replace("NaN", "1e999")}
        status, _, page = await portal.post("/endpoints", form)
        assert status == 422 and "filter: not valid JSON" in page
        assert (await portal.get("/endpoints"))[0] == 200

    with pytest.raises(InvalidFilter, match="v: a finite number"):
        await create_endpoint(
            box, "t1", EndpointSpec(url="http://127.0.0.1:9/x", filter={"v": float("nan")})
        )

    for name in list(os.environ):
        if name.startswith("RELAYBOX_") and not name.startswith("RELAYBOX_TEST_"):
            monkeypatch.delenv(name)
    args = ["endpoints", "create", "--tenant", "t1", "--url", "https://hooks.example.com/x",
            "--filter", spec, "--app", "tests.support.outbound_app:box",
            "--database-url", database_url]  # fmt: skip
    refused = await asyncio.to_thread(CliRunner().invoke, main, args)
    assert refused.exit_code == 2 and "is not JSON text" in refused.output, refused.output

    status, shown = await api.call("GET", "/api/v1/endpoints")
    assert status == 200 and [e["id"] for e in shown["data"]] == [endpoint_id]
    assert shown["data"][0]["filter"] is None
    status, _ = await api.call("GET", f"/admin/api/v1/endpoints/{endpoint_id}", None, AUTH)
    assert status == 200


@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")])
async def test_publish_refuses_a_float_json_has_not(box: Relaybox, number: float) -> None:
    """``publish()`` and ``publish_sync()`` raise :class:`InvalidMessage` (``data``)
    before anything is written; the key is free for a valid publish after."""
    local(box)
    await endpoint(box, "http://127.0.0.1:9/hook")
    with pytest.raises(InvalidMessage, match="not JSON numbers") as refused:
        await publish_one(box, data={"v": [1, {"w": number}]}, idempotency_key="k1")
    assert refused.value.code == "data"

    def sync_publish() -> None:
        with box.store.sync.transaction() as conn:
            box.publish_sync(conn, "x.y", {"v": number}, tenant="t1", idempotency_key="k1")

    with pytest.raises(InvalidMessage, match="not JSON numbers"):
        await asyncio.to_thread(sync_publish)
    assert await written(box) == {"relaybox_messages": 0, "relaybox_outbox": 0}
    message = await publish_one(box, data={"v": 1.5}, idempotency_key="k1")
    assert message.created and json.loads(message.body)["data"] == {"v": 1.5}


async def test_an_outbox_row_with_a_float_json_has_not_fails_in_the_handler(
    box: Relaybox, clock: FrozenClock
) -> None:
    """``ctx.outbox.add`` refuses the payload in the handler (the event is retried with
    the reason), instead of writing a row no destination could parse."""

    @box.handler("s")
    async def handler(ctx: Context) -> None:
        await ctx.outbox.add("email", ctx.event.event_id, {"amount": float("inf")})

    await box.store.inbox.accept([delivery(clock, "e1", "x", {})])
    assert await box.worker().run_once() == 1
    [row] = await box.store.fetch_all("SELECT status, last_error FROM relaybox_inbox")
    assert row["status"] == "pending" and "not JSON numbers" in row["last_error"]
    assert await box.store.fetch_all("SELECT id FROM relaybox_outbox") == []


async def test_an_event_type_schema_with_a_number_json_has_not_is_refused(
    box: Relaybox, tmp_path: Path, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    local(box)
    schema = {"type": "object", "properties": {"v": {"type": "number", "maximum": float("inf")}}}
    with pytest.raises(InvalidMessage, match="not a valid JSON Schema") as refused:
        await define_event_type(box, "x.y", schema=schema)
    assert refused.value.code == "schema"
    for name in list(os.environ):
        if name.startswith("RELAYBOX_") and not name.startswith("RELAYBOX_TEST_"):
            monkeypatch.delenv(name)
    path = tmp_path / "schema.json"
    path.write_text('{"type": "object", "properties": {"v": {"maximum": NaN}}}')
    args = ["event-types", "define", "x.y", "--schema", str(path), "--database-url", database_url]
    result = await asyncio.to_thread(CliRunner().invoke, main, args)
    assert result.exit_code == 2 and "NaN is not a JSON number" in result.output, result.output
    assert await box.store.fetch_all("SELECT name FROM relaybox_event_types") == []


def test_the_cli_refuses_to_publish_a_number_json_has_not(database_url: str) -> None:
    args = ["messages", "publish", "--tenant", "t1", "--type", "x.y", "--data", '{"v": NaN}',
            "--app", "tests.support.outbound_app:box", "--database-url", database_url]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "NaN is not a JSON number" in result.output, result.output


async def test_a_message_an_earlier_version_stored_with_nan_is_still_listed_and_shown(
    served: tuple[Relaybox, Http],
) -> None:
    """Earlier versions stored ``{"v": NaN}`` as given: the tenant's list and message
    page show it as null (as JavaScript's JSON.stringify writes NaN), the admin API
    shows the stored text; they had answered 500."""
    box, api = served
    message = await publish_one(box, data={"v": 1.5, "w": [2.5]})
    await box.store.fetch_all(
        "UPDATE relaybox_messages SET body = replace(replace(body, '1.5', 'NaN'), '2.5',"
        f" '-Infinity') WHERE id = '{message.id}' RETURNING id"
    )
    status, listed = await api.call("GET", "/api/v1/messages")
    assert status == 200, listed
    [shown] = listed["data"]
    assert shown["payload"]["data"] == {"v": None, "w": [None]}
    status, one = await api.call("GET", f"/api/v1/messages/{message.id}")
    assert (status, one["payload"]["data"]) == (200, {"v": None, "w": [None]})
    status, admin = await api.call("GET", f"/admin/api/v1/messages/{message.id}", None, AUTH)
    assert status == 200, admin
    assert '"v":NaN' in admin["payload"]
