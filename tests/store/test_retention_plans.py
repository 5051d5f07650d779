"""Plans of the purge's passes per tenant group and per source (PostgreSQL). The store
plans them for their values (``retention_custom_plans``): on filled, analyzed tables
where the scope is small (3 tenants of 1,000; a source with 1 % of the events), a
tenant group's batch reaches its tenants' rows through the partial ``(tenant, time)``
indexes and a source's scan through ``(source, time)``, instead of walking every
tenant's rows in time order; the scans of everything and the purges by id use the
``purgeable`` indexes and primary keys; never a sequential scan of history. And a
tenant group's batch locks its rows once whatever the plan."""

from __future__ import annotations

import json
import re

import asyncpg
import pytest

from relaybox.store.backend import load_queries
from tests.conftest import _dsn
from tests.store.test_plans import BIG, _nodes

_FILL = (
    "INSERT INTO relaybox_inbox (source, account, event_id, event_type, fingerprint, tenant,"
    " status, payload, next_attempt_at, received_at, updated_at)"
    " SELECT CASE WHEN i % 100 = 0 THEN 'rare' ELSE 'busy' END, 'a', 'e' || i, 't', '\\x00',"
    " 't' || (i % 1000), 'done', '{}', 0, 0, i FROM generate_series(1, 50000) AS i;"
    " INSERT INTO relaybox_quarantine (inbox_id, source, account, event_id, event_type,"
    " fingerprint, payload, received_at, resolved_at)"
    " SELECT i, 'busy', 'a', 'e' || i, 't', '\\x01', '{}', 0, 1 FROM generate_series(1, 2000) i;"
    " INSERT INTO relaybox_messages (id, tenant, event_type, body, created_at)"
    " SELECT 'msg_' || i, 't' || (i % 1000), 'x', '{}', i FROM generate_series(1, 50000) AS i;"
    " INSERT INTO relaybox_outbox (channel, key, payload, tenant, status, next_attempt_at,"
    " created_at, updated_at, message_id, purged_at) SELECT 'webhook', 'k' || i, '{}',"
    " 't' || (i % 1000), 'sent', 0, 0, i, 'msg_' || i, CASE WHEN i % 2 = 0 THEN 1 END"
    " FROM generate_series(1, 50000) AS i;"
    " ANALYZE"
)

_TENANTS = (1e9, 2.0, 500, ["t1", "t2", "t3"])
_SCAN = (1e9, float("-inf"), 0, 500)


@pytest.mark.parametrize(
    ("name", "args", "index"),
    [
        ("ops_purge_inbox_tenants", _TENANTS, "tenant = ANY"),
        ("ops_purge_outbox_tenants", _TENANTS, "tenant = ANY"),
        ("ops_purge_messages_tenants", _TENANTS, "tenant = ANY"),
        ("ops_purge_quarantine_tenants", _TENANTS, None),  # few rows: no index of its own
        ("ops_purge_inbox_scan", _SCAN, "relaybox_inbox_purgeable"),
        ("ops_purge_inbox_scan_source", (*_SCAN, "rare"), "source = 'rare'"),
        ("ops_purge_outbox_scan", _SCAN, "relaybox_outbox_purgeable"),
        ("ops_purge_messages_scan", (1e9, float("-inf"), "", 500), "relaybox_messages_purgeable"),
        ("ops_purge_inbox_ids", ([1, 2, 3], 2.0, 1e9), "relaybox_inbox_pkey"),
        ("ops_purge_quarantine_ids", ([1, 2, 3], 2.0, 1e9), "relaybox_quarantine_pkey"),
        ("ops_purge_outbox_ids", ([1, 2, 3], 2.0, 1e9), "relaybox_outbox_pkey"),
        ("ops_purge_messages_ids", (["msg_1", "msg_2"], 2.0, 1e9), "relaybox_messages_pkey"),
    ],
)
async def test_scoped_passes_reach_their_rows_by_index(
    pg_url: str, name: str, args: tuple[object, ...], index: str | None
) -> None:
    queries = load_queries("postgres")
    conn = await asyncpg.connect(_dsn(pg_url))
    try:
        await conn.execute(_FILL)
        async with conn.transaction():
            await conn.fetch(queries["retention_custom_plans"])
            stmt = await conn.prepare(queries[name])
            for _ in range(6):  # past the 5 custom plans PostgreSQL makes by default
                await stmt.explain(*args)
            plan = json.dumps(await stmt.explain(*args))
    finally:
        await conn.close()
    if index is not None and "_tenants" not in name and "_source" not in name:
        assert f'"Index Name": "{index}"' in plan, plan
    elif index is not None:
        # The scope is a condition of the index scan (the partial (tenant|source, time)
        # index, or another that starts with it), not a filter of a walk in time order.
        conds = re.findall(r'"Index Cond": "([^"]*)"', plan)
        assert any(index in c for c in conds), plan
    scanned = set(re.findall(r'"Node Type": "Seq Scan", [^{}]*"Relation Name": "(\w+)"', plan))
    assert not scanned & (BIG - {"relaybox_quarantine"}), plan


@pytest.mark.parametrize(
    "name", ["ops_purge_inbox_tenants", "ops_purge_outbox_tenants", "ops_purge_messages_tenants"]
)
async def test_a_tenant_group_batch_is_chosen_once_whatever_the_plan(
    pg_url: str, name: str
) -> None:
    """As ``test_a_purge_batch_is_chosen_once_whatever_the_plan``: pushed to nested
    loops without materialising, the batch's LIMIT runs once, at most ``n`` rows."""
    conn = await asyncpg.connect(_dsn(pg_url))
    try:
        await conn.execute(_FILL)
        if "messages" in name:
            await conn.execute("UPDATE relaybox_outbox SET purged_at = 1")  # their turn
        await conn.execute(
            "SET enable_hashjoin = off; SET enable_mergejoin = off; SET enable_material = off"
        )
        [[document]] = await conn.fetch(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + load_queries("postgres")[name],
            1e9,  # cutoff: every row finished before it
            2.0,  # now
            10,  # the batch's limit
            ["t1", "t2", "t3"],
        )
    finally:
        await conn.close()
    plan = json.loads(document)[0]["Plan"]
    [lock] = _nodes(plan, "LockRows")
    assert lock["Actual Loops"] == 1, document
    assert plan["Node Type"] == "ModifyTable" and 0 < plan["Actual Rows"] <= 10, document
