"""Conformance of the store's sending side (``store/outbox.py``) on SQLite and
PostgreSQL: endpoints, lanes and secrets, messages and deliveries, the dispatcher's
lease, release and records, the operator views, admin sessions, portal tokens, event
types and API keys. Rows are set up through store methods; ``store.fetch_all`` reads them."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import AsyncIterator, Sequence

import pytest

from relaybox.store import Store, open_store
from relaybox.store.dispatch_rows import Attempt, Decision, Fairness, LeaseRequest
from relaybox.store.outbox_rows import (
    EndpointQuotaReached,
    Message,
    NewMessage,
    new_id,
)
from tests.support.store_rows import attempt
from tests.support.store_rows import endpoint_write as endpoint

T0 = 1_000_000.0


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    s = open_store(database_url)
    await s.migrate()
    yield s
    await s.close()


async def publish(
    store: Store, tenant: str, targets: Sequence[str], *, key: str | None = None, at: float = T0
) -> str:
    msg_id = new_id("msg", at)
    async with store.transaction() as conn:
        new = NewMessage(msg_id, tenant, "pet.adopted", key, '{"id":"' + msg_id + '"}', at)
        assert await store.outbox.message_insert(conn, new)
        if targets:
            await store.outbox.delivery_insert(conn, msg_id, tenant, targets, now=at)
    return msg_id


def lease_request(owner: str = "d1", slots: int = 10, at: float = T0 + 1) -> LeaseRequest:
    return LeaseRequest(
        owner=owner, slots=slots, channels=["webhook"], now=at, until=at + 60, deadline=30
    )


def no_secrets(stored: Sequence[str]) -> tuple[tuple[str, ...], str | None]:
    return tuple(stored), None


async def test_new_id_sorts_by_time() -> None:
    a, b = new_id("msg", T0), new_id("msg", T0 + 1)
    assert a.startswith("msg_") and a < b and len(a) == len(b)


async def test_endpoint_create_get_list_update(store: Store) -> None:
    created = await store.outbox.endpoint_create(
        endpoint("ep_1", schedule=[1.0, 2.0], event_types=["pet.*"]), "s1", quota=5, now=T0
    )
    assert created.id == "ep_1" and created.status == "enabled"
    assert created.event_types == ["pet.*"] and created.schedule == [1.0, 2.0]
    assert created.max_in_flight == 4 and created.created_at == T0
    assert await store.outbox.endpoint_get("ep_1", "t1") == created
    assert await store.outbox.endpoint_get("ep_1", None) == created
    assert await store.outbox.endpoint_get("ep_1", "other") is None
    await store.outbox.endpoint_create(endpoint("ep_2", tenant="t2"), "s2", quota=5, now=T0 + 1)
    assert [e.id for e in await store.outbox.endpoint_list(None, limit=10)] == ["ep_1", "ep_2"]
    assert [e.id for e in await store.outbox.endpoint_list("t2", limit=10)] == ["ep_2"]
    assert len(await store.outbox.endpoint_list(None, limit=1)) == 1

    await store.outbox.endpoint_update(
        endpoint("ep_1", url="https://example.com/new", max_in_flight=2, rate_limit=3.0),
        now=T0 + 5,
    )
    updated = await store.outbox.endpoint_get("ep_1", "t1")
    assert updated is not None
    assert updated.url == "https://example.com/new" and updated.updated_at == T0 + 5
    assert (updated.max_in_flight, updated.rate_limit, updated.schedule) == (2, 3.0, None)


async def test_endpoint_create_holds_the_quota(store: Store) -> None:
    await store.outbox.endpoint_create(endpoint("ep_1"), "s", quota=2, now=T0)
    await store.outbox.endpoint_create(endpoint("ep_2"), "s", quota=2, now=T0)
    with pytest.raises(EndpointQuotaReached) as caught:
        await store.outbox.endpoint_create(endpoint("ep_3"), "s", quota=2, now=T0)
    assert caught.value.count == 2
    assert await store.outbox.endpoint_get("ep_3", None) is None
    await store.outbox.endpoint_create(endpoint("ep_4", tenant="t2"), "s", quota=2, now=T0)


async def test_secrets_active_rotate_pages_and_swap(store: Store) -> None:
    await store.outbox.endpoint_create(endpoint("ep_1"), "plain-1", quota=5, now=T0)
    assert not await store.outbox.endpoint_secret_sealed_any()
    async with store.transaction() as conn:
        await store.outbox.endpoint_secret_rotate(
            conn, "ep_1", "fernet:x", until=T0 + 100, now=T0 + 1
        )
        active = await store.outbox.endpoint_secrets_active(conn, ["ep_1"], now=T0 + 2)
    assert [s.secret for s in active] == ["fernet:x", "plain-1"]  # newest first
    assert active[1].expires_at == T0 + 100
    async with store.transaction() as conn:
        later = await store.outbox.endpoint_secrets_active(conn, ["ep_1"], now=T0 + 101)
        assert [s.secret for s in later] == ["fernet:x"]
        every = await store.outbox.endpoint_secrets_page(conn, 0, 10)
        plain = await store.outbox.endpoint_secrets_page(conn, 0, 10, plaintext=True)
        assert [s for _, s in every] == ["plain-1", "fernet:x"]
        assert [s for _, s in plain] == ["plain-1"]
        assert await store.outbox.endpoint_secrets_page(conn, every[0][0], 10) == every[1:]
        secret_id = plain[0][0]
        assert await store.outbox.endpoint_secret_swap(conn, secret_id, "plain-1", "fernet:y")
        assert not await store.outbox.endpoint_secret_swap(conn, secret_id, "plain-1", "fernet:z")
    assert await store.outbox.endpoint_secret_sealed_any()


async def test_secrets_reveal_each_active_secret_once(store: Store) -> None:
    """The portal's reveal: the active secrets not revealed before, newest first, marked
    at ``now``; a second call gets none; a rolled-back reveal reveals nothing; an expired
    secret is never revealed; a rotation adds one to reveal."""
    await store.outbox.endpoint_create(endpoint("ep_1"), "s-1", quota=5, now=T0)
    await store.outbox.endpoint_create(endpoint("ep_2"), "s-2", quota=5, now=T0)
    with pytest.raises(RuntimeError):
        async with store.transaction() as conn:
            assert [
                r.secret for r in await store.outbox.endpoint_secrets_reveal(conn, "ep_1", now=T0)
            ]
            raise RuntimeError("rolled back")
    async with store.transaction() as conn:
        await store.outbox.endpoint_secret_rotate(conn, "ep_1", "s-1b", until=T0 + 100, now=T0 + 1)
        first = await store.outbox.endpoint_secrets_reveal(conn, "ep_1", now=T0 + 2)
        again = await store.outbox.endpoint_secrets_reveal(conn, "ep_1", now=T0 + 3)
    assert [(r.endpoint_id, r.secret) for r in first] == [("ep_1", "s-1b"), ("ep_1", "s-1")]
    assert first[1].expires_at == T0 + 100 and again == []
    async with store.transaction() as conn:
        await store.outbox.endpoint_secret_rotate(conn, "ep_2", "s-2b", until=T0 + 10, now=T0 + 1)
        late = await store.outbox.endpoint_secrets_reveal(conn, "ep_2", now=T0 + 11)
        await store.outbox.endpoint_secret_rotate(conn, "ep_1", "s-1c", until=T0 + 50, now=T0 + 20)
        rotated = await store.outbox.endpoint_secrets_reveal(conn, "ep_1", now=T0 + 21)
    assert [r.secret for r in late] == ["s-2b"]  # s-2 expired unrevealed: never shown
    assert [r.secret for r in rotated] == ["s-1c"]


async def test_publish_statements_in_the_callers_transaction(store: Store) -> None:
    await store.outbox.endpoint_create(
        endpoint("ep_1", event_types=["pet.*"]), "s", quota=5, now=T0
    )
    await store.outbox.endpoint_create(endpoint("ep_2"), "s", quota=5, now=T0)
    await store.outbox.endpoint_create(endpoint("ep_3", tenant="t2"), "s", quota=5, now=T0)
    await store.catalog.event_type_upsert("pet.born", "", '{"type":"object"}', now=T0)
    async with store.transaction() as conn:
        context = await store.outbox.publish_context(conn, "t1", "pet.born")
        # The schema's row (its id NULL) sorts first on both backends, not as a subscriber.
        assert context.schema == '{"type":"object"}'
        assert context.subscribers == [("ep_1", '["pet.*"]', None), ("ep_2", '["*"]', None)]
        assert (await store.outbox.publish_context(conn, "t3", "pet.born")).subscribers == []

    msg_id = await publish(store, "t1", ["ep_1", "ep_2"], key="k1")
    async with store.transaction() as conn:
        found = await store.outbox.message_get_by_key(conn, "t1", "k1")
        assert isinstance(found, Message) and found.id == msg_id and not found.created
        assert await store.outbox.message_get_by_key(conn, "t2", "k1") is None
        again = NewMessage("msg_other", "t1", "pet.adopted", "k1", "{}", T0)
        assert not await store.outbox.message_insert(conn, again)  # the key is taken

    # A rolled-back transaction takes its message and deliveries with it.
    with pytest.raises(RuntimeError):
        async with store.transaction() as conn:
            new = NewMessage("msg_gone", "t1", "pet.adopted", None, "{}", T0)
            assert await store.outbox.message_insert(conn, new)
            await store.outbox.delivery_insert(conn, "msg_gone", "t1", ["ep_1"], now=T0)
            raise RuntimeError("roll back")
    assert await store.outbox.message_get("msg_gone", None) is None
    rows = await store.outbox.delivery_list(
        None, message_id=None, endpoint_id=None, undelivered=False, limit=10
    )
    assert sorted(r.endpoint_id or "" for r in rows) == ["ep_1", "ep_2"]
    assert {r.message_id for r in rows} == {msg_id} and rows[0].event_type == "pet.adopted"


async def test_message_publish_inserts_the_message_and_its_rows_or_nothing(store: Store) -> None:
    """``message_publish`` inserts the message and one row
    per endpoint named; for a taken idempotency key, neither. Ordered endpoints' rows
    carry the message's ordering key and sequence, the others' none."""
    await store.outbox.endpoint_create(endpoint("ep_1"), "s", quota=5, now=T0)
    await store.outbox.endpoint_create(endpoint("ep_2", ordered=True), "s", quota=5, now=T0)
    keyed = NewMessage("msg_k", "t1", "pet.adopted", "k1", "{}", T0, "order-1", 7)
    async with store.transaction() as conn:
        assert await store.outbox.message_publish(conn, keyed, ["ep_1", "ep_2"])
        again = NewMessage("msg_again", "t1", "pet.adopted", "k1", "{}", T0)
        assert not await store.outbox.message_publish(conn, again, ["ep_1"])
        bare = NewMessage("msg_none", "t1", "pet.adopted", None, "{}", T0)
        assert await store.outbox.message_publish(conn, bare, [])
    rows = await store.fetch_all(
        "SELECT message_id, endpoint_id, ordering_key, sequence FROM relaybox_outbox"
        " ORDER BY endpoint_id"
    )
    assert [
        (r["message_id"], r["endpoint_id"], r["ordering_key"], r["sequence"]) for r in rows
    ] == [
        ("msg_k", "ep_1", None, None),
        ("msg_k", "ep_2", "order-1", 7),
    ]
    assert await store.outbox.message_get("msg_again", None) is None
    assert await store.outbox.message_get("msg_none", None) is not None


async def test_message_publish_once_relaybox_began_the_transaction(store: Store) -> None:
    """As ``publish`` calls it: after a statement of relaybox's began the transaction.
    Committed with it, gone with a rollback; any text kept as it was."""
    await store.outbox.endpoint_create(endpoint("ep_1"), "s", quota=5, now=T0)
    await store.outbox.endpoint_create(endpoint("ep_2", ordered=True), "s", quota=5, now=T0)
    note = "it's \"quoted\" \\ a back\\slash, $1, E'\\x41', ünïcödé ✓ 🦀"
    body = json.dumps({"note": note}, ensure_ascii=False)
    new = NewMessage("msg_c", "t1", "pet.adopted", None, body, T0 + 0.5, "k'1", 3)
    async with store.transaction() as conn:
        await store.outbox.publish_context(conn, "t1", "pet.adopted")
        assert await store.outbox.message_publish(conn, new, ["ep_1", "ep_2"])
        # Written at once: later statements of the transaction see it.
        found = await conn.exec_driver_sql("SELECT count(*) FROM relaybox_messages")
        assert found.scalar() == 1
    got = await store.outbox.message_get("msg_c", "t1")
    assert got is not None and got.envelope == {"note": note} and got.created_at == T0 + 0.5
    assert (got.ordering_key, got.sequence) == ("k'1", 3)
    rows = await store.fetch_all(
        "SELECT message_id, endpoint_id, tenant, ordering_key, sequence, status"
        " FROM relaybox_outbox ORDER BY endpoint_id"
    )
    assert [tuple(r.values()) for r in rows] == [
        ("msg_c", "ep_1", "t1", None, None, "pending"),
        ("msg_c", "ep_2", "t1", "k'1", 3, "pending"),
    ]
    with pytest.raises(RuntimeError):
        async with store.transaction() as conn:
            await store.outbox.publish_context(conn, "t1", "pet.adopted")
            gone = NewMessage("msg_r", "t1", "pet.adopted", None, "{}", T0)
            assert await store.outbox.message_publish(conn, gone, ["ep_1"])
            raise RuntimeError("roll back")
    assert await store.outbox.message_get("msg_r", None) is None
    assert len(await store.fetch_all("SELECT id FROM relaybox_outbox")) == 2


async def test_message_get_and_list(store: Store) -> None:
    first = await publish(store, "t1", [], at=T0)
    second = await publish(store, "t1", [], at=T0 + 1)
    other = await publish(store, "t2", [], at=T0 + 2)
    got = await store.outbox.message_get(first, "t1")
    assert got is not None and got.envelope == {"id": first} and got.created_at == T0
    assert await store.outbox.message_get(first, "t2") is None
    assert (await store.outbox.message_get(other, None)) is not None
    listed = await store.outbox.message_list("t1", event_type=None, before=None, limit=10)
    assert [m.id for m in listed] == [second, first]
    page = await store.outbox.message_list(None, event_type=None, before=(T0 + 2, other), limit=1)
    assert [m.id for m in page] == [second]
    typed = await store.outbox.message_list(None, event_type="nope", before=None, limit=10)
    assert typed == []


async def test_lease_record_attempts_and_listings(store: Store) -> None:
    await store.outbox.endpoint_create(endpoint("ep_1"), "whsec_x", quota=5, now=T0)
    msg_id = await publish(store, "t1", ["ep_1"])
    leased = await store.dispatch.outbox_lease(lease_request(), no_secrets)
    assert len(leased.deliveries) == 1
    d = leased.deliveries[0]
    assert (d.channel, d.tenant, d.attempt, d.lane, d.uncertain) == (
        "webhook",
        "t1",
        1,
        "ep_1",
        False,
    )
    assert d.message is not None and d.message.id == msg_id
    assert d.endpoint is not None and d.endpoint.secrets == ("whsec_x",)
    assert d.deadline == 30
    # Leased: nothing more is due.
    assert (await store.dispatch.outbox_lease(lease_request("d2"), no_secrets)).deliveries == []

    async with store.transaction() as conn:
        # A dispatcher whose lease was taken over records nothing but its attempt,
        # logged as fenced; the holder records the outcome and its attempt.
        stale = dataclasses.replace(d, lease_token=d.lease_token + 7)
        fenced = attempt(stale, started=T0 + 1, duration=0.5, dispatcher="d0")
        assert await store.dispatch.outbox_record(conn, [fenced], now=T0 + 2) == set()
        done = attempt(d, started=T0 + 1, duration=0.25)
        assert await store.dispatch.outbox_record(conn, [done], now=T0 + 2) == {
            (d.id, d.lease_token)
        }
    rows = await store.outbox.delivery_list(
        "t1", message_id=msg_id, endpoint_id=None, undelivered=False, limit=10
    )
    assert [(r.status, r.attempts, r.last_status) for r in rows] == [("sent", 1, 200)]
    assert (
        await store.outbox.delivery_list(
            "t1", message_id=None, endpoint_id="ep_1", undelivered=True, limit=10
        )
        == []
    )
    attempts = await store.outbox.attempt_list(msg_id, "t1")
    assert [(a.outbox_id, a.endpoint_id, a.outcome, a.status_code) for a in attempts] == [
        (d.id, "ep_1", "fenced", 200),
        (d.id, "ep_1", "sent", 200),
    ]
    assert await store.outbox.attempt_list(msg_id, "t2") == []
    recent = await store.outbox.endpoint_attempts("ep_1", limit=1)
    assert [(a.message_id, a.outcome, a.duration) for a in recent] == [(msg_id, "sent", 0.25)]
    health = await store.outbox.endpoint_health(since=T0)
    assert (health["ep_1"].attempts, health["ep_1"].succeeded) == (2, 1)
    assert await store.outbox.endpoint_health(since=T0 + 10) == {}
    assert await store.outbox.endpoint_backlog() == {}
    assert await store.outbox.message_purged_at(msg_id) is None


async def test_lease_respects_lanes_and_fairness(store: Store) -> None:
    await store.outbox.endpoint_create(endpoint("ep_1", max_in_flight=2), "s", quota=5, now=T0)
    for _ in range(3):
        await publish(store, "t1", ["ep_1"])
    first = await store.dispatch.outbox_lease(lease_request(), no_secrets)
    assert len(first.deliveries) == 2  # the lane's cap
    assert [d.id for d in first.deliveries] == sorted(d.id for d in first.deliveries)
    assert (await store.dispatch.outbox_lease(lease_request("d2"), no_secrets)).deliveries == []
    await store.dispatch.outbox_release(first.deliveries)  # due again at once, as if never leased
    none_for_t1 = LeaseRequest(
        owner="d3",
        slots=10,
        channels=["webhook"],
        now=T0 + 1,
        until=T0 + 61,
        deadline=30,
        fair=Fairness(held={"t1": 0}),
    )
    assert (await store.dispatch.outbox_lease(none_for_t1, no_secrets)).deliveries == []
    again = await store.dispatch.outbox_lease(lease_request("d4"), no_secrets)
    assert len(again.deliveries) == 2
    assert all(not d.uncertain for d in again.deliveries)


async def test_lease_records_successes_where_the_store_can(store: Store) -> None:
    await store.outbox.endpoint_create(endpoint("ep_1"), "s", quota=5, now=T0)
    msg_id = await publish(store, "t1", ["ep_1"])
    (d,) = (await store.dispatch.outbox_lease(lease_request(), no_secrets)).deliveries
    headers = '{"request": [["webhook-id", "m"]], "response": []}'
    sent = [attempt(d, started=T0 + 1, response="ok", headers=headers)]
    request = LeaseRequest(
        owner="d1", slots=0, channels=[], now=T0 + 2, until=T0 + 62, deadline=30, sent=sent
    )
    if not store.dispatch.lease_records:
        assert store.backend == "sqlite"
        with pytest.raises(NotImplementedError):
            await store.dispatch.outbox_lease(request, no_secrets)
        return
    leased = await store.dispatch.outbox_lease(request, no_secrets)
    assert leased.deliveries == [] and leased.written == {(d.id, d.lease_token)}
    rows = await store.fetch_all("SELECT status FROM relaybox_outbox")
    assert [r["status"] for r in rows] == ["sent"]
    [logged] = await store.outbox.attempt_list(msg_id, "t1")
    assert (logged.outcome, logged.status_code, logged.started_at) == ("sent", 200, T0 + 1)
    assert (logged.response, logged.headers) == ("ok", headers)


async def test_seed_5019_a_late_fenced_attempt_keeps_no_answer_of_an_erased_delivery(
    store: Store,
) -> None:
    """A dispatcher whose lease ran out records its attempt late, fenced, after another
    one sent the row and an erasure emptied it: the attempt is logged without what the
    receiver answered (found by the simulation's ``erased`` checker, seed 5019 on
    SQLite)."""
    await store.outbox.endpoint_create(endpoint("ep_1"), "s", quota=5, now=T0)
    msg_id = await publish(store, "t1", ["ep_1"])
    (d,) = (await store.dispatch.outbox_lease(lease_request(), no_secrets)).deliveries
    digest = hashlib.sha256(b"cus_late").digest()
    async with store.transaction() as conn:
        await store.erasure.subject_index(conn, digest, "message", msg_id)
        sent = Attempt(d, None, Decision("sent", "accepted"), "d1", T0 + 1, 0.0)  # no log row
        assert await store.dispatch.outbox_record(conn, [sent], now=T0 + 2) == {
            (d.id, d.lease_token)
        }
    erasure_id, _ = await store.erasure.begin(
        actor="dpo", reason="", scope="subject", digest=digest, tenant=None, now=T0 + 3
    )
    erasure = await store.erasure.get(erasure_id)
    assert erasure is not None
    assert (await store.erasure.erase_batch(erasure, now=T0 + 3, limit=10))["outbox"] == 1
    answer, headers = '{"customer": "cus_late"}', '{"response": [["X-Customer", "cus_late"]]}'
    async with store.transaction() as conn:  # the late one, through the generic path
        late = dataclasses.replace(d, lease_token=d.lease_token - 1)
        fields = {"response": answer, "headers": headers, "started": T0 + 1, "duration": 0.2}
        log = attempt(late, label="fenced", dispatcher="d0", **fields)  # type: ignore[arg-type]
        quoting = attempt(
            late,
            "pending",
            label="fenced",
            code=500,
            error="unknown customer cus_late",
            dispatcher="d0",
            started=T0 + 1,
            duration=0.2,
        )
        await store.dispatch.outbox_attempts_insert(conn, [log, quoting])
    if store.dispatch.lease_records:  # and through the lease that records successes
        stale = attempt(late, dispatcher="d0", **fields)  # type: ignore[arg-type]
        request = LeaseRequest(
            owner="d0", slots=0, channels=[], now=T0 + 4, until=T0 + 64, deadline=30, sent=[stale]
        )
        assert (await store.dispatch.outbox_lease(request, no_secrets)).written == set()
    logged = await store.fetch_all(
        "SELECT outcome, status_code, error, response, headers FROM relaybox_outbox_attempts"
    )
    assert logged and all(r["outcome"] == "fenced" for r in logged), logged
    assert all((r["response"], r["headers"]) == (None, None) for r in logged)
    # The error text of an erased delivery's late attempt is redacted, as an erasure does.
    errors = sorted((r["status_code"], r["error"]) for r in logged)
    assert errors[-1] == (500, "(erased)") and all(e is None for _, e in errors[:-1]), errors


async def test_failure_streaks(store: Store) -> None:
    await store.outbox.endpoint_create(endpoint("ep_1"), "s", quota=5, now=T0)
    await store.outbox.endpoint_create(endpoint("ep_2"), "s", quota=5, now=T0)
    async with store.transaction() as conn:
        streak = await store.dispatch.endpoint_failed(conn, "ep_1", now=T0 + 1)
        assert streak is not None and (streak.status, streak.failing_since) == ("enabled", T0 + 1)
        later = await store.dispatch.endpoint_failed(conn, "ep_1", now=T0 + 5)
        assert later is not None and later.failing_since == T0 + 1  # the streak runs on
        assert await store.dispatch.endpoint_failed(conn, "nope", now=T0) is None
        await store.dispatch.endpoint_failed(conn, "ep_2", now=T0 + 1)
        await store.dispatch.endpoint_succeeded(conn, "ep_1")
        await store.dispatch.endpoints_succeeded(conn, ["ep_2"])
    for eid in ("ep_1", "ep_2"):
        e = await store.outbox.endpoint_get(eid, None)
        assert e is not None and e.failing_since is None


async def test_status_kill_redeliver_recover_delete(store: Store) -> None:
    await store.outbox.endpoint_create(endpoint("ep_1"), "s", quota=5, now=T0)
    msg_id = await publish(store, "t1", ["ep_1"])
    async with store.transaction() as conn:
        change = await store.outbox.endpoint_set_status(
            conn, "ep_1", "disabled", reason="manual", now=T0 + 1
        )
        assert change is not None and (change.tenant, change.url) == (
            "t1",
            "https://example.com/ep_1",
        )
        again = await store.outbox.endpoint_set_status(
            conn, "ep_1", "disabled", reason="manual", now=T0 + 1
        )
        assert again is None
        await store.outbox.delivery_kill_endpoint(conn, "ep_1", "endpoint_disabled", now=T0 + 1)
    (row,) = await store.outbox.delivery_list(
        None, message_id=msg_id, endpoint_id=None, undelivered=True, limit=10
    )
    assert (row.status, row.dead_reason) == ("dead", "endpoint_disabled")
    backlog = await store.outbox.endpoint_backlog()
    assert (backlog["ep_1"].dead, backlog["ep_1"].pending) == (1, 0)
    # Redelivery goes only to enabled endpoints.
    assert (
        await store.outbox.delivery_redeliver(msg_id, tenant="t1", endpoint_id=None, now=T0 + 2)
        == 0
    )
    async with store.transaction() as conn:
        await store.outbox.endpoint_set_status(conn, "ep_1", "enabled", reason=None, now=T0 + 2)
    assert await store.outbox.delivery_recover("ep_1", since=T0 + 10, until=None, now=T0 + 3) == 0
    assert await store.outbox.delivery_recover("ep_1", since=T0, until=None, now=T0 + 3) == 1
    async with store.transaction() as conn:
        await store.outbox.delivery_kill_endpoint(conn, "ep_1", "endpoint_disabled", now=T0 + 4)
    assert (
        await store.outbox.delivery_redeliver(msg_id, tenant="t2", endpoint_id=None, now=T0 + 5)
        == 0
    )
    assert (
        await store.outbox.delivery_redeliver(msg_id, tenant="t1", endpoint_id=None, now=T0 + 5)
        == 1
    )
    assert not await store.outbox.endpoint_delete(
        "ep_1", "t2", reason="endpoint_deleted", now=T0 + 6
    )
    assert await store.outbox.endpoint_delete("ep_1", "t1", reason="endpoint_deleted", now=T0 + 6)
    assert await store.outbox.endpoint_get("ep_1", None) is None
    (row,) = await store.outbox.delivery_list(
        None, message_id=msg_id, endpoint_id=None, undelivered=True, limit=10
    )
    assert row.dead_reason == "endpoint_deleted"
    lanes = await store.fetch_all("SELECT lane FROM relaybox_lanes")
    assert lanes == []


async def test_sweep_of_disabled_endpoints_takes_rows_no_live_lease_holds(store: Store) -> None:
    """Disabling leaves a leased row to its dispatcher, and the lease takes only rows of
    enabled endpoints: once that lease has run out, the sweep makes the row dead;
    a row published after the disabling (a publish that began before it), too."""
    await store.outbox.endpoint_create(endpoint("ep_1"), "s", quota=5, now=T0)
    await store.outbox.endpoint_create(endpoint("ep_2"), "s", quota=5, now=T0)
    await publish(store, "t1", ["ep_1", "ep_2"])
    leased = await store.dispatch.outbox_lease(
        lease_request(at=T0 + 1), no_secrets
    )  # until T0 + 61
    assert len(leased.deliveries) == 2
    async with store.transaction() as conn:
        await store.outbox.endpoint_set_status(
            conn, "ep_1", "disabled", reason="manual", now=T0 + 2
        )
        await store.outbox.delivery_kill_endpoint(conn, "ep_1", "endpoint_disabled", now=T0 + 2)
    late = await publish(store, "t1", ["ep_1"], at=T0 + 3)  # committed after the disabling
    # The leased row is its dispatcher's while the lease lives; the late one goes now.
    assert await store.outbox.delivery_sweep_disabled(now=T0 + 4, limit=10) == 1
    (row,) = await store.outbox.delivery_list(
        None, message_id=late, endpoint_id=None, undelivered=True, limit=10
    )
    assert (row.status, row.dead_reason) == ("dead", "endpoint_disabled")
    # The dispatcher died: its lease runs out, the row goes; ep_2's stays (enabled).
    assert await store.outbox.delivery_sweep_disabled(now=T0 + 62, limit=10) == 1
    assert await store.outbox.delivery_sweep_disabled(now=T0 + 63, limit=10) == 0
    backlog = await store.outbox.endpoint_backlog()
    assert (backlog["ep_1"].dead, backlog["ep_1"].pending) == (2, 0)
    assert backlog["ep_2"].pending == 1


async def test_lane_upsert_keeps_one_row_per_lane(store: Store) -> None:
    async with store.transaction() as conn:
        await store.outbox.lane_upsert(conn, "email", 3, None)
        await store.outbox.lane_upsert(conn, "email", 5, 2.0)
    rows = await store.fetch_all("SELECT lane, max_in_flight, rate_limit FROM relaybox_lanes")
    assert [(r["lane"], r["max_in_flight"], r["rate_limit"]) for r in rows] == [("email", 5, 2.0)]


async def test_event_types(store: Store) -> None:
    await store.catalog.event_type_upsert("pet.adopted", "a pet", '{"type":"object"}', now=T0)
    await store.catalog.event_type_upsert("pet.born", "", None, now=T0)
    await store.catalog.event_type_upsert("pet.adopted", "adopted", '{"type":"array"}', now=T0 + 1)
    listed = await store.catalog.event_type_list()
    assert [(e.name, e.description, e.schema) for e in listed] == [
        ("pet.adopted", "adopted", '{"type":"array"}'),
        ("pet.born", "", None),
    ]
    async with store.transaction() as conn:
        assert (
            await store.outbox.publish_context(conn, "t1", "pet.adopted")
        ).schema == '{"type":"array"}'
        assert (await store.outbox.publish_context(conn, "t1", "pet.born")).schema is None
        assert (await store.outbox.publish_context(conn, "t1", "nope")).schema is None
    # A subject path, with or without a schema: publish reads it with the schema.
    await store.catalog.event_type_upsert("pet.born", "", None, now=T0 + 2, subject="data.owner.id")
    await store.catalog.event_type_upsert(
        "pet.adopted", "adopted", '{"type":"object"}', now=T0 + 2, subject="data.pet"
    )
    listed = await store.catalog.event_type_list()
    assert [(e.name, e.schema, e.subject) for e in listed] == [
        ("pet.adopted", '{"type":"object"}', "data.pet"),
        ("pet.born", None, "data.owner.id"),
    ]
    async with store.transaction() as conn:
        born = await store.outbox.publish_context(conn, "t1", "pet.born")
        assert (born.schema, born.subject, born.subscribers) == (None, "data.owner.id", [])
        adopted = await store.outbox.publish_context(conn, "t1", "pet.adopted")
        assert (adopted.schema, adopted.subject) == ('{"type":"object"}', "data.pet")
        assert (await store.outbox.publish_context(conn, "t1", "nope")).subject is None
    await store.catalog.event_type_upsert("pet.born", "", None, now=T0 + 3)  # the path dropped
    async with store.transaction() as conn:
        assert (await store.outbox.publish_context(conn, "t1", "pet.born")).subject is None


async def test_api_keys(store: Store) -> None:
    await store.catalog.api_key_create("key_1", "t1", "ci", "hash-1", now=T0)
    await store.catalog.api_key_create("key_2", "t2", "", "hash-2", now=T0 + 1)
    assert await store.catalog.api_key_find("hash-1") == "t1"
    assert await store.catalog.api_key_find("hash-x") is None
    assert await store.catalog.api_key_match("hash-1") == ("key_1", "t1")
    assert await store.catalog.api_key_match("hash-x") is None
    assert [k.id for k in await store.catalog.api_key_list(None)] == ["key_1", "key_2"]
    (only,) = await store.catalog.api_key_list("t1")
    assert (only.tenant, only.name, only.created_at, only.revoked_at) == ("t1", "ci", T0, None)
    assert await store.catalog.api_key_revoke("key_1", now=T0 + 2)
    assert not await store.catalog.api_key_revoke("key_1", now=T0 + 3)
    assert await store.catalog.api_key_find("hash-1") is None
    assert await store.catalog.api_key_match("hash-1") is None
    assert (await store.catalog.api_key_list("t1"))[0].revoked_at == T0 + 2


async def test_admin_sessions(store: Store) -> None:
    assert not await store.sessions.admin_session_revoked("s1")
    await store.sessions.admin_session_revoke("s1", expires_at=T0 + 100, purge_before=T0)
    await store.sessions.admin_session_revoke(
        "s1", expires_at=T0 + 100, purge_before=T0
    )  # idempotent
    assert await store.sessions.admin_session_revoked("s1")
    await store.sessions.admin_session_revoke("s2", expires_at=T0 + 500, purge_before=T0 + 200)
    assert not await store.sessions.admin_session_revoked("s1")  # expired anyway: purged
    assert await store.sessions.admin_session_revoked("s2")


async def test_portal_tokens(store: Store) -> None:
    """Revoked portal tokens: a revocation says whether it was the first; a link opens
    once when single-use, never when its key is revoked; a session is live until it is
    revoked or its key is; rows of expired tokens go, a few per revocation (bounded
    work per call) and all at maintenance."""
    await store.catalog.api_key_create("key_1", "t1", "", "hash-1", now=T0)
    assert await store.sessions.portal_session_live("s1", None)
    assert await store.sessions.portal_session_live("s1", "key_1")
    assert not await store.sessions.portal_session_live("s1", "key_gone")  # no such key: refused
    assert await store.sessions.portal_token_revoke("s1", expires_at=T0 + 100, purge_before=T0)
    assert not await store.sessions.portal_token_revoke("s1", expires_at=T0 + 100, purge_before=T0)
    assert not await store.sessions.portal_session_live("s1", None)
    assert await store.sessions.portal_session_live("s2", "key_1")

    async def opening(token: str, *, single_use: bool, key: str | None = "key_1") -> str:
        return await store.sessions.portal_link_open(
            token, key_id=key, single_use=single_use, expires_at=T0 + 100, purge_before=T0
        )

    assert await opening("l1", single_use=False) == "ok"
    assert await opening("l1", single_use=False) == "ok"
    assert await opening("u1", single_use=True) == "ok"
    assert await opening("u1", single_use=True) == "used"
    assert await opening("u2", single_use=True, key=None) == "ok"
    assert await store.catalog.api_key_revoke("key_1", now=T0 + 1)
    assert not await store.sessions.portal_session_live("s2", "key_1")
    assert await opening("l1", single_use=False) == "revoked"
    assert await opening("u3", single_use=True) == "revoked"
    assert await opening("u3", single_use=True, key=None) == "ok"  # not spent by a refusal

    for n in range(40):  # tokens that expired long ago
        await store.sessions.portal_token_revoke(
            f"old{n}", expires_at=T0 - 1000 + n, purge_before=0
        )
    await store.sessions.portal_token_revoke("s9", expires_at=T0 + 100, purge_before=T0)
    [left] = await store.fetch_all(
        "SELECT COUNT(*) AS n FROM relaybox_portal_revoked_tokens WHERE token_id LIKE 'old%'"
    )
    assert left["n"] == 40 - 16  # the oldest 16 went with this revocation
    assert await store.sessions.portal_tokens_purge(T0) == 24
    assert await store.sessions.portal_tokens_purge(T0) == 0
    assert not await store.sessions.portal_session_live("s9", None)  # live rows stay
