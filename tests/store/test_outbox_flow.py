"""Conformance of the store's endpoint-flow statements (``store/outbox_flow.py``) on
SQLite and PostgreSQL: the payload filter and pause columns of an endpoint, the lease
skipping a paused endpoint, the paused backlog, and replay missing's page and insert
(once per message and endpoint, in the order given, never for a purged body), and
its jobs (one per endpoint, a tenant's hourly count, leased, fenced, taken over)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pytest

from relaybox.store import Store, open_store
from relaybox.store.dispatch_rows import LeaseRequest
from relaybox.store.outbox_flow import ReplayStart
from relaybox.store.outbox_rows import NewMessage, new_id
from tests.support.store_rows import endpoint_write as endpoint

T0 = 1_000_000.0


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    s = open_store(database_url)
    await s.migrate()
    yield s
    await s.close()


async def publish(store: Store, tenant: str, targets: Sequence[str], *, at: float = T0) -> str:
    msg_id = new_id("msg", at)
    async with store.transaction() as conn:
        new = NewMessage(msg_id, tenant, "pet.adopted", None, '{"id":"' + msg_id + '"}', at)
        assert await store.outbox.message_insert(conn, new)
        if targets:
            await store.outbox.delivery_insert(conn, msg_id, tenant, targets, now=at)
    return msg_id


def lease_request(owner: str = "d1") -> LeaseRequest:
    at = T0 + 1
    return LeaseRequest(
        owner=owner, slots=10, channels=["webhook"], now=at, until=at + 60, deadline=30
    )


def no_secrets(stored: Sequence[str]) -> tuple[tuple[str, ...], str | None]:
    return tuple(stored), None


async def test_an_endpoint_keeps_its_filter_and_pause(store: Store) -> None:
    flt = {"data.country": {"$in": ["PT"]}}
    await store.outbox.endpoint_create(endpoint("ep_1", payload_filter=flt), "s", quota=5, now=T0)
    await store.outbox.endpoint_create(endpoint("ep_2"), "s", quota=5, now=T0)
    found = await store.outbox.endpoint_get("ep_1", "t1")
    assert found is not None and found.payload_filter == flt and found.paused_at is None
    async with store.transaction() as conn:
        subs = (await store.outbox.publish_context(conn, "t1", "pet.born")).subscribers
    # Stored as compact JSON: what a publish reads is the size the filter was checked at.
    assert subs == [("ep_1", '["*"]', '{"data.country":{"$in":["PT"]}}'), ("ep_2", '["*"]', None)]

    await store.outbox.endpoint_update(endpoint("ep_1", payload_filter=None), now=T0 + 1)
    assert await store.flow.endpoint_pause("ep_1", "t1", paused=True, now=T0 + 2)
    assert not await store.flow.endpoint_pause("ep_1", None, paused=True, now=T0 + 3)
    [first, _] = await store.outbox.endpoint_list("t1", limit=10)
    assert (first.payload_filter, first.paused_at) == (None, T0 + 2)
    async with store.transaction() as conn:  # a paused endpoint still subscribes
        subscribers = (await store.outbox.publish_context(conn, "t1", "pet.born")).subscribers
        assert [s[0] for s in subscribers] == ["ep_1", "ep_2"]
    async with store.transaction() as conn:  # failing when paused
        await store.dispatch.endpoint_failed(conn, "ep_1", now=T0 + 3)
    assert await store.flow.endpoint_pause("ep_1", None, paused=False, now=T0 + 4)
    resumed = await store.outbox.endpoint_get("ep_1", None)
    # The resume ends the failure streak: the time paused is not failing time.
    assert resumed is not None and (resumed.paused_at, resumed.failing_since) == (None, None)


async def test_the_lease_skips_a_paused_endpoint(store: Store) -> None:
    await store.outbox.endpoint_create(endpoint("ep_1"), "s", quota=5, now=T0)
    await store.outbox.endpoint_create(endpoint("ep_2"), "s", quota=5, now=T0)
    await publish(store, "t1", ["ep_1", "ep_2"])
    await publish(store, "t1", ["ep_1"])
    assert await store.flow.endpoint_pause("ep_1", "t1", paused=True, now=T0)
    leased = await store.dispatch.outbox_lease(lease_request(), no_secrets)
    assert [d.lane for d in leased.deliveries] == ["ep_2"]
    assert await store.flow.endpoint_paused_backlog() == {"ep_1": 2}
    assert await store.flow.endpoint_pause("ep_1", "t1", paused=False, now=T0)
    again = await store.dispatch.outbox_lease(lease_request("d2"), no_secrets)
    assert [d.lane for d in again.deliveries] == ["ep_1", "ep_1"]
    assert await store.flow.endpoint_paused_backlog() == {}


async def test_missing_messages_are_paged_and_inserted_once(store: Store) -> None:
    await store.outbox.endpoint_create(endpoint("ep_1"), "s", quota=5, now=T0)
    ids = [await publish(store, "t1", [], at=T0 + n) for n in range(5)]
    await publish(store, "t2", [], at=T0)  # another tenant's
    delivered = await publish(store, "t1", ["ep_1"], at=T0 + 5)
    async with store.transaction() as conn:
        page = await store.flow.message_missing_page(
            conn, "t1", "ep_1", since=T0 + 1, until=T0 + 9, after=None, limit=2
        )
        assert [m.id for m in page] == ids[1:3]
        assert page[0].event_type == "pet.adopted" and page[0].body.startswith('{"id":')
        after = (page[-1].created_at, page[-1].id)
        rest = await store.flow.message_missing_page(
            conn, "t1", "ep_1", since=T0 + 1, until=T0 + 9, after=after, limit=10
        )
        assert [m.id for m in rest] == ids[3:]  # not `delivered`: it has a delivery
        upto = await store.flow.message_missing_page(
            conn, "t1", "ep_1", since=T0 + 1, until=T0 + 3, after=after, limit=10
        )
        assert [m.id for m in upto] == ids[3:4]  # published at or before until only
        # In the order given, once: a second insert of the same ids inserts nothing.
        wanted = [ids[4], ids[1], delivered, "msg_none"]
        assert await store.flow.delivery_insert_missing(conn, "ep_1", "t1", wanted, now=T0 + 9) == 2
        assert await store.flow.delivery_insert_missing(conn, "ep_1", "t1", wanted, now=T0 + 9) == 0
        assert await store.flow.delivery_insert_missing(conn, "ep_1", "t1", [], now=T0 + 9) == 0
        # Another tenant's message is never inserted for this endpoint's tenant.
        assert await store.flow.delivery_insert_missing(conn, "ep_1", "t2", ids[:1], now=T0) == 0
        left = await store.flow.message_missing_page(
            conn, "t1", "ep_1", since=0, until=T0 + 9, after=None, limit=9
        )
        assert [m.id for m in left] == [ids[0], ids[2], ids[3]]
    rows = await store.outbox.delivery_list(
        "t1", message_id=None, endpoint_id="ep_1", undelivered=False, limit=10
    )
    # Newest first: the two inserted rows in the order given (ids[4] before ids[1]).
    assert [(r.message_id, r.status) for r in rows] == [
        (ids[1], "pending"),
        (ids[4], "pending"),
        (delivered, "pending"),
    ]
    assert all(r.key == f"{r.message_id}:ep_1" for r in rows)


async def test_a_purged_message_is_neither_read_nor_inserted(store: Store) -> None:
    await store.outbox.endpoint_create(endpoint("ep_1"), "s", quota=5, now=T0)
    kept = await publish(store, "t1", [], at=T0)
    purged = await publish(store, "t1", [], at=T0)
    async with store.transaction() as conn:  # as retention leaves it
        await conn.exec_driver_sql(
            f"UPDATE relaybox_messages SET body = 'null', purged_at = 1 WHERE id = '{purged}'"
        )
    async with store.transaction() as conn:
        page = await store.flow.message_missing_page(
            conn, "t1", "ep_1", since=0, until=T0 + 9, after=None, limit=9
        )
        assert [m.id for m in page] == [kept]
        both = [kept, purged]
        assert await store.flow.delivery_insert_missing(conn, "ep_1", "t1", both, now=T0) == 1


async def start_job(
    store: Store,
    job_id: str,
    endpoint_id: str = "ep_1",
    *,
    now: float = T0,
    per_hour: int | None = None,
) -> ReplayStart:
    return await store.flow.replay_job_start(
        job_id, "t1", endpoint_id, since=0.0, until=T0 + 9, max_queued=10, now=now,
        per_hour=per_hour,
    )  # fmt: skip


async def test_a_replay_job_is_one_per_endpoint_and_rate_limited_per_tenant(store: Store) -> None:
    first = await start_job(store, "rpl_1")
    assert first.job is not None and first.job.status == "queued"
    assert (first.job.since, first.job.until, first.job.cursor) == (0.0, T0 + 9, None)
    # A second one for the same endpoint, while the first waits: refused, naming it.
    again = await start_job(store, "rpl_2")
    assert (again.job, again.running) == (None, "rpl_1")
    # Another endpoint's is fine, until the tenant's hourly count is reached.
    other = await start_job(store, "rpl_3", "ep_2", per_hour=2, now=T0 + 10)
    assert other.job is not None
    limited = await start_job(store, "rpl_4", "ep_3", per_hour=2, now=T0 + 20)
    assert limited.job is None and limited.retry_after == 3600 - 20
    # An hour after the first, one more may start.
    later = await start_job(store, "rpl_5", "ep_3", per_hour=2, now=T0 + 3601)
    assert later.job is not None
    assert (await store.flow.replay_job_get("rpl_3", "t1")) is not None
    assert (await store.flow.replay_job_get("rpl_3", "t2")) is None  # another tenant's


async def test_a_replay_job_is_leased_fenced_and_taken_over_once_its_lease_ran_out(
    store: Store,
) -> None:
    await start_job(store, "rpl_1")
    await start_job(store, "rpl_2", "ep_2", now=T0 + 1)
    a = await store.flow.replay_job_claim("a", now=T0, ttl=60)
    b = await store.flow.replay_job_claim("b", now=T0, ttl=60)
    assert a is not None and b is not None and (a.id, b.id) == ("rpl_1", "rpl_2")
    assert a.status == "running" and a.started_at == T0
    assert await store.flow.replay_job_claim("c", now=T0 + 59, ttl=60) is None  # both held
    async with store.transaction() as conn:
        counts = await store.flow.replay_job_advance(
            conn, "rpl_1", "a", scanned=5, queued=2, cursor=(T0, "msg_x"), now=T0 + 1, ttl=60
        )
    assert counts == (5, 2)
    # a's lease (renewed to T0 + 61) runs out: c takes the job on where a left it.
    taken = await store.flow.replay_job_claim("c", now=T0 + 62, ttl=60, job_id="rpl_1")
    assert taken is not None and (taken.scanned, taken.queued, taken.cursor) == (
        5, 2, (T0, "msg_x")
    )  # fmt: skip
    async with store.transaction() as conn:  # a's next step is fenced off
        assert await store.flow.replay_job_advance(
            conn, "rpl_1", "a", scanned=1, queued=1, cursor=(T0, "msg_y"), now=T0 + 63, ttl=60
        ) is None  # fmt: skip
        assert not await store.flow.replay_job_finish(conn, "rpl_1", "a", status="done", now=T0)
        assert await store.flow.replay_job_finish(
            conn, "rpl_1", "c", status="done", now=T0 + 63, resume_since=T0
        )
    done = await store.flow.replay_job_get("rpl_1", None)
    assert done is not None and (done.status, done.resume_since, done.finished_at) == (
        "done", T0, T0 + 63
    )  # fmt: skip
    # A finished job is never claimed again, and frees its endpoint for the next one.
    assert await store.flow.replay_job_claim("d", now=T0 + 999, ttl=60, job_id="rpl_1") is None
    assert (await start_job(store, "rpl_3", now=T0 + 64)).job is not None
    latest = await store.flow.replay_job_latest("ep_1")  # the endpoint's newest job
    assert latest is not None and latest.id == "rpl_3"
    assert await store.flow.replay_job_latest("ep_none") is None
    # A released job is claimable at once.
    await store.flow.replay_job_release("rpl_2", "b", now=T0 + 2)
    back = await store.flow.replay_job_claim("e", now=T0 + 2, ttl=60, job_id="rpl_2")
    assert back is not None and back.status == "running"


async def test_maintenance_drops_replay_jobs_that_ended_long_enough_ago(store: Store) -> None:
    for n, endpoint_id in enumerate(("ep_1", "ep_2", "ep_3")):
        await start_job(store, f"rpl_{n}", endpoint_id, now=T0 + n)
    for n in range(2):  # rpl_0 ends at T0 + 10, rpl_1 at T0 + 20; rpl_2 still waits
        claimed = await store.flow.replay_job_claim("a", now=T0 + n, ttl=60, job_id=f"rpl_{n}")
        assert claimed is not None
        async with store.transaction() as conn:
            assert await store.flow.replay_job_finish(
                conn, f"rpl_{n}", "a", status="done" if n else "failed", now=T0 + 10 * (n + 1)
            )
    assert await store.flow.replay_jobs_purge(T0 + 15, limit=10) == 1
    assert await store.flow.replay_jobs_purge(T0 + 999, limit=10) == 1
    assert await store.flow.replay_jobs_purge(T0 + 999, limit=10) == 0
    assert await store.flow.replay_job_get("rpl_0", None) is None
    assert await store.flow.replay_job_get("rpl_1", None) is None
    waiting = await store.flow.replay_job_get("rpl_2", None)
    assert waiting is not None and waiting.status == "queued"  # never dropped unfinished
