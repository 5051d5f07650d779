"""Time partitions of the history on PostgreSQL (relaybox.store.partitions): the
conversion of live tables, partitions made ahead, rows waiting in the DEFAULT
partition moved, and drops held back by what must stay."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from relaybox.store import Store, open_store
from relaybox.store.backend import load_queries
from relaybox.store.partition_layout import day_id
from tests.conftest import _dsn
from tests.store import test_erasure as erasure_tests
from tests.store.test_plans import GENERIC_POOL
from tests.store.test_store import T0, delivery, statuses

DAY = 86400
RECEIVING = ["relaybox_inbox", "relaybox_inbox_attempts", "relaybox_quarantine"]
SENDING = [
    "relaybox_outbox",
    "relaybox_outbox_attempts",
    "relaybox_messages",
    "relaybox_delivery_keys",
]
NOW = T0 + 100 * DAY  # every row's age (30 days) long past


@pytest.fixture
async def store(pg_url: str) -> AsyncIterator[Store]:
    s = open_store(pg_url)
    await s.migrate()
    yield s
    await s.close()


async def sql(store: Store, *statements: str) -> None:
    async with store.transaction() as conn:
        for statement in statements:
            await conn.exec_driver_sql(statement)


async def names(store: Store, table: str) -> list[str]:
    rows = await store.fetch_all(
        "SELECT c.relname AS name FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        f" WHERE i.inhparent = '{table}'::regclass ORDER BY 1"
    )
    return [r["name"] for r in rows]


async def today(store: Store) -> int:
    rows = await store.fetch_all("SELECT floor(extract(epoch FROM now()) / 86400)::bigint AS d")
    return int(rows[0]["d"])


def ages(table: str, tenant: str | None, source: str | None) -> float:
    return 30 * DAY


DROP = (NOW, ages, lambda table: 30 * DAY)


async def test_convert_keeps_rows_and_lookups(store: Store) -> None:
    outcomes = await store.inbox.accept([delivery("e1"), delivery("e2")])
    assert statuses(outcomes) == ["accepted", "accepted"]
    converted = await store.partitions.convert("day")
    assert converted == [*RECEIVING, *SENDING]
    assert await store.partitions.tables() == set(converted)
    d = await today(store)
    parts = await names(store, "relaybox_inbox")
    assert "relaybox_inbox_default" in parts
    assert len(parts) >= 4  # the first (the old table, to tomorrow), the default, ahead
    # the old rows are there, found by id and by key; a duplicate is still one
    rows = await store.fetch_all("SELECT id, event_id FROM relaybox_inbox ORDER BY id")
    assert [r["event_id"] for r in rows] == ["e1", "e2"]
    again = await store.inbox.accept([delivery("e1"), delivery("e3")])
    assert statuses(again) == ["duplicate", "accepted"]
    new = await store.fetch_all("SELECT id FROM relaybox_inbox WHERE event_id = 'e3'")
    assert new[0]["id"] >> 32 == d  # day-encoded
    # converting again does nothing
    assert await store.partitions.convert("day") == []


async def test_drop_waits_for_pending_rows(store: Store) -> None:
    await store.inbox.accept([delivery("e1", at=T0), delivery("e2", at=T0)])
    await sql(store, "UPDATE relaybox_inbox SET status = 'done' WHERE event_id = 'e2'")
    await store.partitions.convert("day")
    first = next(n for n in await names(store, "relaybox_inbox") if n != "relaybox_inbox_default")
    result = await store.partitions.maintain("day", drop=DROP)
    assert result.held[first] == "pending"
    assert first in await names(store, "relaybox_inbox")
    await sql(store, "UPDATE relaybox_inbox SET status = 'dead', updated_at = 0")
    result = await store.partitions.maintain("day", drop=DROP)
    assert result.held[first] == "dead letters not discarded"
    await sql(store, "UPDATE relaybox_inbox SET discarded_at = 1, status = 'done'")
    result = await store.partitions.maintain("day", drop=DROP)
    assert first in result.dropped
    assert await store.fetch_all("SELECT * FROM relaybox_inbox") == []
    # the key outlives its row: a resend is still a duplicate
    again = await store.inbox.accept([delivery("e1", at=T0)])
    assert statuses(again) == ["duplicate"]


async def test_rows_in_default_move_into_their_partition(store: Store) -> None:
    await store.partitions.convert("day")
    d = await today(store)
    far = day_id(d + 10, 7)
    await sql(
        store,
        "INSERT INTO relaybox_inbox (id, source, account, event_id, event_type, fingerprint,"
        " status, next_attempt_at, received_at, updated_at)"
        f" VALUES ({far}, 's', 'a', 'x', 't', '\\x00', 'done', 0, 0, 0)",
    )
    rows = await store.fetch_all(
        f"SELECT tableoid::regclass::text AS t FROM relaybox_inbox WHERE id = {far}"
    )
    assert rows[0]["t"] == "relaybox_inbox_default"
    result = await store.partitions.maintain("day", ahead=12)
    assert result.moved == 1
    rows = await store.fetch_all(
        f"SELECT tableoid::regclass::text AS t FROM relaybox_inbox WHERE id = {far}"
    )
    assert rows[0]["t"] != "relaybox_inbox_default"


async def test_sqlite_has_no_partitions(tmp_path: Any) -> None:
    s = open_store(f"sqlite+aiosqlite:///{tmp_path}/x.db")
    await s.migrate()
    assert await s.partitions.tables() == set()
    assert (await s.partitions.maintain("day", drop=DROP)).dropped == []
    await s.close()


@pytest.mark.parametrize("name", ["inbox_claim", "inbox_lock", "inbox_complete", "inbox_start"])
async def test_worker_statements_stay_on_indexes_with_partitions(
    store: Store, pg_url: str, name: str
) -> None:
    """The claim reads the partial index of due pending rows of each partition, the
    worker's statements over claimed ids the primary key: no partition is scanned,
    in the generic plan on a filled inbox never analyzed."""
    await store.partitions.convert("day")
    queries = load_queries("postgres")
    conn = await asyncpg.connect(_dsn(pg_url))
    try:
        for part in await names(store, "relaybox_inbox"):
            await conn.execute(f"ALTER TABLE {part} SET (autovacuum_enabled = false)")
        await conn.execute(
            "INSERT INTO relaybox_inbox (source, account, event_id, event_type, fingerprint,"
            " status, next_attempt_at, received_at, updated_at)"
            " SELECT 's', 'a', 'e' || i, 't', '\\x00',"
            " CASE WHEN i % 10 = 0 THEN 'pending' ELSE 'done' END, 0, 0, 0"
            " FROM generate_series(1, 20000) AS i"
        )
        await conn.execute(GENERIC_POOL)
        stmt = await conn.prepare(queries[name])
        args = ", ".join(["NULL"] * len(stmt.get_parameters()))
        rows = await conn.fetch(f"EXPLAIN EXECUTE {stmt.get_name()}({args})")
        plan = "\n".join(r[0] for r in rows)
    finally:
        await conn.close()
    assert not re.search(r"Seq Scan on relaybox_inbox", plan), plan
    if name == "inbox_claim":
        assert re.search(r"Index Scan using relaybox_inbox_p\d{8}_due", plan), plan
    else:
        assert re.search(r"relaybox_inbox_p\d{8}_pkey", plan), plan


def test_migrate_partitions_a_fresh_database_in_one_go(pg_url: str, tmp_path: Any) -> None:
    """`relaybox migrate --partitions day` on an empty database: every migration, then
    the partitioned tables, in one command; run again, nothing to do."""
    import json
    import subprocess
    import sys

    def migrate(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "relaybox", "migrate", "--database-url", url, *extra],
            capture_output=True,
            text=True,
            timeout=120,
        )

    done = migrate(pg_url, "--partitions", "day", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["partitioned"] == [*RECEIVING, *SENDING]
    again = migrate(pg_url, "--partitions", "day", "--json")
    assert json.loads(again.stdout)["partitioned"] == []
    sqlite = migrate(f"sqlite:///{tmp_path}/x.db", "--partitions", "day")
    assert sqlite.returncode == 2 and "need PostgreSQL" in sqlite.stderr


@pytest.mark.parametrize(
    "scenario",
    [
        erasure_tests.test_an_erasure_empties_finished_rows_and_waits_for_pending_ones,
        erasure_tests.test_seed_5002_a_later_erasure_reaches_a_conflict_that_came_after_an_earlier_one,
    ],
    ids=["waits_for_pending", "reaches_a_later_conflict"],
)
async def test_erasure_on_partitioned_tables(store: Store, scenario: Any) -> None:
    """Erasures (tests/store/test_erasure.py) on partitioned tables: rows found by
    their subjects, emptied in place, pending ones waited for; a conflict quarantined
    after the event was erased is reached."""
    await store.partitions.convert("day")
    await scenario(store)


async def test_a_longer_age_of_a_tenant_holds_the_drop(store: Store) -> None:
    """Every row at its own age: one tenant keeps 90 days, so its row finished 60 days
    ago keeps the whole partition; the others' 30 days have passed."""
    await store.inbox.accept([delivery("e1"), delivery("e2")])
    at = NOW - 60 * DAY
    await sql(
        store,
        f"UPDATE relaybox_inbox SET status = 'done', updated_at = {at}",
        "UPDATE relaybox_inbox SET tenant = 'keeps-long' WHERE event_id = 'e2'",
    )
    await store.partitions.convert("day")
    first = next(n for n in await names(store, "relaybox_inbox") if n != "relaybox_inbox_default")

    def tenant_ages(table: str, tenant: str | None, source: str | None) -> float:
        return 90 * DAY if tenant == "keeps-long" else 30 * DAY

    result = await store.partitions.maintain("day", drop=(NOW, tenant_ages, lambda t: 30 * DAY))
    assert result.held[first] == "retention age"
    result = await store.partitions.maintain(
        "day", drop=(NOW + 31 * DAY, tenant_ages, lambda t: 30 * DAY)
    )
    assert first in result.dropped


async def test_maintenance_drops_partitions_and_the_purge_leaves_them(pg_url: str) -> None:
    """The maintenance job (Maintenance.run_once) on partitioned tables: the purge's
    per-row UPDATE leaves them alone (payloads stay until their partition goes), and
    the partition holding only finished rows past their age is dropped."""
    from relaybox import FrozenClock, Relaybox
    from relaybox.config import Settings
    from relaybox.retention import Maintenance

    clock = FrozenClock(T0)
    box = Relaybox(
        settings=Settings(database_url=pg_url, retention={"partitions": "day"}), clock=clock
    )
    try:
        await box.store.migrate()
        await box.store.inbox.accept([delivery("e1", at=T0)])
        await sql(box.store, f"UPDATE relaybox_inbox SET status = 'done', updated_at = {T0}")
        await box.store.partitions.convert("day")
        first = next(
            n for n in await names(box.store, "relaybox_inbox") if n != "relaybox_inbox_default"
        )
        clock.set(T0 + 31 * DAY)
        # the purge alone: the row keeps its payload (no per-row UPDATE)
        from relaybox.retention import purge

        result = await purge(box)
        assert result.inbox == 0
        rows = await box.store.fetch_all("SELECT payload IS NOT NULL AS kept FROM relaybox_inbox")
        assert rows == [{"kept": True}]
        await Maintenance(box).run_once()
        assert first not in await names(box.store, "relaybox_inbox")
        assert await box.store.fetch_all("SELECT 1 FROM relaybox_inbox") == []
    finally:
        await box.close()


async def test_a_dropped_partition_takes_its_subject_index_rows_along(pg_url: str) -> None:
    """The maintenance job, after dropping an inbox partition, deletes the subject
    index's rows of the dropped events (``retention.batch`` of them a transaction),
    but those of an event whose handler's row still holds data: an erasure then still
    finds that row, and deletes the index row it used."""
    import dataclasses

    from relaybox import FrozenClock, Relaybox
    from relaybox.config import Settings
    from relaybox.erasure import erase
    from relaybox.retention import Maintenance
    from relaybox.sources.base import subject_digest

    clock = FrozenClock(T0)
    box = Relaybox(
        settings=Settings(database_url=pg_url, retention={"partitions": "day", "batch": 1}),
        clock=clock,
    )
    alice, bob = subject_digest("cus_alice"), subject_digest("cus_bob")
    try:
        await box.store.migrate()
        await box.store.inbox.accept(
            [
                dataclasses.replace(delivery(f"e{i}", at=T0), subject=digest)
                for i, digest in enumerate((alice, alice, alice, bob))
            ]
        )
        await sql(box.store, f"UPDATE relaybox_inbox SET status = 'done', updated_at = {T0}")
        [held] = await box.store.fetch_all("SELECT id FROM relaybox_inbox WHERE event_id = 'e1'")
        # A row e1's handler added, finished recently: it keeps its payload for now.
        now = T0 + 31 * DAY
        await sql(
            box.store,
            "INSERT INTO relaybox_outbox (channel, key, payload, inbox_id, status,"
            " next_attempt_at, created_at, updated_at, sent_at)"
            f" VALUES ('mail', 'receipt', '{{\"to\": \"alice\"}}', {held['id']}, 'sent',"
            f" {now}, {now}, {now}, {now})",
        )
        await box.store.partitions.convert("day")
        assert len(await box.store.fetch_all("SELECT 1 FROM relaybox_subjects")) == 4
        clock.set(now)
        await Maintenance(box).run_once()
        assert await box.store.fetch_all("SELECT 1 FROM relaybox_inbox") == []
        left = await box.store.fetch_all("SELECT kind, ref FROM relaybox_subjects")
        assert left == [{"kind": "inbox", "ref": str(held["id"])}]

        done = await erase(box, subject="cus_alice", actor="dpo")
        assert done.rows["outbox"] == 1 and done.finished_at is not None
        assert await box.store.fetch_all("SELECT 1 FROM relaybox_subjects") == []
        [row] = await box.store.fetch_all("SELECT payload FROM relaybox_outbox")
        assert row["payload"] == "null"
    finally:
        await box.close()


async def test_week_partitions_start_on_mondays(store: Store) -> None:
    import datetime as dt
    import itertools

    await store.partitions.convert("week")
    made = [n for n in await names(store, "relaybox_inbox") if n != "relaybox_inbox_default"]
    assert len(made) >= 2
    starts = [dt.datetime.strptime(n[-8:], "%Y%m%d").date() for n in made[1:]]
    assert all(d.weekday() == 0 for d in starts), starts  # the first: the migration's day
    assert all((b - a).days == 7 for a, b in itertools.pairwise(starts))
