"""Conformance of the store's history methods (``store/history.py``) on SQLite and
PostgreSQL: replay, recovery, reconciliation, projections, retention, the maintenance
lock and the queue reads behind the metrics. Rows are set up through store methods;
``store.fetch_all`` reads (and, where no store method exists, moves) them."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from relaybox.store import NewDelivery, Store, open_store
from relaybox.store.history import (
    ProjectionWrite,
    QueueGroup,
    ReconcileTicket,
    RecoveryRecord,
    ReplayCandidate,
    ReplayFilter,
)

T0 = 1_000_000.0


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    s = open_store(database_url)
    await s.migrate()
    yield s
    await s.close()


def delivery(event_id: str, *, body: str = "{}", source: str = "s", at: float = T0) -> NewDelivery:
    raw = body.encode()
    return NewDelivery(
        source=source,
        account="a",
        event_id=event_id,
        event_type="thing.happened",
        tenant="t",
        fingerprint=hashlib.sha256(raw).digest(),
        payload=raw,
        headers=json.dumps({"x": "1"}),
        version=None,
        received_at=at,
    )


async def accept(store: Store, *deliveries: NewDelivery) -> list[int]:
    """One batch each: ids in the order given, each received at its own time."""
    return [(await store.inbox.accept([d]))[0].inbox_id for d in deliveries]


async def finish(store: Store, done: list[int], dead: list[int], *, at: float) -> None:
    async with store.transaction() as conn:
        await store.inbox.complete(conn, done, at)
        for inbox_id in dead:
            await store.inbox.kill(conn, inbox_id, reason="exhausted", error="boom", now=at)


async def one(store: Store, sql: str) -> dict[str, object]:
    [row] = await store.fetch_all(sql)
    return row


# -- replay ---------------------------------------------------------------------------------


def every(**changes: Any) -> ReplayFilter:
    everything = ReplayFilter(
        ids=None, source=None, since=None, until=None, statuses=None, limit=100
    )
    return dataclasses.replace(everything, **changes)


async def test_replay_select_filters_and_reports_purged_rows(store: Store) -> None:
    a, b, c, d = await accept(
        store,
        delivery("a", at=T0),
        delivery("b", at=T0 + 10),
        delivery("c", source="other", at=T0 + 20),
        delivery("d", at=T0 + 30),
    )
    await finish(store, [a], [], at=T0 + 40)
    await finish(store, [b, c], [], at=T0 + 45)  # d stays pending: never selected
    assert (
        await store.history.retention_purge_batch("inbox", cutoff=T0 + 42, now=T0 + 60, limit=9)
        == 1
    )

    async with store.transaction() as conn:
        found = await store.history.replay_select(conn, every())
        by_ids = await store.history.replay_select(conn, every(ids=[b, c, d]))
        by_source = await store.history.replay_select(conn, every(source="other"))
        by_time = await store.history.replay_select(conn, every(since=T0 + 5, until=T0 + 20))
        by_status = await store.history.replay_select(conn, every(statuses=["dead", "ignored"]))
        limited = await store.history.replay_select(conn, every(limit=2))
    assert found == [
        ReplayCandidate(a, "done", None, True),  # purged: cannot run again
        ReplayCandidate(b, "done", None, False),
        ReplayCandidate(c, "done", None, False),
    ]
    assert [x.inbox_id for x in by_ids] == [b, c]
    assert [x.inbox_id for x in by_source] == [c]
    assert [x.inbox_id for x in by_time] == [b]
    assert by_status == []
    assert [x.inbox_id for x in limited] == [a, b]


async def test_replay_mark_and_record(store: Store) -> None:
    done, dead = await accept(store, delivery("done"), delivery("dead"))
    await finish(store, [done], [dead], at=T0 + 1)
    async with store.transaction() as conn:
        await store.history.inbox_mark_superseded(conn, done, "r@2")
        [c_done, c_dead] = await store.history.replay_select(conn, every())
        assert c_dead == ReplayCandidate(dead, "dead", "exhausted", False)
        # Only a row still in the status it was selected in is marked.
        assert not await store.history.replay_mark(conn, done, status="dead", now=T0 + 2)
        assert await store.history.replay_mark(conn, done, status="done", now=T0 + 2)
        assert not await store.history.replay_mark(conn, done, status="done", now=T0 + 2)
        assert await store.history.replay_mark(conn, dead, status="dead", now=T0 + 2)
        await store.history.replay_record(conn, c_done, actor="ops", reason="why", now=T0 + 2)
        await store.history.replay_record(conn, c_dead, actor="ops", reason="again", now=T0 + 3)
    rows = await store.fetch_all(
        "SELECT id, status, dead_reason, attempts, superseded_by, next_attempt_at"
        " FROM relaybox_inbox ORDER BY id"
    )
    assert [(r["status"], r["dead_reason"], r["superseded_by"]) for r in rows] == [
        ("pending", None, None),  # judged again: superseded_by cleared
        ("pending", None, None),
    ]
    assert [r["next_attempt_at"] for r in rows] == [T0 + 2, T0 + 2]
    replays = await store.fetch_all(
        "SELECT inbox_id, actor, reason, previous_status, previous_reason, replayed_at"
        " FROM relaybox_replays ORDER BY inbox_id"
    )
    assert [tuple(r.values()) for r in replays] == [
        (done, "ops", "why", "done", None, T0 + 2),
        (dead, "ops", "again", "dead", "exhausted", T0 + 3),
    ]


async def test_replay_mark_refuses_a_purged_row(store: Store) -> None:
    [inbox_id] = await accept(store, delivery("e"))
    await finish(store, [inbox_id], [], at=T0)
    assert (
        await store.history.retention_purge_batch("inbox", cutoff=T0 + 1, now=T0 + 2, limit=10) == 1
    )
    async with store.transaction() as conn:
        assert not await store.history.replay_mark(conn, inbox_id, status="done", now=T0 + 3)


# -- recovery -------------------------------------------------------------------------------


async def test_inbox_find_events_across_chunks(store: Store) -> None:
    await accept(store, delivery("e-3"), delivery("e-777"), delivery("e-3", source="other"))
    asked = [f"e-{i}" for i in range(1200)]  # more than one statement's worth
    assert await store.history.inbox_find_events("s", asked) == {"e-3", "e-777"}
    assert await store.history.inbox_find_events("other", asked) == {"e-3"}
    assert await store.history.inbox_find_events("s", []) == set()


async def test_recovery_mark_and_record(store: Store) -> None:
    [inbox_id] = await accept(store, delivery("e"))
    record = RecoveryRecord("s", "e", "d-1", "ingested", inbox_id, T0)
    async with store.transaction() as conn:
        await store.history.inbox_mark_recovered(conn, inbox_id, "github-api:delivery/d-1")
        await store.history.recovery_record(record, conn=conn)
    await store.history.recovery_record(
        RecoveryRecord("s", "f", "d-2", "redelivery_requested", None, T0)
    )
    row = await one(store, f"SELECT recovered_via FROM relaybox_inbox WHERE id = {inbox_id}")
    assert row["recovered_via"] == "github-api:delivery/d-1"
    rows = await store.fetch_all(
        "SELECT source, event_id, delivery_id, action, inbox_id, recovered_at"
        " FROM relaybox_recoveries ORDER BY event_id"
    )
    assert [tuple(r.values()) for r in rows] == [
        ("s", "e", "d-1", "ingested", inbox_id, T0),
        ("s", "f", "d-2", "redelivery_requested", None, T0),
    ]


async def test_recovery_record_rolls_back_with_the_callers_transaction(store: Store) -> None:
    with pytest.raises(RuntimeError):
        async with store.transaction() as conn:
            await store.history.recovery_record(
                RecoveryRecord("s", "e", "d", "ingested", None, T0), conn=conn
            )
            raise RuntimeError("handler failed")
    assert await store.fetch_all("SELECT * FROM relaybox_recoveries") == []


# -- reconciliation -------------------------------------------------------------------------


async def test_reconcile_tickets_requests_and_done(store: Store) -> None:
    assert await store.history.reconcile_ticket_take("s", "r1") == ReconcileTicket(1, 0)
    async with store.transaction() as conn:
        await store.history.reconcile_request(conn, "s", "r1")
        await store.history.reconcile_request(conn, "s", "r2")  # a resource never reconciled
    assert await store.history.reconcile_ticket_take("s", "r1") == ReconcileTicket(2, 1)
    assert await store.history.reconcile_ids("s", requested=True) == ["r1", "r2"]
    assert await store.history.reconcile_ids("s") == ["r1", "r2"]
    assert await store.history.reconcile_ids("s", limit=1) == ["r1"]
    assert await store.history.reconcile_ids("other") == []
    async with store.transaction() as conn:
        await store.history.reconcile_lock(conn, "s", "r1")
        await store.history.reconcile_done(conn, "s", "r1", requested_seen=1, now=T0, diverged=True)
    assert await store.history.reconcile_ids("s", requested=True) == ["r2"]
    async with store.transaction() as conn:
        await store.history.reconcile_done(
            conn, "s", "r1", requested_seen=0, now=T0 + 5, diverged=False
        )
    row = await one(
        store,
        "SELECT issued, requested, handled, divergences, last_checked_at, last_diverged_at"
        " FROM relaybox_reconcile WHERE resource_id = 'r1'",
    )
    # handled never goes back; the divergence time stays that of the last divergence.
    assert tuple(row.values()) == (2, 1, 1, 1, T0 + 5, T0)


async def test_reconcile_request_rolls_back_with_the_handler(store: Store) -> None:
    with pytest.raises(RuntimeError):
        async with store.transaction() as conn:
            await store.history.reconcile_request(conn, "s", "r1")
            raise RuntimeError("handler failed")
    assert await store.history.reconcile_ids("s") == []


# -- projections ----------------------------------------------------------------------------


def offer(version: int, state: str, *, origin: str = "event", at: float = T0) -> ProjectionWrite:
    return ProjectionWrite("sub:1", origin, str(version), f"{version:04d}", state, "s", None, at)


async def test_projection_compare_and_set(store: Store) -> None:
    async with store.transaction() as conn:
        assert await store.history.projection_get(conn, "sub:1") is None
        assert await store.history.projection_upsert(conn, offer(2, '{"v":2}'))
        assert not await store.history.projection_upsert(conn, offer(1, '{"v":1}'))  # older
        assert not await store.history.projection_upsert(conn, offer(2, '{"v":2}'))  # the same
        # One origin per resource: a reconcile ticket never overwrites an event version.
        assert not await store.history.projection_upsert(conn, offer(9, "null", origin="reconcile"))
        assert await store.history.projection_upsert(conn, offer(3, '{"v":3}', at=T0 + 1))
        got = await store.history.projection_get(conn, "sub:1")
    assert got is not None
    assert (got.resource_key, got.origin, got.version, got.version_key) == (
        "sub:1",
        "event",
        "3",
        "0003",
    )
    assert (got.state, got.source, got.inbox_id, got.updated_at) == ({"v": 3}, "s", None, T0 + 1)


async def test_projection_upsert_rolls_back_with_the_handler(store: Store) -> None:
    with pytest.raises(RuntimeError):
        async with store.transaction() as conn:
            assert await store.history.projection_upsert(conn, offer(1, "{}"))
            raise RuntimeError("handler failed")
    async with store.transaction() as conn:
        assert await store.history.projection_get(conn, "sub:1") is None


async def test_inbox_mark_superseded_appends(store: Store) -> None:
    [inbox_id] = await accept(store, delivery("e"))
    async with store.transaction() as conn:
        await store.history.inbox_mark_superseded(conn, inbox_id, "a@2")
        await store.history.inbox_mark_superseded(conn, inbox_id, "b@5")
    row = await one(store, f"SELECT superseded_by FROM relaybox_inbox WHERE id = {inbox_id}")
    assert row["superseded_by"] == "a@2, b@5"


# -- retention ------------------------------------------------------------------------------


async def sending_rows(store: Store) -> None:
    """Outbox rows sent, dead, held and pending (updated at T0), one message with no
    delivery left unpurged and one whose delivery is still pending."""
    async with store.transaction() as conn:
        for key in ("sent", "dead", "held", "pending"):
            await store.inbox.outbox_insert(
                conn, channel="c", key=key, payload='{"k":1}', tenant="t", inbox_id=None, now=T0
            )
    for key in ("sent", "dead", "held"):
        await store.fetch_all(
            f"UPDATE relaybox_outbox SET status = '{key}' WHERE key = '{key}' RETURNING id"
        )
    await store.fetch_all(
        "INSERT INTO relaybox_messages (id, tenant, event_type, body, created_at) VALUES"
        f" ('m1', 't', 'x', '{{}}', {T0}), ('m2', 't', 'x', '{{}}', {T0}) RETURNING id"
    )
    await store.fetch_all(
        "UPDATE relaybox_outbox SET message_id = 'm2' WHERE key = 'pending' RETURNING id"
    )


async def test_retention_counts_and_purges_each_table(store: Store) -> None:
    old, kept, pending = await accept(store, delivery("old"), delivery("kept"), delivery("p"))
    await finish(store, [old], [], at=T0)
    await finish(store, [kept], [], at=T0 + 100)
    [q_inbox] = await accept(store, delivery("old", body='{"other":1}'))  # quarantined
    assert q_inbox == old
    await store.fetch_all(f"UPDATE relaybox_quarantine SET resolved_at = {T0} RETURNING id")
    await sending_rows(store)
    cutoff = T0 + 50

    counts = {t: await store.history.retention_count(t, cutoff) for t in _TABLES}
    assert counts == {"inbox": 1, "quarantine": 1, "outbox": 2, "messages": 1}
    assert await store.history.retention_count("outbox", T0) == 0  # strictly before the cutoff

    # Batches of one until nothing is left. (PostgreSQL's locking subquery may let one
    # batch take more than its limit: only the totals are the same on both backends.)
    purged = dict.fromkeys(_TABLES, 0)
    for t in _TABLES:
        for _ in range(5):
            n = await store.history.retention_purge_batch(t, cutoff=cutoff, now=T0 + 200, limit=1)
            if not n:
                break
            purged[t] += n
    assert purged == {"inbox": 1, "quarantine": 1, "outbox": 2, "messages": 1}
    assert {t: await store.history.retention_count(t, cutoff) for t in _TABLES} == dict.fromkeys(
        _TABLES, 0
    )
    inbox = await store.fetch_all("SELECT id, payload, purged_at FROM relaybox_inbox ORDER BY id")
    assert [(r["id"], r["payload"] is None, r["purged_at"]) for r in inbox] == [
        (old, True, T0 + 200),
        (kept, False, None),
        (pending, False, None),
    ]
    outbox = await store.fetch_all("SELECT key, payload, purged_at FROM relaybox_outbox")
    assert {r["key"]: (r["payload"], r["purged_at"]) for r in outbox} == {
        "sent": ("null", T0 + 200),
        "dead": ("null", T0 + 200),
        "held": ('{"k":1}', None),
        "pending": ('{"k":1}', None),
    }
    messages = await store.fetch_all("SELECT id, body FROM relaybox_messages ORDER BY id")
    assert [(r["id"], r["body"]) for r in messages] == [("m1", "null"), ("m2", "{}")]


async def test_retention_purge_drops_the_purged_deliveries_responses(store: Store) -> None:
    await sending_rows(store)
    ids = {r["key"]: r["id"] for r in await store.fetch_all("SELECT id, key FROM relaybox_outbox")}
    for key in ("sent", "held"):
        await store.fetch_all(
            "INSERT INTO relaybox_outbox_attempts (outbox_id, attempt, started_at, duration,"
            f" outcome, status_code, response) VALUES ({ids[key]}, 1, {T0}, 0.1, 'sent', 200,"
            " 'ok') RETURNING outbox_id"
        )
    assert (
        await store.history.retention_purge_batch("outbox", cutoff=T0 + 1, now=T0 + 2, limit=10)
        == 2
    )
    rows = await store.fetch_all("SELECT outbox_id, response FROM relaybox_outbox_attempts")
    assert {r["outbox_id"]: r["response"] for r in rows} == {ids["sent"]: None, ids["held"]: "ok"}


_TABLES = ("inbox", "quarantine", "outbox", "messages")


async def test_maintenance_try_lock(database_url: str) -> None:
    first, second = open_store(database_url), open_store(database_url)
    try:
        async with first.db.maintenance_try_lock() as mine:
            assert mine
            async with second.db.maintenance_try_lock() as theirs:
                # PostgreSQL: one runner across processes. SQLite: one process per file.
                assert theirs is (first.backend == "sqlite")
        async with second.db.maintenance_try_lock() as theirs:
            assert theirs  # released when the block ended
    finally:
        await first.close()
        await second.close()


# -- metrics --------------------------------------------------------------------------------


async def test_ops_stats_queues(store: Store) -> None:
    empty = await store.history.ops_stats_queues()
    assert (empty.groups, empty.quarantined_by_source) == ((), {})
    a, b, c, _ = await accept(
        store,
        delivery("a", at=T0),
        delivery("b", at=T0 + 1),
        delivery("c", at=T0 + 2),
        delivery("d", source="other", at=T0 + 3),
    )
    await finish(store, [a], [b], at=T0 + 5)
    async with store.transaction() as conn:
        await store.inbox.retry_later(conn, c, at=T0 + 60, error="later", now=T0 + 5)
    await store.fetch_all(f"UPDATE relaybox_inbox SET attempts = 2 WHERE id = {c} RETURNING id")
    await accept(store, delivery("a", body='{"other":1}'))  # quarantined
    await sending_rows(store)

    snap = await store.history.ops_stats_queues()
    inbox = [g for g in snap.groups if g.queue == "inbox"]
    assert sorted(inbox, key=lambda g: (g.source, g.status)) == [
        QueueGroup("inbox", "other", "pending", "", False, 1, T0 + 3, 0, 0),
        QueueGroup("inbox", "s", "dead", "exhausted", False, 1, None, 0, 0),
        QueueGroup("inbox", "s", "done", "", False, 1, None, 0, 0),
        QueueGroup("inbox", "s", "pending", "", False, 1, T0 + 2, 1, 2),
    ]
    outbox = {g.status: g for g in snap.groups if g.queue == "outbox"}
    assert {s: (g.source, g.count) for s, g in outbox.items()} == {
        s: ("c", 1) for s in ("sent", "dead", "held", "pending")
    }
    assert outbox["pending"].oldest == T0
    assert snap.quarantined_by_source == {"s": 1}


# -- the callers hold no SQL ----------------------------------------------------------------

_SRC = Path(__file__).resolve().parents[2] / "src" / "relaybox"
_CALLERS = (
    "inbound/replay",
    "inbound/recovery",
    "inbound/reconcile",
    "inbound/projections",
    "retention/purge",
    "retention/policy",
    "metrics",
)


def test_history_callers_hold_no_sql_and_the_store_names_every_query() -> None:
    from relaybox.store.backend import load_queries
    from tests.store.test_store import _used_queries

    forbidden = re.compile(
        r"exec_driver_sql|\bq\[|raw_pool|generic_pool|start_pool|fetchval|\.backend\b"
        r"|relaybox\.store\.(postgres|sqlite)|outbound\.db"
    )
    for name in _CALLERS:
        text = (_SRC / f"{name}.py").read_text()
        assert not forbidden.findall(text), name
        assert not _used_queries(text), name
    # (the statements the sync store runs too are written once, in statements.py)
    used = _used_queries((_SRC / "store" / "history.py").read_text())
    used |= _used_queries((_SRC / "store" / "statements.py").read_text())
    shared = set(load_queries("sqlite")) & set(load_queries("postgres"))
    assert _HISTORY_QUERIES <= used & shared
    pg_only = _used_queries((_SRC / "store" / "postgres.py").read_text())
    assert {"ops_maintenance_try_lock", "ops_maintenance_unlock"} <= pg_only
    assert not {"ops_maintenance_try_lock", "ops_maintenance_unlock"} & set(load_queries("sqlite"))


_HISTORY_QUERIES = {
    *("replay_select", "replay_mark", "replay_record", "inbox_clear_superseded"),
    *("inbox_find_events", "inbox_mark_recovered", "recovery_record"),
    *("reconcile_ticket", "reconcile_lock", "reconcile_done", "reconcile_request"),
    *("reconcile_ids_all", "reconcile_ids_requested"),
    *("projection_upsert", "projection_get", "inbox_mark_superseded"),
    *("ops_purge_count", "ops_purge_quarantine_count", "ops_purge_outbox_count"),
    *("ops_purge_messages_count", "ops_purge_inbox", "ops_purge_quarantine"),
    *("ops_purge_outbox", "ops_purge_outbox_responses", "ops_purge_messages"),
    *("ops_stats_inbox", "ops_stats_outbox", "ops_stats_quarantine"),
}
