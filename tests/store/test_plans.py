"""Plans of relaybox's own PostgreSQL statements on a young database.

A prepared statement's plan is cached per connection, and a generic plan made while a
table has no statistics is kept until autovacuum analyzes it. On a fresh deployment (and
in every benchmark run) that plan decides throughput: the accept's duplicate lookup was
planned as a sequential scan + hash join of the inbox and kept scanning every row. So
every statement on a path that runs per event or per delivery must reach the big tables
through an index even in its generic plan on an empty database.

Operators' reads (counts, lists, purges, replays) may scan: they are not on a hot path,
and their names say so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest

from relaybox.store import open_store
from relaybox.store.backend import load_queries
from relaybox.store.keys import KEY_KINDS
from tests.conftest import _dsn

# Tables that grow with traffic. Small configuration tables (endpoints, lanes, keys,
# event types) are read whole by design.
BIG = {
    "relaybox_inbox",
    "relaybox_inbox_attempts",
    "relaybox_quarantine",
    "relaybox_operations",
    "relaybox_outbox",
    "relaybox_outbox_attempts",
    "relaybox_messages",
    "relaybox_event_keys",
    "relaybox_message_keys",
    "relaybox_business_keys",
    "relaybox_outbox_keys",
    "relaybox_delivery_keys",
}

# The settings of Backend.generic_pool, where the hot batch statements run.
GENERIC_POOL = "SET plan_cache_mode = force_generic_plan; SET enable_bitmapscan = off"

# Operators' reads and maintenance: listed, counted or purged on demand; erasures
# (test_an_erasure_probes_the_subjects_rows checks they reach rows by index); the
# keys' backfill and expiry (batches of the maintenance job); the time partitions'
# DDL templates (part_: filled in by relaybox.store.partitions).
OPERATOR = re.compile(
    r"^(ops_|stats_|erase_|erasure_|keys_|part_|replay_select$|.*_list$|.*_count$)"
)


def _generic_plans(queries: dict[str, str]) -> list[str]:
    return [name for name in sorted(queries) if not OPERATOR.match(name)]


async def test_hot_statements_reach_big_tables_through_an_index(pg_url: str) -> None:
    queries = load_queries("postgres")
    conn = await asyncpg.connect(_dsn(pg_url))
    scans: dict[str, list[str]] = {}
    try:
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        for name in _generic_plans(queries):
            stmt = await conn.prepare(queries[name])
            n = len(stmt.get_parameters())
            args = f"({', '.join(['NULL'] * n)})" if n else ""
            plan = "\n".join(
                r[0] for r in await conn.fetch(f"EXPLAIN EXECUTE {stmt.get_name()}{args}")
            )
            found = sorted(set(re.findall(r"Seq Scan on (\w+)", plan)) & BIG)
            if found:
                scans[name] = found
    finally:
        await conn.close()
    assert not scans, f"sequential scans of growing tables in generic plans: {scans}"


@pytest.mark.parametrize("name", ["stats_inbox", "ops_inbox_list", "delivery_list"])
def test_operator_reads_are_recognised(name: str) -> None:
    assert OPERATOR.match(name)
    assert name in load_queries("postgres")


async def _plans_on_a_filled_table(
    pg_url: str,
    table: str,
    fill: str,
    statements: dict[str, str | None],
    filled: Callable[[], Awaitable[Any]] | None = None,
) -> dict[str, str]:
    """Generic plans of ``statements`` (name: its arguments, ``None`` for NULLs) once
    ``table`` is filled by ``fill`` (then ``filled`` called) and never analyzed
    (autovacuum off for it)."""
    queries = load_queries("postgres")
    conn = await asyncpg.connect(_dsn(pg_url))
    plans = {}
    try:
        await conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        await conn.execute(fill)
        if filled is not None:
            await filled()
        await conn.execute(GENERIC_POOL)
        for name, args in statements.items():
            stmt = await conn.prepare(queries[name])
            if args is None:
                args = ", ".join(["NULL"] * len(stmt.get_parameters()))
            rows = await conn.fetch(f"EXPLAIN EXECUTE {stmt.get_name()}({args})")
            plans[name] = "\n".join(r[0] for r in rows)
    finally:
        await conn.close()
    return plans


async def test_lease_records_by_primary_key_on_a_filled_outbox_without_statistics(
    pg_url: str,
) -> None:
    """The dispatcher's lease records the successes it carries (``done``). Planned on a
    freshly filled outbox, before any ANALYZE (a benchmark, a backlog after a deploy),
    a join on id alone was a scan of every pending row through the status index and a
    hash join, kept for the connection's life: ~10 ms per lease at 20,000 pending.
    It must probe the primary key, and find each lane's due rows through the lane's
    index. The recorder's ``outbox_record`` (failures, retries) likewise."""
    ids = "'{1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20}'"
    nulls = "'{" + ",".join(["NULL"] * 20) + "}'"
    sent = [ids, ids, nulls, nulls, nulls, nulls, nulls, nulls, nulls]
    fair = ["64", "16", "'{}'", "'{}'"]  # lane cap, a tenant's rows, tenants, their rows
    plans = await _plans_on_a_filled_table(
        pg_url,
        "relaybox_outbox",
        "INSERT INTO relaybox_outbox (channel, key, payload, next_attempt_at, created_at,"
        " updated_at) SELECT 'webhook', 'k' || i, '{}', 0, 0, 0"
        " FROM generate_series(1, 20000) AS i",
        {
            "outbox_lease": ", ".join(
                ["1", "0", "'{webhook}'", "'me'", "2", *sent, "'{webhook}'", "4", *fair, nulls]
            ),
            "outbox_record": ", ".join(["1", ids, ids, *[nulls] * 5]),
        },
    )
    plan, record = plans["outbox_lease"], plans["outbox_record"]
    assert "relaybox_outbox_pkey" in record, record
    assert "relaybox_outbox_due" not in record and "lane_due" not in record, record
    done = re.split(r"\n\s*CTE \w+\n", plan.split("CTE done\n", 1)[1], maxsplit=1)[0]
    assert "relaybox_outbox_pkey" in done, done
    # Nor does the rest of the lease walk the due rows of every lane: per lane, it
    # probes the lane's own index.
    assert "relaybox_outbox_due" not in plan, plan
    # Leases live for one attempt: their table holds many dead rows between vacuums.
    # The lease reaches it by index scans (which mark dead entries), never a bitmap or
    # sequential scan (which read them all again on every lease).
    assert "Index Scan using relaybox_outbox_leases_lane" in plan, plan
    assert not re.search(r"(Bitmap Heap|Seq) Scan on relaybox_outbox_leases", plan), plan
    assert not re.search(r"(Bitmap Heap|Seq) Scan on relaybox_outbox_leases", record), record


@pytest.mark.parametrize(
    "name",
    ["inbox_lock", "inbox_complete", "inbox_start", "inbox_lock_group", "inbox_start_next_group"],
)
async def test_worker_statements_probe_ids_on_a_filled_inbox_without_statistics(
    pg_url: str, name: str
) -> None:
    """The worker's statements over a list of claimed ids. Planned on a filled inbox
    before any ANALYZE (a backlog on a young deployment), "status = 'pending'" matched
    the pending-only due index, and the cached plan walked every pending row for each
    group (a BitmapAnd with the ids, or a hash join). They must probe the ids."""
    plans = await _plans_on_a_filled_table(
        pg_url,
        "relaybox_inbox",
        "INSERT INTO relaybox_inbox (source, account, event_id, event_type, fingerprint,"
        " status, next_attempt_at, received_at, updated_at)"
        " SELECT 's', 'a', 'e' || i, 't', '\\x00', 'pending', 0, 0, 0"
        " FROM generate_series(1, 20000) AS i",
        {name: None},
    )
    plan = plans[name]
    assert "relaybox_inbox_pkey" in plan, plan
    assert "relaybox_inbox_due" not in plan and "status_source" not in plan, plan


async def test_the_claim_probes_the_rows_it_claims_on_an_analyzed_inbox(pg_url: str) -> None:
    """The worker's claim runs with its generic plan forced (Backend.start_pool). On
    an inbox of finished rows with a backlog, analyzed, the claim joined on id alone
    was planned as a sequential scan of the whole inbox and a hash join (~10 ms a
    claim at 37,000 rows, growing with the history): it must take its due rows from the
    due index and reach them by the primary key."""
    queries = load_queries("postgres")
    conn = await asyncpg.connect(_dsn(pg_url))
    try:
        await conn.execute(
            "INSERT INTO relaybox_inbox (source, account, event_id, event_type, fingerprint,"
            " status, next_attempt_at, received_at, updated_at)"
            " SELECT 's', 'a', 'e' || i, 't', '\\x00',"
            " CASE WHEN i % 4 = 0 THEN 'pending' ELSE 'done' END, i, 0, 0"
            " FROM generate_series(1, 20000) AS i"
        )
        await conn.execute("ANALYZE relaybox_inbox")
        await conn.execute(GENERIC_POOL)
        stmt = await conn.prepare(queries["inbox_claim"])
        rows = await conn.fetch(f"EXPLAIN EXECUTE {stmt.get_name()}(30000, 128, 30, 10, 64)")
        plan = "\n".join(r[0] for r in rows)
    finally:
        await conn.close()
    assert not re.search(r"Seq Scan on relaybox_inbox", plan), plan
    assert "Index Scan using relaybox_inbox_due" in plan, plan
    assert "relaybox_inbox_pkey" in plan, plan


# Each retention purge statement, with what makes the rows of its table purgeable.
_PURGES = {
    "ops_purge_inbox": (
        "INSERT INTO relaybox_inbox (source, account, event_id, event_type, fingerprint,"
        " status, payload, next_attempt_at, received_at, updated_at)"
        " SELECT 's', 'a', 'e' || i, 't', '\\x00', 'done', '{}', 0, 0, 0"
        " FROM generate_series(1, 500) AS i"
    ),
    "ops_purge_quarantine": (
        "INSERT INTO relaybox_inbox (id, source, account, event_id, event_type, fingerprint,"
        " status, payload, next_attempt_at, received_at, updated_at)"
        " VALUES (1, 's', 'a', 'e', 't', '\\x00', 'done', '{}', 0, 0, 0);"
        " INSERT INTO relaybox_quarantine (inbox_id, source, account, event_id, event_type,"
        " fingerprint, payload, received_at, resolved_at)"
        " SELECT 1, 's', 'a', 'e', 't', int4send(i), '{}', 0, 0 FROM generate_series(1, 500) AS i"
    ),
    "ops_purge_outbox": (
        "INSERT INTO relaybox_outbox (channel, key, payload, status, next_attempt_at,"
        " created_at, updated_at) SELECT 'webhook', 'k' || i, '{}', 'sent', 0, 0, 0"
        " FROM generate_series(1, 500) AS i"
    ),
    "ops_purge_messages": (
        "INSERT INTO relaybox_messages (id, tenant, event_type, body, created_at)"
        " SELECT 'msg_' || i, 't', 'x', '{}', 0 FROM generate_series(1, 500) AS i"
    ),
}


@pytest.mark.parametrize("name", sorted(_PURGES))
async def test_a_purge_batch_is_chosen_once_whatever_the_plan(pg_url: str, name: str) -> None:
    """A purge batch is ``LIMIT n … FOR UPDATE SKIP LOCKED``. Written as ``id IN
    (SELECT … LIMIT n)``, a nested-loop plan runs that subquery again for each row it
    joins, and with other transactions locking rows between two runs each run can
    skip to other rows: more than ``n`` rows purged in one batch. Here the planner is
    pushed to nested loops without materialising (as statistics may push it on a big
    table): the batch's LIMIT must still run once and purge at most ``n`` rows."""
    conn = await asyncpg.connect(_dsn(pg_url))
    try:
        await conn.execute(_PURGES[name])
        await conn.execute(
            "SET enable_hashjoin = off; SET enable_mergejoin = off; SET enable_material = off"
        )
        # EXPLAIN ANALYZE runs the UPDATE (the database is this test's own).
        [[document]] = await conn.fetch(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + load_queries("postgres")[name],
            1.0,  # cutoff: every row finished before it
            2.0,  # now
            10,  # the batch's limit
        )
    finally:
        await conn.close()
    plan = json.loads(document)[0]["Plan"]
    [lock] = _nodes(plan, "LockRows")  # the batch's rows, locked
    assert lock["Actual Loops"] == 1, document
    assert plan["Node Type"] == "ModifyTable" and plan["Actual Rows"] <= 10, document


def _nodes(plan: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """The nodes of type ``kind`` in an EXPLAIN (FORMAT JSON) plan, depth first."""
    found = [plan] if plan["Node Type"] == kind else []
    for child in plan.get("Plans", []):
        found += _nodes(child, kind)
    return found


_SUBJECT_FILL = (
    "INSERT INTO relaybox_inbox (source, account, event_id, event_type, fingerprint,"
    " status, payload, next_attempt_at, received_at, updated_at, tenant)"
    " SELECT 's', 'a', 'e' || i, 't', '\\x00', 'done', '{}', 0, 0, 0, 't' || (i % 100)"
    " FROM generate_series(1, 20000) AS i;"
    " INSERT INTO relaybox_subjects (digest, kind, ref)"
    " SELECT int4send(i % 2000), 'inbox', i::text FROM generate_series(1, 20000) AS i;"
    " INSERT INTO relaybox_messages (id, tenant, event_type, body, created_at)"
    " SELECT 'msg_' || i, 't' || (i % 100), 'x', '{}', 0 FROM generate_series(1, 20000) AS i;"
    " INSERT INTO relaybox_outbox (channel, key, payload, status, next_attempt_at,"
    " created_at, updated_at, message_id, inbox_id) SELECT 'webhook', 'k' || i, '{}', 'sent',"
    " 0, 0, 0, 'msg_' || i, i FROM generate_series(1, 20000) AS i;"
    " INSERT INTO relaybox_subjects (digest, kind, ref)"
    " SELECT int4send(i % 2000), 'message', 'msg_' || i FROM generate_series(1, 20000) AS i;"
    " INSERT INTO relaybox_quarantine (inbox_id, source, account, event_id, event_type,"
    " fingerprint, payload, received_at, tenant)"
    " SELECT i, 's', 'a', 'e' || i, 't', '\\x01', '{}', 0, 't' || (i % 100)"
    " FROM generate_series(1, 20000) AS i;"
    " INSERT INTO relaybox_projections (resource_key, origin, version, version_key, state,"
    " source, inbox_id, updated_at, subject)"
    " SELECT 'r' || i, 'event', '1', '1', '{}', 's', i, 0, int4send(i % 2000)"
    " FROM generate_series(1, 20000) AS i"
)


@pytest.mark.parametrize(
    ("name", "table"),
    [
        ("erase_inbox_subject", "relaybox_inbox"),
        ("erase_quarantine_subject", "relaybox_quarantine"),
        ("erase_handler_outbox_subject", "relaybox_outbox"),
        ("erase_outbox_subject", "relaybox_outbox"),
        ("erase_messages_subject", "relaybox_messages"),
        ("erase_waiting_subject", "relaybox_inbox"),
        ("erase_outbox_tenant", "relaybox_outbox"),
        ("erase_messages_tenant", "relaybox_messages"),
        ("erase_inbox_tenant", "relaybox_inbox"),
        ("erase_quarantine_tenant", "relaybox_quarantine"),
        ("erase_handler_outbox_ids", "relaybox_outbox"),
        ("erase_waiting_tenant", "relaybox_messages"),
        ("erase_projections_subject", "relaybox_projections"),
        ("erase_projections_ids", "relaybox_projections"),
    ],
)
async def test_an_erasure_probes_the_subjects_rows(pg_url: str, name: str, table: str) -> None:
    """An erasure must not scan history: planned on filled tables that were never
    analyzed (a young deployment), each statement reaches the rows of one subject (or
    tenant) by index, whatever the tables hold."""
    key = "'\\x00000007'::bytea" if "subject" in name else "'t7'"
    n = {"erase_waiting_subject": 1, "erase_waiting_tenant": 1}.get(name, 3)
    args = ", ".join([key, "1.0", "500"][:n])
    if name in ("erase_handler_outbox_ids", "erase_projections_ids"):  # inbox rows erased
        args = "'{7, 107, 207}'::bigint[], 1.0"
    plans = await _plans_on_a_filled_table(pg_url, table, _SUBJECT_FILL, {name: args})
    plan = plans[name]
    assert not set(re.findall(r"Seq Scan on (\w+)", plan)) & (BIG | {"relaybox_projections"}), plan


@pytest.mark.parametrize(
    ("name", "args"),
    [("subject_inherit_inbox", "'msg_x', '7'"), ("subject_inherit_outbox", "'msg_x', 7")],
)
async def test_an_operational_event_finds_its_rows_subjects_by_index(
    pg_url: str, name: str, args: str
) -> None:
    """A dead letter's operational event is indexed under its row's subjects in the
    transaction that records the dead letter: the subjects are found through the
    index of each kind's references (relaybox_subjects_inbox, relaybox_subjects_message),
    never a scan of the index table."""
    plans = await _plans_on_a_filled_table(pg_url, "relaybox_subjects", _SUBJECT_FILL, {name: args})
    scanned = set(re.findall(r"Seq Scan on (\w+)", plans[name]))
    assert not scanned & (BIG | {"relaybox_subjects"}), plans[name]


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("subjects_forget_inbox", "'{7, 107, 207}'::bigint[]"),
        ("subjects_forget_messages", "'{msg_7, msg_107}'::text[]"),
        ("subjects_refs_quarantine", "'{7, 107}'::bigint[]"),
        ("subjects_refs_outbox", "'{7, 107}'::bigint[]"),
        ("subjects_inbox_refs_below", "0, 500, 100"),
        ("projection_upsert", "'r', 'event', '1', '1', '{}', 's', 7, 1.0"),
    ],
)
async def test_the_subject_index_is_asked_about_its_rows_by_index(
    pg_url: str, name: str, args: str
) -> None:
    """What the purge, an erasure and a partition drop ask of the subject index (which
    of its rows find nothing any more), and a projection's write (its event's subject),
    reach the index and the rows it names by index, never a scan, in their generic
    plans on tables never analyzed."""
    plans = await _plans_on_a_filled_table(pg_url, "relaybox_subjects", _SUBJECT_FILL, {name: args})
    scanned = set(re.findall(r"Seq Scan on (\w+)", plans[name]))
    assert not scanned & (BIG | {"relaybox_subjects"}), plans[name]


_KEYS_FILL = {
    "relaybox_event_keys": (
        "INSERT INTO relaybox_event_keys (inbox_id, scope, first_seen, digest, fingerprint)"
        " SELECT i, i % 50, 20000 + i / 1000, md5(i::text)::uuid, i"
        " FROM generate_series(1, 40000) AS i"
    ),
    "relaybox_message_keys": (
        "INSERT INTO relaybox_message_keys (scope, first_seen, digest, message_uuid)"
        " SELECT i % 50, 20000 + i / 1000, md5(i::text)::uuid, md5(i::text)::uuid"
        " FROM generate_series(1, 40000) AS i"
    ),
    "relaybox_business_keys": (
        "INSERT INTO relaybox_business_keys (scope, fingerprint, first_seen, digest)"
        " SELECT i % 50, i, 20000 + i / 1000, md5(i::text)::uuid"
        " FROM generate_series(1, 40000) AS i"
    ),
    "relaybox_outbox_keys": (
        "INSERT INTO relaybox_outbox_keys (digest, first_seen)"
        " SELECT md5(i::text)::uuid, 20000 + i / 1000 FROM generate_series(1, 40000) AS i"
    ),
    "relaybox_delivery_keys": (
        "INSERT INTO relaybox_delivery_keys (day, digest)"
        " SELECT 20000 + i / 1000, md5(i::text)::uuid FROM generate_series(1, 40000) AS i"
    ),
}


@pytest.mark.parametrize(
    ("kind", "table", "index"),
    [
        ("event", "relaybox_event_keys", "relaybox_event_keys_age"),
        ("message", "relaybox_message_keys", "relaybox_message_keys_age"),
        ("operation", "relaybox_business_keys", "relaybox_business_keys_age"),
        ("outbox", "relaybox_outbox_keys", "relaybox_outbox_keys_age"),
        ("delivery", "relaybox_delivery_keys", "relaybox_delivery_keys_pkey"),
    ],
)
async def test_the_keys_expiry_reads_the_index_by_day(
    pg_url: str, kind: str, table: str, index: str
) -> None:
    """Each keys table has one index by day (migration 0037) while a keys window
    applies to it: a batch of expiry of every scope walks it from the oldest key; the
    expiry of one scope, or of all but some, goes day by day (one probe for the next
    day, then one day's keys a batch). Dropped with no window (the delivery keys keep
    their primary key, day first), built again by the maintenance on a filled table
    never analyzed: none of them scans the table."""
    statements = {f"keys_expire_{kind}": "20010, 100"}
    if kind == "delivery":
        statements[f"keys_oldest_{kind}"] = "20010, -2147483648"
    if kind in ("event", "message", "operation"):
        statements |= {
            f"keys_expire_{kind}_scope": "20010, 100, 7",
            f"keys_expire_{kind}_keep": "20010, 100, '{7, 8}'::integer[]",
            f"keys_oldest_{kind}": "20010, -2147483648",
        }
    store = open_store(pg_url)
    try:
        await store.keys.keep_day_indexes(())  # no window: none
        assert not any((await store.keys.day_indexes()).values())

        async def window() -> None:  # a keys window: the maintenance builds them
            assert all((await store.keys.keep_day_indexes(KEY_KINDS)).values())

        plans = await _plans_on_a_filled_table(pg_url, table, _KEYS_FILL[table], statements, window)
    finally:
        await store.close()
    for name, plan in plans.items():
        assert f"Seq Scan on {table}" not in plan, (name, plan)
        assert index in plan, (name, plan)
