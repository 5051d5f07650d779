"""Conformance of the store's retention-policy area (``store/retention.py``) on SQLite
and PostgreSQL: a tenant's policy set, replaced, listed by page and removed, the cap
on how many tenants have one, and the purge's scoped passes on every table: a tenant
group's batch touches only those tenants' rows, a scan walks the candidates in (time,
id) order from a cursor (one source's, or all), a purge by ids re-checks the cutoff,
and the grouped counts say what a purge at a cutoff drops per (tenant, source)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator

import pytest

from relaybox.store import NewDelivery, Store, open_store
from relaybox.store.history import PurgeTable

T0 = 1_000_000.0


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    s = open_store(database_url)
    await s.migrate()
    yield s
    await s.close()


def delivery(event_id: str, *, tenant: str | None, source: str, body: str = "{}") -> NewDelivery:
    raw = body.encode()
    return NewDelivery(
        source=source,
        account="a",
        event_id=event_id,
        event_type="thing.happened",
        tenant=tenant,
        fingerprint=hashlib.sha256(raw).digest(),
        payload=raw,
        headers=json.dumps({"x": "1"}),
        version=None,
        received_at=T0,
    )


async def test_policies_set_replace_page_cap_and_remove(store: Store) -> None:
    assert await store.retention.policy_get("t1") is None
    set1 = await store.retention.policy_put(
        "t1", payload_max_age=3600.0, outbox_payload_max_age=None, now=T0, actor="a", max_policies=2
    )
    assert set1 is not None
    assert (set1.tenant, set1.payload_max_age, set1.outbox_payload_max_age) == ("t1", 3600.0, None)
    replaced = await store.retention.policy_put(
        "t1", payload_max_age=None, outbox_payload_max_age=60.0, now=T0 + 1, actor="b",
        max_policies=2,
    )  # fmt: skip
    assert replaced is not None
    assert (replaced.payload_max_age, replaced.outbox_payload_max_age) == (None, 60.0)
    assert (replaced.updated_at, replaced.updated_by) == (T0 + 1, "b")
    assert await store.retention.policy_get("t1") == replaced
    await store.retention.policy_put(
        "t0", payload_max_age=7.0, outbox_payload_max_age=8.0, now=T0, actor="a", max_policies=2
    )
    # The cap: a third tenant is refused, an existing one may still change.
    refused = await store.retention.policy_put(
        "t2", payload_max_age=1.0, outbox_payload_max_age=None, now=T0, actor="a", max_policies=2
    )
    assert refused is None
    assert await store.retention.policy_put(
        "t0", payload_max_age=9.0, outbox_payload_max_age=None, now=T0, actor="a", max_policies=2
    )
    with pytest.raises(ValueError):
        await store.retention.policy_put(
            "t3", payload_max_age=None, outbox_payload_max_age=None, now=T0, actor="a",
            max_policies=2,
        )  # fmt: skip
    assert [p.tenant for p in await store.retention.policy_page()] == ["t0", "t1"]
    assert [p.tenant for p in await store.retention.policy_page(after="t0", limit=5)] == ["t1"]
    assert [p.tenant for p in await store.retention.policy_page(limit=1)] == ["t0"]
    assert await store.retention.policy_delete("t0") is True
    assert await store.retention.policy_delete("t0") is False
    assert [p.tenant for p in await store.retention.policy_page()] == ["t1"]


async def inbox_rows(store: Store) -> dict[str, int]:
    """Finished events: (tenant, source) t1/s1 at T0, t2/s1 at T0 + 10, none/s2 at
    T0 + 20, t1/s2 at T0 + 30; a pending one of t1. Returns ids by event id."""
    rows = [
        ("a", "t1", "s1", T0),
        ("b", "t2", "s1", T0 + 10),
        ("c", None, "s2", T0 + 20),
        ("d", "t1", "s2", T0 + 30),
        ("p", "t1", "s1", None),
    ]
    ids = {}
    for event_id, tenant, source, _ in rows:
        [out] = await store.inbox.accept([delivery(event_id, tenant=tenant, source=source)])
        ids[event_id] = out.inbox_id
    for event_id, _, _, at in rows:
        if at is not None:
            async with store.transaction() as conn:
                await store.inbox.complete(conn, [ids[event_id]], at)
    return ids


async def purged_events(store: Store) -> set[str]:
    rows = await store.fetch_all("SELECT event_id FROM relaybox_inbox WHERE payload IS NULL")
    return {r["event_id"] for r in rows}


async def test_tenant_group_batches_touch_only_their_tenants(store: Store) -> None:
    await inbox_rows(store)
    assert (
        await store.retention.purge_tenants("inbox", ["t9"], cutoff=T0 + 100, now=T0, limit=5) == 0
    )
    n = await store.retention.purge_tenants(
        "inbox", ["t1", "t9"], cutoff=T0 + 100, now=T0 + 200, limit=5
    )
    assert n == 2 and await purged_events(store) == {"a", "d"}  # not the pending one
    assert (
        await store.retention.purge_tenants("inbox", ["t2"], cutoff=T0 + 10, now=T0, limit=5) == 0
    )
    assert (
        await store.retention.purge_tenants("inbox", ["t2"], cutoff=T0 + 11, now=T0, limit=5) == 1
    )
    [row] = await store.fetch_all("SELECT purged_at FROM relaybox_inbox WHERE event_id = 'a'")
    assert row["purged_at"] == T0 + 200


async def test_scans_walk_from_a_cursor_and_purge_by_id_rechecks(store: Store) -> None:
    ids = await inbox_rows(store)
    first = await store.retention.scan("inbox", cutoff=T0 + 100, after=None, limit=2)
    assert [(c.id, c.at, c.tenant, c.source) for c in first] == [
        (ids["a"], T0, "t1", "s1"),
        (ids["b"], T0 + 10, "t2", "s1"),
    ]
    rest = await store.retention.scan(
        "inbox", cutoff=T0 + 100, after=(first[-1].at, first[-1].id), limit=5
    )
    assert [c.id for c in rest] == [ids["c"], ids["d"]]
    s2 = await store.retention.scan("inbox", cutoff=T0 + 25, after=None, limit=5, source="s2")
    assert [c.id for c in s2] == [ids["c"]]
    with pytest.raises(ValueError):
        await store.retention.scan("outbox", cutoff=T0, after=None, limit=5, source="s2")
    # By id: only the rows still candidates at the cutoff (d finished after it).
    assert await store.retention.purge_ids("inbox", [], cutoff=T0 + 25, now=T0) == 0
    n = await store.retention.purge_ids(
        "inbox", [ids["c"], ids["d"], ids["p"]], cutoff=T0 + 25, now=T0 + 300
    )
    assert n == 1 and await purged_events(store) == {"c"}
    groups = await store.retention.count_groups("inbox", T0 + 100)
    assert groups == {("t1", "s1"): 1, ("t2", "s1"): 1, ("t1", "s2"): 1}


async def sending_rows(store: Store) -> None:
    """Messages m1 (t1, T0), m2 (t2, T0 + 10); a sent delivery of each (finished at
    their times) with an attempt's response, and a pending one of m2 left over."""
    await store.fetch_all(
        "INSERT INTO relaybox_messages (id, tenant, event_type, body, created_at) VALUES"
        f" ('m1', 't1', 'x', '{{}}', {T0}), ('m2', 't2', 'x', '{{}}', {T0 + 10}) RETURNING id"
    )
    async with store.transaction() as conn:
        for key, tenant in (("k1", "t1"), ("k2", "t2"), ("k3", "t2")):
            await store.inbox.outbox_insert(
                conn, channel="c", key=key, payload='{"k":1}', tenant=tenant, inbox_id=None, now=T0
            )
    for key, message, status, at in (
        ("k1", "m1", "sent", T0),
        ("k2", "m2", "sent", T0 + 10),
        ("k3", "m2", "pending", T0),
    ):
        await store.fetch_all(
            f"UPDATE relaybox_outbox SET status = '{status}', message_id = '{message}',"
            f" updated_at = {at} WHERE key = '{key}' RETURNING id"
        )
    await store.fetch_all(
        "INSERT INTO relaybox_outbox_attempts (outbox_id, attempt, started_at, duration,"
        " outcome, response) SELECT id, 1, created_at, 0.1, 'ok', 'thanks'"
        " FROM relaybox_outbox WHERE key IN ('k1', 'k2') RETURNING id"
    )


async def test_sending_side_passes(store: Store) -> None:
    await sending_rows(store)
    assert await store.retention.count_groups("outbox", T0 + 100) == {
        ("t1", None): 1,
        ("t2", None): 1,
    }
    assert await store.retention.count_groups("messages", T0 + 100) == {("t1", None): 1}
    n = await store.retention.purge_tenants("outbox", ["t1"], cutoff=T0 + 100, now=T0, limit=5)
    assert n == 1
    found = await store.retention.scan("outbox", cutoff=T0 + 100, after=None, limit=5)
    assert [(c.tenant, c.at) for c in found] == [("t2", T0 + 10)]
    assert (
        await store.retention.purge_ids("outbox", [c.id for c in found], cutoff=T0 + 5, now=T0) == 0
    )
    assert (
        await store.retention.purge_ids("outbox", [c.id for c in found], cutoff=T0 + 50, now=T0)
        == 1
    )
    rows = await store.fetch_all(
        "SELECT o.key, o.purged_at, a.response FROM relaybox_outbox o"
        " LEFT JOIN relaybox_outbox_attempts a ON a.outbox_id = o.id ORDER BY o.key"
    )
    assert [(r["key"], r["purged_at"] is not None, r["response"]) for r in rows] == [
        ("k1", True, None),
        ("k2", True, None),
        ("k3", False, None),
    ]
    # m2 keeps its body while its pending delivery keeps its payload.
    assert (
        await store.retention.purge_tenants("messages", ["t2"], cutoff=T0 + 100, now=T0, limit=5)
        == 0
    )
    scanned = await store.retention.scan("messages", cutoff=T0 + 100, after=None, limit=5)
    assert [(c.id, c.tenant) for c in scanned] == [("m1", "t1")]
    more = await store.retention.scan("messages", cutoff=T0 + 100, after=(T0, "m1"), limit=5)
    assert more == []
    assert await store.retention.purge_ids("messages", ["m1", "m2"], cutoff=T0 + 100, now=T0) == 1
    assert (
        await store.retention.purge_tenants("messages", ["t1"], cutoff=T0 + 100, now=T0, limit=5)
        == 0
    )


async def test_quarantine_passes(store: Store) -> None:
    await store.inbox.accept([delivery("q", tenant="t1", source="s1")])
    await store.inbox.accept([delivery("q", tenant="t1", source="s1", body='{"other":1}')])
    await store.inbox.accept([delivery("r", tenant=None, source="s2")])
    await store.inbox.accept([delivery("r", tenant=None, source="s2", body='{"other":1}')])
    await store.fetch_all(f"UPDATE relaybox_quarantine SET resolved_at = {T0} RETURNING id")
    table: PurgeTable = "quarantine"
    assert await store.retention.count_groups(table, T0 + 1) == {("t1", "s1"): 1, (None, "s2"): 1}
    assert await store.retention.count_groups(table, T0) == {}
    s2 = await store.retention.scan(table, cutoff=T0 + 1, after=None, limit=5, source="s2")
    assert [(c.tenant, c.source) for c in s2] == [(None, "s2")]
    every = await store.retention.scan(table, cutoff=T0 + 1, after=None, limit=5)
    assert len(every) == 2
    assert await store.retention.purge_tenants(table, ["t1"], cutoff=T0 + 1, now=T0, limit=5) == 1
    assert await store.retention.purge_ids(table, [c.id for c in s2], cutoff=T0 + 1, now=T0) == 1
    assert await store.retention.count_groups(table, T0 + 1) == {}
