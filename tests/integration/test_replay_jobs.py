"""Replay-missing jobs on SQLite and PostgreSQL: the request only queues a job, the
tenant's hourly limit, bad times, the subscription checked off the event loop, a step
that dies before its COMMIT, a runner whose lease ran out, and a dispatcher that runs
the jobs it is told of."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

from relaybox import FrozenClock, Relaybox
from relaybox.admin import build_admin
from relaybox.config import Settings
from relaybox.outbound import create_api_key
from relaybox.outbound.filters import CompiledFilter
from relaybox.outbound.replays import ReplayRunner, start_replay
from tests.conftest import Served
from tests.support.outbound_app import endpoint, local, outbox_rows, publish_one


async def rows_of(box: Relaybox, endpoint_id: str) -> list[dict[str, Any]]:
    return [r for r in await outbox_rows(box) if r["endpoint_id"] == endpoint_id]


@pytest.fixture
async def api(box: Relaybox) -> AsyncIterator[Any]:
    local(box, replay_jobs_per_hour=2)
    _, key = await create_api_key(box, "t1", "tests")
    async with (
        Served(box.asgi(roles=("api",))) as served,
        aiohttp.ClientSession() as http,
    ):
        base = served.url + "/api/v1"

        async def call(
            method: str, path: str, body: Any = None, raw: bytes | None = None
        ) -> tuple[int, Any, Any]:
            headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
            kw: dict[str, Any] = {"data": raw} if raw is not None else {"json": body}
            async with http.request(method, base + path, headers=headers, **kw) as r:
                return r.status, await r.json(), r.headers

        yield call


async def test_the_tenant_api_queues_a_job_limits_a_tenant_and_refuses_bad_times(
    box: Relaybox, clock: FrozenClock, api: Any
) -> None:
    for n in range(3):
        clock.advance(1)
        await publish_one(box, "pet.adopted", {"n": n})
    ids = [(await endpoint(box, "http://127.0.0.1:9/hook"))[0] for _ in range(3)]
    # Numbers JSON has not: 400, for this request only; nothing queued.
    for raw in (b'{"since": 1e999}', b'{"since": -1e999}', b'{"since": NaN}'):
        status, bad, _ = await api("POST", f"/endpoints/{ids[0]}/replay-missing", raw=raw)
        assert (status, bad["error"]) == (400, "malformed_json"), raw
    for body in ({"since": "soon"}, {"since": 0, "limit": 0}, {"since": True}, {}):
        status, bad, _ = await api("POST", f"/endpoints/{ids[0]}/replay-missing", body)
        assert (status, bad["error"]) == (422, "invalid_request"), body

    status, job, headers = await api("POST", f"/endpoints/{ids[0]}/replay-missing", {"since": 0})
    assert status == 202 and headers["Location"] == job["url"]
    assert (job["status"], job["queued"], job["until"]) == ("queued", 0, clock.now())
    assert await rows_of(box, ids[0]) == []  # the request read no message
    assert (await api("POST", f"/endpoints/{ids[1]}/replay-missing", {"since": 0}))[0] == 202
    # The tenant's third job within the hour: 429, with when to try again.
    clock.advance(60)
    status, limited, headers = await api(
        "POST", f"/endpoints/{ids[2]}/replay-missing", {"since": 0}
    )
    assert (status, limited["error"]) == (429, "rate_limited")
    assert headers["Retry-After"] == str(3600 - 60)
    # An operator is not limited (the admin API's use case, the CLI).
    assert await start_replay(box, ids[2], since=0.0, tenant=None) is not None
    done = [await ReplayRunner(box).run_once() for _ in range(3)]
    assert [(j.status, j.queued) for j in done if j is not None] == [("done", 3)] * 3
    clock.advance(3600)
    status, later, _ = await api("POST", f"/endpoints/{ids[2]}/replay-missing", {"since": 0})
    assert status == 202 and later["id"] != job["id"]


async def test_the_admin_api_refuses_a_time_json_has_not(
    database_url: str, clock: FrozenClock
) -> None:
    token = "test-admin-token-0123456789"
    box = Relaybox(settings=Settings(database_url=database_url, admin_token=token), clock=clock)
    local(box)
    app = Starlette(routes=[Mount("/admin", app=build_admin(box))])
    try:
        endpoint_id, _ = await endpoint(box, "http://127.0.0.1:9/hook")
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://admin.test"
        ) as client:
            url = f"/admin/api/v1/endpoints/{endpoint_id}/replay-missing"
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            for raw in (b'{"since": 1e999, "reason": "x"}', b'{"since": "1e999", "reason": "x"}'):
                answer = await client.post(url, content=raw, headers=headers)
                assert answer.status_code == 400, (raw, answer.text)
            assert await box.store.flow.replay_job_latest(endpoint_id) is None
    finally:
        await box.close()


async def test_the_subscription_is_checked_off_the_event_loop(
    box: Relaybox, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    local(box, replay_batch=4)
    for n in range(10):
        clock.advance(1)
        await publish_one(box, "pet.adopted", {"n": n, "pad": "x" * 10_000})
    endpoint_id, _ = await endpoint(box, "http://127.0.0.1:9/hook", filter={"data.n": {"$gte": 3}})
    threads: list[int] = []
    holds = CompiledFilter.holds

    def spied(self: CompiledFilter, envelope: Any) -> bool:
        threads.append(threading.get_ident())
        return holds(self, envelope)

    monkeypatch.setattr(CompiledFilter, "holds", spied)
    job = await start_replay(box, endpoint_id, since=0.0, tenant="t1")
    assert job is not None
    done = await ReplayRunner(box).run_once()
    assert done is not None and (done.status, done.queued, done.scanned) == ("done", 7, 10)
    assert len(threads) == 10 and threading.get_ident() not in threads


async def test_a_step_that_dies_before_its_commit_leaves_nothing_and_is_done_again(
    box: Relaybox, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    local(box, replay_batch=5, lease_ttl=10.0)
    for n in range(12):
        clock.advance(0.01)
        await publish_one(box, "pet.adopted", {"n": n})
    endpoint_id, _ = await endpoint(box, "http://127.0.0.1:9/hook")
    job = await start_replay(box, endpoint_id, since=0.0, tenant="t1")
    assert job is not None
    first = ReplayRunner(box, "first")
    claimed = await first.claim()
    assert claimed is not None
    after_one = await first.step(claimed)  # one batch committed
    assert after_one is not None and after_one.queued == 5
    advance = type(box.store.flow).replay_job_advance

    async def dies(*args: Any, **kw: Any) -> Any:  # the process dies in the second batch,
        raise ConnectionResetError("killed")  # its deliveries inserted, not committed

    monkeypatch.setattr(type(box.store.flow), "replay_job_advance", dies)
    with pytest.raises(ConnectionResetError):
        await first.step(after_one)
    monkeypatch.setattr(type(box.store.flow), "replay_job_advance", advance)
    assert len(await rows_of(box, endpoint_id)) == 5  # the second batch rolled back
    second = ReplayRunner(box, "second")
    assert await second.run_once() is None  # the first one's lease is live
    clock.advance(11)  # ... until it runs out
    done = await second.run_once()
    assert done is not None and (done.status, done.queued, done.scanned) == ("done", 12, 12)
    rows = await rows_of(box, endpoint_id)
    assert len(rows) == len({r["message_id"] for r in rows}) == 12
    # The first runner, back, is fenced off: it queues nothing, counts nothing.
    with pytest.raises(Exception, match="rpl_"):
        await first.step(after_one)
    again = await box.store.flow.replay_job_get(job.id, None)
    assert again is not None and (again.status, again.queued) == ("done", 12)
    assert len(await rows_of(box, endpoint_id)) == 12


async def test_a_job_of_an_endpoint_disabled_meanwhile_fails_saying_why(
    box: Relaybox,
) -> None:
    local(box)
    await publish_one(box, "pet.adopted", {"n": 1})
    endpoint_id, _ = await endpoint(box, "http://127.0.0.1:9/hook")
    job = await start_replay(box, endpoint_id, since=0.0, tenant="t1")
    assert job is not None
    from relaybox.outbound import disable_endpoint

    await disable_endpoint(box, endpoint_id, tenant="t1")
    done = await ReplayRunner(box).run_once()
    assert done is not None and (done.status, done.error) == (
        "failed",
        "the endpoint is disabled",
    )
    assert done.finished_at is not None and await rows_of(box, endpoint_id) == []


async def test_a_step_that_keeps_failing_ends_the_job_failed_saying_why(
    box: Relaybox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error in the data or the code is tried three times, then the job ends
    ``failed`` with the error (it would otherwise hold the endpoint's one slot for
    good); the database being away is not such an error: the lease runs out and the
    job is taken again."""
    local(box)
    await publish_one(box, "pet.adopted", {"n": 1})
    endpoint_id, _ = await endpoint(box, "http://127.0.0.1:9/hook")
    job = await start_replay(box, endpoint_id, since=0.0, tenant="t1")
    assert job is not None
    page = type(box.store.flow).message_missing_page
    calls = 0

    async def outage(*args: Any, **kw: Any) -> Any:
        nonlocal calls
        calls += 1
        raise ConnectionResetError("the database went away")

    monkeypatch.setattr(type(box.store.flow), "message_missing_page", outage)
    runner = ReplayRunner(box)
    again = await runner.run_once()
    assert calls == 1 and again is not None and again.status == "running"

    async def broken(*args: Any, **kw: Any) -> Any:
        nonlocal calls
        calls += 1
        raise ValueError("a message the filter cannot read")

    calls = 0
    monkeypatch.setattr(type(box.store.flow), "message_missing_page", broken)
    await box.store.flow.replay_job_release(job.id, runner.name, now=box.clock.now())
    failed = await runner.run_once()
    assert calls == 3 and failed is not None
    assert (failed.status, failed.error) == (
        "failed",
        "a step failed 3 times: ValueError: a message the filter cannot read",
    )
    monkeypatch.setattr(type(box.store.flow), "message_missing_page", page)
    assert await rows_of(box, endpoint_id) == []
    # The endpoint's slot is free again: a new job can start.
    assert await start_replay(box, endpoint_id, since=0.0, tenant="t1") is not None


async def test_a_running_dispatcher_runs_the_job_it_is_told_of(
    box: Relaybox, clock: FrozenClock
) -> None:
    local(box, replay_batch=3)
    for n in range(8):
        clock.advance(0.01)
        await publish_one(box, "pet.adopted", {"n": n})
    endpoint_id, _ = await endpoint(box, "http://127.0.0.1:9/hook")
    dispatcher = box.dispatcher()
    running = asyncio.create_task(dispatcher.run())
    try:
        job = await start_replay(box, endpoint_id, since=0.0, tenant="t1")
        assert job is not None
        for _ in range(200):
            current = await box.store.flow.replay_job_get(job.id, "t1")
            if current is not None and current.status == "done":
                break
            await asyncio.sleep(0.05)
        assert current is not None and (current.status, current.queued) == ("done", 8)
    finally:
        dispatcher.stop()
        await asyncio.wait_for(running, 30)
    assert len(await rows_of(box, endpoint_id)) == 8


async def test_the_maintenance_job_drops_replay_jobs_once_their_age_is_past(
    box: Relaybox, clock: FrozenClock
) -> None:
    local(box)
    endpoint_id, _ = await endpoint(box, "http://127.0.0.1:9/hook")
    job = await start_replay(box, endpoint_id, since=0.0, tenant="t1")
    assert job is not None and await ReplayRunner(box).run_once() is not None
    await box.maintenance().run_once()
    assert await box.store.flow.replay_job_get(job.id, None) is not None  # ended just now
    clock.advance(box.settings.retention.outbox_payload_max_age + 1)
    await box.maintenance().run_once()
    assert await box.store.flow.replay_job_get(job.id, None) is None
