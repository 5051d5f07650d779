"""An endpoint's flow end to end, on SQLite and PostgreSQL, with a real HTTP receiver on
a free port and the dispatcher in-process: pause and resume, replay missing, and
payload filters at fan-out; then the same through the tenant API, the admin API and
the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
import pytest
from click.testing import CliRunner
from starlette.applications import Starlette
from starlette.routing import Mount

from relaybox import FrozenClock, Relaybox
from relaybox.admin import build_admin
from relaybox.cli import main
from relaybox.config import Settings
from relaybox.errors import Conflict
from relaybox.outbound import Dispatcher, create_api_key, disable_endpoint, enable_endpoint
from relaybox.outbound.endpoints import EndpointPatch, update_endpoint
from relaybox.outbound.filters import InvalidFilter
from relaybox.outbound.flow import pause_endpoint, replay_missing, resume_endpoint
from relaybox.outbound.replays import ReplayRunner, ReplayRunning, start_replay
from relaybox.store.outbox_flow import ReplayJob
from tests.conftest import Served
from tests.support.outbound_app import endpoint, local, outbox_rows, publish_one
from tests.support.receivers import HttpReceiver, Seen

T0 = 1_800_000_000.0


@pytest.fixture
async def dispatcher(box: Relaybox) -> AsyncIterator[Dispatcher]:
    local(box)
    d = box.dispatcher()
    yield d
    await d.close()


async def drain(d: Dispatcher, receiver: HttpReceiver, count: int) -> list[Seen]:
    """Run the dispatcher until ``count`` requests arrived (a bounded number of rounds)."""
    for _ in range(200):
        if len(receiver.requests) >= count:
            break
        await d.run_once()
    return await receiver.wait_for(count, within=30.0)


def numbers(seen: list[Seen]) -> list[int]:
    return [json.loads(s.body)["data"]["n"] for s in seen]


async def rows_of(box: Relaybox, endpoint_id: str) -> list[dict[str, Any]]:
    return [r for r in await outbox_rows(box) if r["endpoint_id"] == endpoint_id]


# -- pause and resume -------------------------------------------------------------------


async def test_paused_deliveries_wait_and_go_out_in_publish_order_on_resume(
    box: Relaybox, clock: FrozenClock, dispatcher: Dispatcher
) -> None:
    async with HttpReceiver() as receiver:
        endpoint_id, _ = await endpoint(box, receiver.url, max_in_flight=1)
        assert await pause_endpoint(box, endpoint_id, tenant="t1")
        for n in range(10):
            clock.advance(0.001)
            await publish_one(box, "pet.adopted", {"n": n})
        # Nothing is leased while paused, however long it waits: no attempt, no dead
        # letter (a lease that took them would count attempts; a day later the
        # schedule's whole budget would be spent).
        for _ in range(3):
            assert await dispatcher.run_once() == 0
            clock.advance(2 * 24 * 3600)
        waiting = await rows_of(box, endpoint_id)
        assert [(r["status"], r["attempts"]) for r in waiting] == [("pending", 0)] * 10
        assert (await box.store.flow.endpoint_paused_backlog()) == {endpoint_id: 10}
        await box.metrics.refresh(box)
        gauge = box.metrics.registry.get_sample_value
        assert (gauge("relaybox_paused_endpoints"), gauge("relaybox_paused_deliveries")) == (1, 10)
        current = await box.store.outbox.endpoint_get(endpoint_id, "t1")
        assert current is not None and current.to_json()["paused"]

        assert await resume_endpoint(box, endpoint_id, tenant="t1")
        seen = await drain(dispatcher, receiver, 10)
        assert await dispatcher.run_once() == 0  # nothing more to send
        assert len(receiver.requests) == 10
    assert numbers(seen) == list(range(10))
    done = await rows_of(box, endpoint_id)
    assert [r["status"] for r in done] == ["sent"] * 10
    assert await box.store.flow.endpoint_paused_backlog() == {}


async def test_pausing_twice_and_resuming_a_running_endpoint_change_nothing(
    box: Relaybox, dispatcher: Dispatcher
) -> None:
    endpoint_id, _ = await endpoint(box, "http://127.0.0.1:9/hook")
    assert await pause_endpoint(box, endpoint_id, tenant="t1")
    first = await box.store.outbox.endpoint_get(endpoint_id, None)
    assert await pause_endpoint(box, endpoint_id, tenant="t1")
    again = await box.store.outbox.endpoint_get(endpoint_id, None)
    assert first is not None and again is not None and first.paused_at == again.paused_at
    assert not await box.store.flow.endpoint_pause(endpoint_id, None, paused=True, now=T0)
    assert await box.store.flow.endpoint_pause(endpoint_id, None, paused=False, now=T0)
    assert not await box.store.flow.endpoint_pause(endpoint_id, None, paused=False, now=T0)
    # Another tenant's endpoint is not found.
    assert not await pause_endpoint(box, endpoint_id, tenant="t2")
    assert not await box.store.flow.endpoint_pause(endpoint_id, "t2", paused=True, now=T0)


# -- replay missing ---------------------------------------------------------------------


async def test_replay_missing_after_a_disable_delivers_each_message_once(
    box: Relaybox, clock: FrozenClock, dispatcher: Dispatcher
) -> None:
    async with HttpReceiver() as receiver:
        endpoint_id, _ = await endpoint(box, receiver.url)
        since = clock.now()
        assert await disable_endpoint(box, endpoint_id, tenant="t1")
        published = []
        for n in range(5):
            clock.advance(1)
            published.append((await publish_one(box, "pet.adopted", {"n": n})).id)
        assert await enable_endpoint(box, endpoint_id, tenant="t1")
        assert await rows_of(box, endpoint_id) == []  # published while it was off

        first = await replay_missing(box, endpoint_id, since=since, tenant="t1")
        assert first is not None
        assert (first.queued, first.scanned, first.complete) == (5, 5, True)
        again = await replay_missing(box, endpoint_id, since=since, tenant="t1")
        assert again is not None and (again.queued, again.complete) == (0, True)

        seen = await drain(dispatcher, receiver, 5)
        assert await dispatcher.run_once() == 0  # nothing more to send
        assert len(receiver.requests) == 5
        after = await replay_missing(box, endpoint_id, since=since, tenant="t1")
        assert after is not None and after.queued == 0
    assert numbers(seen) == list(range(5))
    assert [s.webhook_id for s in seen] == published
    assert [r["status"] for r in await rows_of(box, endpoint_id)] == ["sent"] * 5


async def test_four_replays_at_once_make_one_job_that_queues_each_message_once(
    box: Relaybox, clock: FrozenClock
) -> None:
    local(box, replay_batch=7)
    for n in range(40):
        clock.advance(0.01)
        await publish_one(box, "pet.adopted", {"n": n})
    endpoint_id, _ = await endpoint(box, "http://127.0.0.1:9/hook")  # created after
    started = await asyncio.gather(
        *(start_replay(box, endpoint_id, since=0.0, tenant="t1") for _ in range(4)),
        return_exceptions=True,
    )
    [job] = [s for s in started if isinstance(s, ReplayJob)]
    refused = [s for s in started if not isinstance(s, ReplayJob)]
    assert len(refused) == 3
    assert all(isinstance(r, ReplayRunning) and r.job_id == job.id for r in refused)
    assert await rows_of(box, endpoint_id) == []  # queued, not run by the request
    # Two runners at once: one claims the job, the other finds nothing to claim.
    ran = await asyncio.gather(ReplayRunner(box).run_once(), ReplayRunner(box).run_once())
    [done] = [r for r in ran if r is not None]
    assert (done.id, done.status, done.queued, done.scanned) == (job.id, "done", 40, 40)
    rows = await rows_of(box, endpoint_id)
    assert len(rows) == len({r["message_id"] for r in rows}) == 40
    # Queued in publish order.
    order = [
        m.id
        for m in await box.store.outbox.message_list("t1", event_type=None, before=None, limit=100)
    ]
    assert [r["message_id"] for r in rows] == order[::-1]
    # The endpoint is free for the next replay once the job ended.
    again = await replay_missing(box, endpoint_id, since=0.0, tenant="t1")
    assert again is not None and (again.queued, again.complete) == (0, True)


async def test_replay_missing_is_bounded_and_says_where_to_go_on(
    box: Relaybox, clock: FrozenClock
) -> None:
    local(box, replay_max=3, replay_scan_max=4)
    for n in range(6):
        clock.advance(1)
        await publish_one(box, "pet.adopted" if n != 1 else "order.paid", {"n": n})
    endpoint_id, _ = await endpoint(box, "http://127.0.0.1:9/hook", event_types=["pet.*"])
    first = await replay_missing(box, endpoint_id, since=0.0, tenant="t1", limit=2)
    assert first is not None
    assert (first.queued, first.scanned, first.complete) == (2, 3, False)
    assert first.resume_since == T0 + 3
    second = await replay_missing(box, endpoint_id, since=first.resume_since, tenant="t1")
    assert second is not None
    # n=2 is not read again (its publish time is resume_since, but it has a delivery
    # now); n=3, 4, 5 are, and queued (three: replay_max), the last message reached.
    assert (second.queued, second.scanned, second.complete) == (3, 3, True)
    assert second.resume_since is None
    third = await replay_missing(box, endpoint_id, since=0.0, tenant="t1")
    assert third is not None and (third.queued, third.scanned, third.complete) == (0, 1, True)
    queued = []
    for row in await rows_of(box, endpoint_id):
        message = await box.store.outbox.message_get(row["message_id"], "t1")
        assert message is not None
        queued.append(message.envelope["data"]["n"])
    assert queued == [0, 2, 3, 4, 5]


async def test_replay_missing_refuses_a_disabled_endpoint(box: Relaybox) -> None:
    local(box)
    endpoint_id, _ = await endpoint(box, "http://127.0.0.1:9/hook")
    await disable_endpoint(box, endpoint_id, tenant="t1")
    with pytest.raises(Conflict) as refused:
        await replay_missing(box, endpoint_id, since=0.0, tenant="t1")
    assert refused.value.code == "endpoint_disabled"
    assert await replay_missing(box, endpoint_id, since=0.0, tenant="t2") is None


# -- payload filters ----------------------------------------------------------------------


async def test_only_the_matching_message_gets_a_delivery(
    box: Relaybox, clock: FrozenClock, dispatcher: Dispatcher
) -> None:
    async with HttpReceiver() as receiver:
        wanted = {"data.customer.country": {"$in": ["PT", "BR"]}, "data.amount": {"$gte": 100}}
        endpoint_id, _ = await endpoint(box, receiver.url, filter=wanted)
        everything, _ = await endpoint(box, "http://127.0.0.1:9/hook")
        messages = [
            await publish_one(box, "order.paid", {"customer": {"country": c}, "amount": a})
            for c, a in (("US", 500), ("PT", 120), ("BR", 99))
        ]
        assert [m.endpoints for m in messages] == [
            (everything,),
            tuple(sorted((endpoint_id, everything))),
            (everything,),
        ]
        [seen] = await drain(dispatcher, receiver, 1)
        assert seen.webhook_id == messages[1].id
        # The filter holds for replay missing too: the two that did not match stay out.
        replayed = await replay_missing(box, endpoint_id, since=0.0, tenant="t1")
        assert replayed is not None and (replayed.queued, replayed.scanned) == (0, 2)
        # Widened, the two now match and replay missing sends them.
        await update_endpoint(box, endpoint_id, "t1", EndpointPatch(filter={}))
        widened = await replay_missing(box, endpoint_id, since=0.0, tenant="t1")
        assert widened is not None and widened.queued == 2
        await drain(dispatcher, receiver, 3)
    assert sorted(s.webhook_id for s in receiver.requests) == sorted(m.id for m in messages)


async def test_a_bad_filter_is_refused_when_saved(box: Relaybox) -> None:
    local(box, filter_max_depth=4, filter_max_bytes=200)
    with pytest.raises(InvalidFilter, match=r"^data\.a\.\$regex: unknown operator \$regex"):
        await endpoint(box, "http://127.0.0.1:9/hook", filter={"data.a": {"$regex": "x"}})
    with pytest.raises(InvalidFilter, match="over the limit of 4"):
        await endpoint(box, "http://127.0.0.1:9/hook", filter={"$or": [{"a": {"$in": [[1]]}}]})
    with pytest.raises(InvalidFilter, match="over the limit of 200"):
        await endpoint(box, "http://127.0.0.1:9/hook", filter={"a": {"$in": ["x" * 300]}})
    assert await box.store.outbox.endpoint_list("t1", limit=10) == []
    endpoint_id, _ = await endpoint(box, "http://127.0.0.1:9/hook", filter={"type": "a"})
    with pytest.raises(InvalidFilter, match=r"^type\.\$gt: a number or a string, not null"):
        await update_endpoint(box, endpoint_id, "t1", EndpointPatch(filter={"type": {"$gt": None}}))
    kept = await box.store.outbox.endpoint_get(endpoint_id, None)
    assert kept is not None and kept.payload_filter == {"type": "a"}


# -- the tenant API -------------------------------------------------------------------------


@pytest.fixture
async def api(box: Relaybox) -> AsyncIterator[Any]:
    local(box)
    _, key = await create_api_key(box, "t1", "tests")
    async with (
        Served(box.asgi(roles=("api",))) as served,
        aiohttp.ClientSession() as http,
    ):
        base = served.url + "/api/v1"

        async def call(method: str, path: str, body: Any = None) -> tuple[int, Any]:
            headers = {"Authorization": f"Bearer {key}"}
            async with http.request(method, base + path, json=body, headers=headers) as r:
                return r.status, await r.json()

        yield call


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"data.a": {"$regex": "x"}}, "data.a.$regex: unknown operator $regex"),
        ({"data.a": {"$in": "PT"}}, "data.a.$in: a list of values, not a string"),
        ({"$or": [{"a": 1}, 2]}, "$or[1]: a filter (an object), not a number"),
        ({"data": {"country": "PT"}}, "data: 'country' is not an operator"),
    ],
)
async def test_the_tenant_api_answers_422_for_a_bad_filter(
    api: Any, bad: dict[str, Any], message: str
) -> None:
    status, answer = await api("POST", "/endpoints", {"url": "https://x.example/h", "filter": bad})
    assert status == 422 and answer["error"] == "invalid_filter"
    assert answer["message"].startswith(message)
    status, created = await api("POST", "/endpoints", {"url": "https://x.example/h"})
    assert status == 201 and created["filter"] is None and not created["paused"]
    status, answer = await api("PATCH", f"/endpoints/{created['id']}", {"filter": bad})
    assert (status, answer["error"]) == (422, "invalid_filter")
    status, answer = await api("PATCH", f"/endpoints/{created['id']}", {"filter": []})
    assert (status, answer["error"]) == (422, "invalid_request")


async def test_the_tenant_api_pauses_resumes_and_replays(
    box: Relaybox, clock: FrozenClock, api: Any
) -> None:
    status, created = await api(
        "POST", "/endpoints", {"url": "https://x.example/h", "filter": {"data.n": {"$lt": 2}}}
    )
    assert status == 201 and created["filter"] == {"data.n": {"$lt": 2}}
    endpoint_id = created["id"]
    status, paused = await api("POST", f"/endpoints/{endpoint_id}/pause")
    assert status == 200 and paused["paused"] and paused["paused_at"] == clock.now()
    status, resumed = await api("POST", f"/endpoints/{endpoint_id}/resume")
    assert status == 200 and not resumed["paused"]

    await api("PATCH", f"/endpoints/{endpoint_id}", {"enabled": False})
    for n in range(4):
        clock.advance(1)
        assert (await api("POST", "/messages", {"event_type": "x.y", "data": {"n": n}}))[0] == 202
    status, refused = await api("POST", f"/endpoints/{endpoint_id}/replay-missing", {"since": 0})
    assert (status, refused["error"]) == (409, "endpoint_disabled")
    await api("PATCH", f"/endpoints/{endpoint_id}", {"enabled": True})
    body = {"since": "2027-01-15T08:00:00Z"}  # T0 is 2027-01-15T08:00:00Z
    status, job = await api("POST", f"/endpoints/{endpoint_id}/replay-missing", body)
    assert status == 202 and (job["status"], job["queued"], job["since"]) == ("queued", 0, T0)
    assert job["url"].endswith(f"/api/v1/endpoints/{endpoint_id}/replay-missing/{job['id']}")
    status, busy = await api("POST", f"/endpoints/{endpoint_id}/replay-missing", body)
    assert (status, busy["error"], busy["id"]) == (409, "replay_running", job["id"])
    assert (await ReplayRunner(box).run_once()) is not None  # a dispatcher's runner
    status, replayed = await api("GET", f"/endpoints/{endpoint_id}/replay-missing/{job['id']}")
    assert status == 200 and (replayed["status"], replayed["queued"]) == ("done", 2)
    assert replayed["complete"] and replayed["url"] == job["url"]
    status, again = await api("POST", f"/endpoints/{endpoint_id}/replay-missing", body)
    assert status == 202 and again["id"] != job["id"]
    await ReplayRunner(box).run_once()
    status, again = await api("GET", f"/endpoints/{endpoint_id}/replay-missing/{again['id']}")
    assert (again["status"], again["queued"]) == ("done", 0)
    status, other = await api("GET", f"/endpoints/ep_nope/replay-missing/{job['id']}")
    assert (status, other["error"]) == (404, "not_found")
    status, other = await api("GET", f"/endpoints/{endpoint_id}/replay-missing/rpl_nope")
    assert (status, other["error"]) == (404, "not_found")
    status, bad = await api("POST", f"/endpoints/{endpoint_id}/replay-missing", {"limit": 0})
    assert (status, bad["error"]) == (422, "invalid_request")
    status, missing = await api("POST", "/endpoints/ep_nope/pause")
    assert (status, missing["error"]) == (404, "not_found")


# -- the admin API ----------------------------------------------------------------------------

TOKEN = "test-admin-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def test_the_admin_api_pauses_resumes_replays_and_sets_filters(
    database_url: str, clock: FrozenClock
) -> None:
    box = Relaybox(settings=Settings(database_url=database_url, admin_token=TOKEN), clock=clock)
    local(box)
    app = Starlette(routes=[Mount("/admin", app=build_admin(box))])
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://admin.test"
        ) as client:

            async def post(path: str, body: Any, method: str = "POST") -> httpx.Response:
                url = "/admin/api/v1/endpoints/" + path
                return await client.request(method, url, json=body, headers=AUTH)

            endpoint_id, _ = await endpoint(box, "http://127.0.0.1:9/hook")
            why = {"reason": "receiver maintenance"}
            paused = await post(f"{endpoint_id}/pause", why)
            assert paused.status_code == 200 and paused.json()["paused"]
            assert (await post(f"{endpoint_id}/pause", why)).json()["error"] == "already_paused"
            await publish_one(box, "pet.adopted", {"n": 1})
            shown = await client.get(f"/admin/api/v1/endpoints/{endpoint_id}", headers=AUTH)
            assert shown.json()["paused_at"] == clock.now()
            resumed = await post(f"{endpoint_id}/resume", why)
            assert resumed.status_code == 200 and resumed.json()["waiting"] == 1
            assert (await post(f"{endpoint_id}/resume", why)).status_code == 409

            bad = await post(f"{endpoint_id}/filter", {**why, "filter": {"a": {"$gt": []}}}, "PUT")
            assert bad.status_code == 422 and bad.json()["error"] == "invalid_filter"
            assert bad.json()["message"] == "a.$gt: a number or a string, not a list"
            good = {**why, "filter": {"data.n": 2}}
            assert (await post(f"{endpoint_id}/filter", good, "PUT")).json()["filter"] == {
                "data.n": 2
            }
            clock.advance(1)
            async with box.store.transaction() as conn:  # published to nobody
                await box.publish(conn, "pet.adopted", {"n": 2}, tenant="t1", endpoint_ids=[])
            replay = {**why, "since": "1h"}
            started = await post(f"{endpoint_id}/replay-missing", replay)
            assert started.status_code == 202 and started.json()["status"] == "queued"
            busy = await post(f"{endpoint_id}/replay-missing", replay)
            assert (busy.status_code, busy.json()["error"]) == (409, "replay_running")
            await ReplayRunner(box).run_once()
            job = f"{endpoint_id}/replay-missing/{started.json()['id']}"
            done = await post(job, None, "GET")
            assert done.status_code == 200 and done.json()["status"] == "done"
            assert (done.json()["queued"], done.json()["complete"]) == (1, True)
            again = await post(f"{endpoint_id}/replay-missing", replay)
            assert again.status_code == 202
            await ReplayRunner(box).run_once()
            assert (
                await post(f"{endpoint_id}/replay-missing/{again.json()['id']}", None, "GET")
            ).json()["queued"] == 0
            assert (
                await post(f"{endpoint_id}/replay-missing/rpl_nope", None, "GET")
            ).status_code == 404
            bad_time = await post(f"{endpoint_id}/replay-missing", {**why, "since": "soon"})
            assert bad_time.status_code == 400
            missing = await post("ep_nope/pause", why)
            assert missing.status_code == 404
    finally:
        await box.close()


# -- the CLI ------------------------------------------------------------------------------------


def test_the_cli_pauses_resumes_replays_and_takes_filters(
    monkeypatch: pytest.MonkeyPatch, database_url: str
) -> None:
    for key in list(os.environ):
        if key.startswith("RELAYBOX_") and not key.startswith("RELAYBOX_TEST_"):
            monkeypatch.delenv(key)
    runner = CliRunner()

    def run(*args: str, code: int = 0) -> str:
        app = ["--app", "tests.support.outbound_app:box", "--database-url", database_url]
        result = runner.invoke(main, [*args, *app], prog_name="relaybox")
        assert result.exit_code == code, (result.output, result.exception)
        return result.stdout if code == 0 else result.output  # logs go to stderr

    created = json.loads(
        run("endpoints", "create", "--tenant", "t1", "--url", "https://hooks.example.com/x",
            "--filter", '{"data.country": {"$in": ["PT", "BR"]}}')
    )  # fmt: skip
    endpoint_id = created["id"]
    assert created["filter"] == {"data.country": {"$in": ["PT", "BR"]}}
    assert "unknown operator $like" in run(
        "endpoints", "update", endpoint_id, "--filter", '{"a": {"$like": 1}}', code=2
    )
    assert "is not JSON text" in run("endpoints", "update", endpoint_id, "--filter", "{", code=2)
    assert "paused, 0 deliveries waiting" in run("endpoints", "pause", endpoint_id)
    assert "unchanged" in run("endpoints", "pause", endpoint_id)
    for country in ("PT", "US"):
        run("messages", "publish", "--tenant", "t1", "--type", "a.b", "--data",
            json.dumps({"country": country}))  # fmt: skip
    answer = json.loads(run("endpoints", "resume", endpoint_id, "--json"))
    assert answer == {"endpoint": endpoint_id, "action": "resume", "changed": True, "waiting": 1}

    run("endpoints", "disable", endpoint_id, "--reason", "maintenance window")
    run("messages", "publish", "--tenant", "t1", "--type", "a.b", "--data", '{"country": "BR"}')
    assert "disabled: enable it first" in run(
        "endpoints", "replay-missing", endpoint_id, "--since", "1h", code=1
    )
    run("endpoints", "enable", endpoint_id, "--reason", "back")
    replayed = json.loads(
        run("endpoints", "replay-missing", endpoint_id, "--since", "1h", "--json")
    )
    assert (replayed["queued"], replayed["complete"]) == (1, True)
    assert "0 missing deliveries queued" in run(
        "endpoints", "replay-missing", endpoint_id, "--since", "1h"
    )
    run("endpoints", "replay-missing", endpoint_id, "--since", "later", code=2)
    queued = run("endpoints", "replay-missing", endpoint_id, "--since", "1h", "--no-wait")
    assert re.fullmatch(r"replay job rpl_\w+ queued: a dispatcher runs it\n", queued)
    busy = run("endpoints", "replay-missing", endpoint_id, "--since", "1h", code=1)
    assert "has a replay-missing job running" in busy


# -- the dashboard ------------------------------------------------------------------------------


async def login(client: httpx.AsyncClient) -> str:
    """Log in to the dashboard; return the CSRF token its pages carry."""
    done = await client.post("/admin/login", data={"token": TOKEN, "next": "/admin/"})
    assert done.status_code == 303
    page = await client.get("/admin/")
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert match, page.text
    return match.group(1)


async def test_the_dashboard_pauses_resumes_and_replays(
    database_url: str, clock: FrozenClock
) -> None:
    box = Relaybox(settings=Settings(database_url=database_url, admin_token=TOKEN), clock=clock)
    local(box)
    app = Starlette(routes=[Mount("/admin", app=build_admin(box))])
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://admin.test"
        ) as client:
            csrf = await login(client)
            flt = {"data.n": {"$gte": 1}}
            endpoint_id, _ = await endpoint(box, "http://127.0.0.1:9/hook", filter=flt)
            page = f"/admin/endpoints/{endpoint_id}"

            async def act(action: str, **form: str) -> str:
                data = {"csrf": csrf, "back": page, **form}
                done = await client.post(f"{page}/{action}", data=data)
                assert done.status_code == 303, done.text
                return str(done.headers["location"])

            shown = (await client.get(page)).text
            assert "data-paused" not in shown and 'name="pause"' in shown
            assert "data-filter" in shown and "$gte" in shown
            assert "notice=endpoint_paused" in await act("pause", reason="maintenance")
            await publish_one(box, "pet.adopted", {"n": 1})
            shown = (await client.get(page)).text
            assert "data-paused" in shown and 'name="resume"' in shown
            assert "already_paused" in await act("pause")
            resumed = await act("resume")
            assert "notice=endpoint_resumed" in resumed and "n=1" in resumed
            assert (
                "The endpoint was resumed: its 1 waiting deliveries go out."
                in (await client.get(resumed)).text
            )

            async with box.store.transaction() as conn:  # published to nobody
                for n in range(3):
                    await box.publish(conn, "pet.adopted", {"n": n}, tenant="t1", endpoint_ids=[])
            assert "notice=replay_started" in await act("replay-missing", since="1h")
            assert "error=replay_running" in await act("replay-missing", since="1h")
            assert 'data-replay="queued"' in (await client.get(page)).text
            await ReplayRunner(box).run_once()
            shown = (await client.get(page)).text
            assert 'data-replay="done"' in shown and "2 missing deliver(ies) queued" in shown
            assert "error=bad_time" in await act("replay-missing", since="yesterday-ish")
    finally:
        await box.close()


async def test_closing_the_box_closes_a_dispatcher_it_was_never_told_to_close(
    database_url: str, clock: FrozenClock
) -> None:
    """A test (or an app) that ran a dispatcher and closed only the box leaves no HTTP
    session open: the box's close closes every channel's connections."""
    from relaybox.outbound.channels.http import HttpBase

    box = Relaybox(settings=Settings(database_url=database_url), clock=clock)
    local(box)
    async with HttpReceiver() as receiver:
        await endpoint(box, receiver.url)
        await publish_one(box, "invoice.paid", {"n": 1})
        d = box.dispatcher()
        await drain(d, receiver, 1)
        channel = box.outbound.channels["webhook"]
        assert isinstance(channel, HttpBase)
        session = channel.client()._session
        assert session is not None and not session.closed
        await box.close()
        assert session.closed
