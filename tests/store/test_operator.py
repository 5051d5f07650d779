"""Conformance of the store's operator methods (``store/operator.py``) on SQLite and
PostgreSQL: inbox, dead-letter and quarantine listings and actions, an event's
history, throughput, table checks, doctor's probe and the test views."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from relaybox.store import NewDelivery, Store, open_store
from relaybox.store.operator import ThroughputRow

T0 = 1_000_020.0  # a whole minute plus 20 s (epoch minute 16667)


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    s = open_store(database_url)
    await s.migrate()
    yield s
    await s.close()


def delivery(
    event_id: str, *, body: str = "{}", source: str = "s", at: float = T0, kind: str = "a.b"
) -> NewDelivery:
    raw = body.encode()
    return NewDelivery(
        source=source,
        account="a",
        event_id=event_id,
        event_type=kind,
        tenant="t",
        fingerprint=hashlib.sha256(raw).digest(),
        payload=raw,
        headers=json.dumps({"x": "1"}),
        version=None,
        received_at=at,
    )


async def accept(store: Store, *deliveries: NewDelivery) -> list[int]:
    return [(await store.inbox.accept([d]))[0].inbox_id for d in deliveries]


async def kill(store: Store, inbox_id: int, *, at: float) -> None:
    async with store.transaction() as conn:
        await store.inbox.kill(conn, inbox_id, reason="exhausted", error="boom", now=at)


def listing(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = dict(
        source=None, event_type=None, tenant=None, since=None, until=None, before_id=None
    )
    return {**base, **changes}


async def test_inbox_list_filters_and_pages_newest_first(store: Store) -> None:
    a, b, c = await accept(
        store,
        delivery("a", at=T0),
        delivery("b", source="other", at=T0 + 10),
        delivery("c", kind="x.y", at=T0 + 20),
    )
    rows = await store.operator.inbox_list(**listing(status=None), limit=10)
    assert [r["id"] for r in rows] == [c, b, a]
    assert rows[0]["purged"] in (False, 0) and rows[0]["status"] == "pending"
    page = await store.operator.inbox_list(**listing(status=None), limit=2)
    assert [r["id"] for r in page] == [c, b]
    rest = await store.operator.inbox_list(**listing(status=None, before_id=b), limit=2)
    assert [r["id"] for r in rest] == [a]
    assert [
        r["id"]
        for r in await store.operator.inbox_list(**listing(status=None, source="other"), limit=9)
    ] == [b]
    assert [
        r["id"]
        for r in await store.operator.inbox_list(**listing(status=None, event_type="x.y"), limit=9)
    ] == [c]
    timed = await store.operator.inbox_list(
        **listing(status=None, since=T0 + 5, until=T0 + 20), limit=9
    )
    assert [r["id"] for r in timed] == [b]
    assert await store.operator.inbox_list(**listing(status="done"), limit=9) == []


async def test_history_dead_list_discard_and_purged_at(store: Store) -> None:
    live, dead = await accept(store, delivery("live"), delivery("dead", at=T0 + 1))
    await kill(store, dead, at=T0 + 2)
    history = await store.operator.inbox_history(dead)
    assert history is not None
    assert history.event["id"] == dead and history.event["status"] == "dead"
    assert history.business_keys == [] and history.replays == [] and history.quarantine == []
    assert await store.operator.inbox_history(dead + 1000) is None

    dead_rows = await store.operator.dead_list(**listing(reason="exhausted"), limit=9)
    assert [r["id"] for r in dead_rows] == [dead]
    assert await store.operator.dead_list(**listing(reason="invalid"), limit=9) == []

    assert not await store.operator.dead_discard(live, now=T0 + 3, actor="me", reason="no")
    assert await store.operator.dead_discard(dead, now=T0 + 3, actor="me", reason="dup")
    assert not await store.operator.dead_discard(dead, now=T0 + 4, actor="you", reason="again")
    assert await store.operator.dead_list(**listing(reason=None), limit=9) == []
    after = await store.operator.inbox_history(dead)
    assert after is not None and after.event["discarded_by"] == "me"
    assert await store.operator.inbox_purged_at([live, dead + 1000]) == {
        live: None,
        dead + 1000: None,
    }


async def test_quarantine_list_get_and_resolve_once(store: Store) -> None:
    [original] = await accept(store, delivery("k", body='{"a": 1}'))
    outcome = (await store.inbox.accept([delivery("k", body='{"a": 2}', at=T0 + 5)]))[0]
    assert outcome.status == "quarantined"
    [entry] = await store.operator.quarantine_list(
        source=None, resolved=None, before_id=None, limit=9
    )
    assert entry["inbox_id"] == original and entry["original_status"] == "pending"
    assert (
        await store.operator.quarantine_list(source=None, resolved=True, before_id=None, limit=9)
        == []
    )
    open_ = await store.operator.quarantine_list(
        source="s", resolved=False, before_id=None, limit=9
    )
    assert [r["id"] for r in open_] == [entry["id"]]

    got = await store.operator.quarantine_get(entry["id"])
    assert got is not None
    assert bytes(got["payload"]) == b'{"a": 2}' and bytes(got["original_payload"]) == b'{"a": 1}'
    assert await store.operator.quarantine_get(entry["id"] + 1000) is None

    resolve = dict(now=T0 + 9, resolution="ignored", actor="me", reason="noise")
    assert await store.operator.quarantine_resolve(entry["id"], **resolve)
    assert not await store.operator.quarantine_resolve(entry["id"], **resolve)
    [done] = await store.operator.quarantine_list(
        source=None, resolved=True, before_id=None, limit=9
    )
    assert done["resolution"] == "ignored" and done["resolved_by"] == "me"
    assert (
        await store.operator.quarantine_list(source=None, resolved=False, before_id=None, limit=9)
        == []
    )


async def test_throughput_table_exists_probe_and_test_views(store: Store) -> None:
    a, b, _ = await accept(
        store, delivery("a"), delivery("b", at=T0 + 1), delivery("c", at=T0 + 60)
    )
    await kill(store, b, at=T0 + 2)
    rows = await store.operator.inbox_throughput(T0 - 20)
    minute = int(T0 // 60)
    assert sorted(rows, key=lambda r: (r.minute, r.status)) == [
        ThroughputRow(minute, "dead", 1),
        ThroughputRow(minute, "pending", 1),
        ThroughputRow(minute + 1, "pending", 1),
    ]
    assert await store.operator.inbox_throughput(T0 + 120) == []

    assert await store.operator.table_exists("relaybox_inbox")
    assert not await store.operator.table_exists("relaybox_nothing")

    before = time.time()
    probe = await store.operator.doctor_probe()
    assert probe.applied and max(probe.applied) == (await store.schema_version())[1]
    assert before <= probe.before <= probe.after
    assert abs(probe.db_now - probe.before) < 60

    health = await store.operator.database_health()
    if store.backend == "postgres":
        assert health.pages is None and health.oldest(relaybox=True) is None
        tables = {t["table"]: t for t in health.tables}
        assert "relaybox_inbox" in tables and tables["relaybox_inbox"]["dead"] >= 0
    else:
        assert health.transactions == health.tables == []
        assert health.pages and 0 <= (health.free_pages or 0) < health.pages

    inbox = await store.operator.testing_inbox("s", "a")
    assert [r["id"] for r in inbox] == [a] and bytes(inbox[0]["payload"]) == b"{}"
    assert len(await store.operator.testing_inbox(None, None)) == 3
    assert await store.operator.testing_operations(None) == []
    assert await store.operator.testing_outbox(None) == []
