"""The keys tables' indexes by day exist only where a keys window applies
(relaybox.store.keys_index): a maintenance pass drops those no window needs, builds
those one needs before that table's expiry, and skips the expiry of a table whose index
it could not build."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest

from relaybox import FrozenClock, Relaybox
from relaybox.retention import Maintenance, purge
from relaybox.store import keys_index
from relaybox.store.keys_index import DAY_INDEXES
from tests.conftest import _dsn
from tests.integration.test_keys_windows import DAY, delivery, make_box
from tests.integration.test_ops_cli import Invoke, cli_runner
from tests.support.outbound_app import local, publish_one

ALL = {"event", "message", "operation", "outbox"}


async def indexes(box: Relaybox) -> dict[str, bool]:
    """Every index by day of a keys table in the catalog: its name, whether valid."""
    names = [index for _, index in DAY_INDEXES.values()]
    if box.store.backend == "sqlite":
        rows = await box.store.fetch_all(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND name LIKE '%keys_age'"
        )
        return {r["name"]: True for r in rows if r["name"] in names}
    rows = await box.store.fetch_all(
        "SELECT c.relname AS name, i.indisvalid AS valid FROM pg_index i"
        " JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname LIKE '%keys_age'"
    )
    return {r["name"]: r["valid"] for r in rows if r["name"] in names}


def expected(box: Relaybox, kinds: set[str]) -> dict[str, bool]:
    """The indexes of ``kinds`` (SQLite keeps no outbox keys table)."""
    sqlite = box.store.backend == "sqlite"
    return {
        index: True for kind, (_, index) in DAY_INDEXES.items() if kind in kinds
        if not (sqlite and kind == "outbox")
    }  # fmt: skip


def shown(box: Relaybox, kinds: set[str]) -> dict[str, bool]:
    """What :meth:`KeysStore.day_indexes` answers when ``kinds`` have theirs."""
    sqlite = box.store.backend == "sqlite"
    return {kind: kind in kinds for kind in DAY_INDEXES if not (sqlite and kind == "outbox")}


async def count(box: Relaybox, table: str) -> int:
    [row] = await box.store.fetch_all(f"SELECT count(*) AS n FROM {table}")
    return int(row["n"])


async def test_no_window_drops_every_index_by_day(database_url: str, clock: FrozenClock) -> None:
    box = make_box(database_url, clock)
    try:
        await box.store.migrate()
        assert await indexes(box) == expected(box, ALL)  # the migrations make them
        await box.store.inbox.accept([delivery("s-1", "stripe", clock.now())])
        assert await Maintenance(box).run_once() is not None
        assert await indexes(box) == {}
        assert await box.store.keys.day_indexes() == shown(box, set())
        clock.advance(3000 * DAY)
        assert (await purge(box)).keys == 0  # kept for good, nothing scanned
        assert await count(box, "relaybox_event_keys") == 1
    finally:
        await box.close()


async def test_a_global_window_builds_all_of_them_and_expires(
    database_url: str, clock: FrozenClock
) -> None:
    bare = make_box(database_url, clock)
    try:
        await bare.store.migrate()
        await Maintenance(bare).run_once()
        assert await indexes(bare) == {}
    finally:
        await bare.close()
    box = make_box(database_url, clock, keys_max_age=10 * DAY)
    try:
        local(box)
        await box.store.inbox.accept([delivery("s-1", "stripe", clock.now())])
        await box.worker().run_once()
        await publish_one(box, tenant="t", data={}, idempotency_key="k")
        clock.advance(20 * DAY)
        await box.store.inbox.accept([delivery("s-2", "stripe", clock.now())])
        result = await Maintenance(box).run_once()
        assert result is not None
        assert await indexes(box) == expected(box, ALL)
        assert await box.store.keys.day_indexes() == shown(box, ALL)
        assert result.keys == 3  # s-1's event key and business key, the message key
        assert await count(box, "relaybox_event_keys") == 1
        assert await count(box, "relaybox_business_keys") == 0
        assert await count(box, "relaybox_message_keys") == 0
    finally:
        await box.close()


async def test_a_tenants_window_builds_only_the_message_keys_index(
    database_url: str, clock: FrozenClock
) -> None:
    box = make_box(database_url, clock, tenants={"t": {"keys_max_age": 2 * DAY}})
    try:
        await box.store.migrate()
        await Maintenance(box).run_once()
        assert await indexes(box) == expected(box, {"message"})
        assert await box.store.keys.day_indexes() == shown(box, {"message"})
    finally:
        await box.close()
    # A source's window: its events' keys and its handlers' business keys.
    box = make_box(database_url, clock, sources={"stripe": {"keys_max_age": 2 * DAY}})
    try:
        await Maintenance(box).run_once()
        assert await indexes(box) == expected(box, {"event", "operation"})
    finally:
        await box.close()


@pytest.fixture
def cli() -> Iterator[Invoke]:
    yield from cli_runner()


async def test_retention_show_tells_which_tables_have_theirs(
    database_url: str, clock: FrozenClock, cli: Invoke
) -> None:
    from relaybox.ops import retention

    box = make_box(database_url, clock, tenants={"t": {"keys_max_age": 2 * DAY}})
    try:
        await box.store.migrate()
        await Maintenance(box).run_once()
        found = (await retention.overview(box)).day_indexes
        assert found["relaybox_message_keys"] is True
        assert found["relaybox_event_keys"] is False
        assert ("relaybox_outbox_keys" in found) is (box.store.backend == "postgres")
    finally:
        await box.close()
    out = await cli("retention", "show", "--database-url", database_url)
    assert "relaybox_message_keys yes" in out.stdout
    assert "relaybox_event_keys no" in out.stdout
    out = await cli("retention", "show", "--json", "--database-url", database_url)
    assert json.loads(out.stdout)["day_indexes"] == found


# -- PostgreSQL: CONCURRENTLY, invalid indexes, locks, two processes ------------------------


@pytest.fixture
async def pg_box(pg_url: str, clock: FrozenClock) -> Any:
    box = make_box(pg_url, clock, keys_max_age=10 * DAY)
    yield box
    await box.close()


async def _make_invalid(url: str) -> None:
    """The event keys' index as a CREATE INDEX CONCURRENTLY killed halfway leaves it:
    there, invalid (here: a unique build that fails on two equal rows)."""
    conn = await asyncpg.connect(_dsn(url))
    try:
        await conn.execute("DROP INDEX relaybox_event_keys_age")
        with pytest.raises(asyncpg.UniqueViolationError):
            await conn.execute(
                "CREATE UNIQUE INDEX CONCURRENTLY relaybox_event_keys_age"
                " ON relaybox_event_keys ((1))"
            )
    finally:
        await conn.close()


async def test_an_invalid_index_is_built_again_and_expiry_waits_for_it(
    pg_box: Relaybox, pg_url: str, clock: FrozenClock
) -> None:
    box = pg_box
    await box.store.inbox.accept([delivery("s-1", "stripe", clock.now())])
    await box.store.inbox.accept([delivery("s-2", "stripe", clock.now())])
    await _make_invalid(pg_url)
    assert (await indexes(box))["relaybox_event_keys_age"] is False
    assert (await box.store.keys.day_indexes())["event"] is False
    clock.advance(20 * DAY)
    result = await Maintenance(box).run_once()
    assert result is not None and result.keys == 2
    assert await indexes(box) == expected(box, ALL)
    [definition] = await box.store.fetch_all(
        "SELECT indexdef FROM pg_indexes WHERE indexname = 'relaybox_event_keys_age'"
    )
    assert definition["indexdef"].endswith("USING btree (first_seen)")


async def test_a_build_that_times_out_skips_that_tables_expiry_this_pass(
    pg_box: Relaybox, pg_url: str, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = pg_box
    monkeypatch.setattr(keys_index, "LOCK_TIMEOUT", "200ms")
    await box.store.inbox.accept(
        [delivery("s-1", "stripe", clock.now()), delivery("s-2", "stripe", clock.now())]
    )
    await box.worker().run_once()
    assert await count(box, "relaybox_business_keys") == 2
    await _make_invalid(pg_url)
    clock.advance(20 * DAY)
    holder = await asyncpg.connect(_dsn(pg_url))
    try:
        async with holder.transaction():
            # A lock CREATE INDEX CONCURRENTLY waits for (its SHARE UPDATE EXCLUSIVE).
            await holder.execute("LOCK TABLE relaybox_event_keys IN SHARE MODE")
            result = await Maintenance(box).run_once()
        assert result is not None
        assert result.keys == 2  # the business keys; the event keys wait for their index
        assert await count(box, "relaybox_event_keys") == 2
        # Still invalid: its drop waits for the same lock (the next pass drops it).
        assert (await indexes(box))["relaybox_event_keys_age"] is False
    finally:
        await holder.close()
    result = await Maintenance(box).run_once()  # the lock is gone: built, then expired
    assert result is not None and result.keys == 2
    assert await indexes(box) == expected(box, ALL)
    assert await count(box, "relaybox_event_keys") == 0


async def test_another_process_building_them_leaves_them_alone(
    pg_box: Relaybox, pg_url: str, clock: FrozenClock
) -> None:
    box = pg_box
    await box.store.inbox.accept([delivery("s-1", "stripe", clock.now())])
    await box.store.keys.keep_day_indexes(())
    clock.advance(20 * DAY)
    other = await asyncpg.connect(_dsn(pg_url))
    try:
        assert await other.fetchval("SELECT pg_try_advisory_lock(7232, 2)")
        result = await purge(box)  # the other process holds the builders' lock
        assert result.keys == 0
        assert await indexes(box) == {}
    finally:
        await other.close()
    assert (await purge(box)).keys == 1
    assert await indexes(box) == expected(box, ALL)


async def test_two_maintenance_passes_at_once(pg_url: str, clock: FrozenClock) -> None:
    boxes = [make_box(pg_url, clock, keys_max_age=10 * DAY) for _ in range(2)]
    try:
        first = boxes[0]
        await first.store.inbox.accept(
            [delivery(f"s-{i}", "stripe", clock.now()) for i in range(200)]
        )
        await first.store.keys.keep_day_indexes(())
        clock.advance(20 * DAY)
        # The maintenance loops (one runs, the other finds the lock held) and two purges
        # (`relaybox purge`: no maintenance lock, the builders' lock decides).
        passes = await asyncio.gather(*(Maintenance(b).run_once() for b in boxes))
        assert any(p is not None for p in passes)
        assert await indexes(first) == expected(first, ALL)
        assert await count(first, "relaybox_event_keys") == 0
        await first.store.inbox.accept(
            [delivery(f"t-{i}", "stripe", clock.now()) for i in range(200)]
        )
        await first.store.keys.keep_day_indexes(())
        clock.advance(20 * DAY)
        purged = await asyncio.gather(*(purge(b) for b in boxes))
        assert await indexes(first) == expected(first, ALL)  # none invalid, none missing
        rest = (await purge(first)).keys
        assert sum(p.keys for p in purged) + rest == 200  # each key forgotten once
        assert await count(first, "relaybox_event_keys") == 0
    finally:
        for b in boxes:
            await b.close()
