"""Time partitions under faults (PostgreSQL): a maintainer SIGKILLed between its
DETACH and its DROP, a conversion SIGKILLed halfway with traffic flowing, two
maintainers at once, and a clock a minute off. Each time the next run finishes what
was left, and no row is lost or refused."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import pytest

from relaybox.store import Store, open_store
from relaybox.store.partition_layout import day_id
from relaybox.store.partitions import MaintainResult
from tests.store.test_partitions import DAY, DROP, RECEIVING, SENDING, names, sql, today
from tests.store.test_store import delivery, statuses

ROWS = 50_000


@pytest.fixture
async def store(pg_url: str) -> AsyncIterator[Store]:
    s = open_store(pg_url)
    await s.migrate()
    yield s
    await s.close()


def run_killed(url: str, mode: str, where: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.partition_kill", url, mode, where],
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]


async def fill(store: Store, n: int, status: str = "done") -> None:
    await sql(
        store,
        "INSERT INTO relaybox_inbox (source, account, event_id, event_type, fingerprint,"
        " status, payload, next_attempt_at, received_at, updated_at)"
        f" SELECT 'bulk', 'a', 'b' || i, 't', '\\x00', '{status}', '{{}}', 0, 0, 0"
        f" FROM generate_series(1, {n}) AS i",
        "INSERT INTO relaybox_inbox_attempts (inbox_id, attempt, outcome, started_at,"
        " finished_at) SELECT id, 1, 'ok', 0, 0 FROM relaybox_inbox WHERE source = 'bulk'",
        # their keys (the accept's statement writes them; bulk rows come without)
        "INSERT INTO relaybox_keys_backfill (kind, finished_at) VALUES ('event', 1)"
        " ON CONFLICT (kind) DO UPDATE SET finished_at = 1",
    )


@pytest.mark.parametrize("step", ["detach", "drop"])
async def test_sigkill_in_a_drop_then_the_next_run_finishes(
    store: Store, pg_url: str, step: str
) -> None:
    await fill(store, 1000)
    await store.partitions.convert("day")
    first = next(n for n in await names(store, "relaybox_inbox") if n.endswith(tuple("0123456789")))
    run_killed(pg_url, "drop", f"{first}:{step}")
    left = await store.fetch_all(f"SELECT count(*) AS n FROM pg_class WHERE relname = '{first}'")
    assert left[0]["n"] == 1  # killed before its DROP
    result = await store.partitions.maintain("day", drop=DROP)
    assert first in result.dropped
    assert await store.fetch_all(f"SELECT 1 FROM pg_class WHERE relname = '{first}'") == []
    assert first not in await names(store, "relaybox_inbox")
    # the attempts' partition went before (or with) its events'
    assert await store.fetch_all("SELECT 1 FROM relaybox_inbox_attempts") == []
    assert await store.fetch_all("SELECT 1 FROM relaybox_inbox") == []
    # the parent still takes new rows
    assert statuses(await store.inbox.accept([delivery("new")])) == ["accepted"]


async def maintain_twice(store: Store) -> tuple[MaintainResult, MaintainResult]:
    """Two maintainers at once, the second starting while the first holds its drop:
    (the first's result, the second's)."""
    other = open_store(store.url)
    started = asyncio.Event()

    async def slow(part: str, step: str) -> None:
        started.set()
        await asyncio.sleep(0.5)

    try:
        first = asyncio.create_task(store.partitions.maintain("day", drop=DROP, before_drop=slow))
        await asyncio.wait_for(started.wait(), 30)
        second = await other.partitions.maintain("day", drop=DROP)
        done = await first
    finally:
        await other.close()
    return done, second


async def test_two_maintainers_at_once_do_not_fight(store: Store) -> None:
    await fill(store, 100)
    await store.partitions.convert("day")
    done, second = await maintain_twice(store)
    assert second.skipped and not second.dropped
    assert done.dropped and not done.skipped


async def test_sigkill_in_a_live_conversion_with_traffic(store: Store, pg_url: str) -> None:
    """50,000 rows, accepts flowing the whole time; the conversion is killed before the
    attempts' switch (the inbox switched already), then run again to its end."""
    await fill(store, ROWS)
    stop = asyncio.Event()
    accepted: list[str] = []
    errors: list[BaseException] = []

    async def traffic() -> None:
        n = 0
        while not stop.is_set():
            batch = [delivery(f"live-{n + i}") for i in range(10)]
            n += 10
            try:
                outcomes = await store.inbox.accept(batch)
            except Exception as exc:
                errors.append(exc)
                continue
            accepted.extend(
                d.event_id for d, o in zip(batch, outcomes, strict=True) if o.status == "accepted"
            )
            await asyncio.sleep(0.005)

    load = asyncio.create_task(traffic())
    try:
        await asyncio.sleep(0.3)
        await asyncio.to_thread(run_killed, pg_url, "convert", "relaybox_inbox_attempts:switch")
        assert await store.partitions.tables() == {"relaybox_inbox"}
        await asyncio.sleep(0.3)
        assert await store.partitions.convert("day") == [
            "relaybox_inbox_attempts",
            "relaybox_quarantine",
            *SENDING,
        ]
        await asyncio.sleep(0.3)
    finally:
        stop.set()
        await load
    assert not errors, errors[:3]
    assert len(accepted) > 50
    rows = await store.fetch_all(
        "SELECT count(*) FILTER (WHERE source = 'bulk') AS bulk,"
        " count(*) FILTER (WHERE source = 'src') AS live FROM relaybox_inbox"
    )
    assert rows[0]["bulk"] == ROWS
    assert rows[0]["live"] == len(accepted)
    assert await store.partitions.tables() == {*RECEIVING, *SENDING}


async def test_a_clock_a_minute_off_neither_loses_nor_drops_early(store: Store) -> None:
    """The ids take the database's day, the ages the application's clock: a row
    written just before midnight (by the database's clock) by an application whose
    clock is 60 s ahead says it changed after its partition's range ended. It is
    dropped at its own age, not at its partition's bound."""
    await store.partitions.convert("day")
    d = await today(store)
    last = day_id(d + 2, 1)  # a row of the first partition made ahead
    end = (d + 3) * DAY  # where that partition's range ends
    await sql(
        store,
        "INSERT INTO relaybox_inbox (id, source, account, event_id, event_type, fingerprint,"
        " status, next_attempt_at, received_at, updated_at)"
        f" VALUES ({last}, 's', 'a', 'x', 't', '\\x00', 'done', 0, {end + 60}, {end + 60})",
    )
    part = next(
        n
        for n in await names(store, "relaybox_inbox")
        if n.endswith(time.strftime("%Y%m%d", time.gmtime((d + 2) * DAY)))
    )

    def age(table: str, tenant: str | None, source: str | None) -> float:
        return 30 * DAY

    # The partition's range is 30 days old, the row not quite: kept.
    now = end + 30 * DAY + 30
    result = await store.partitions.maintain("day", drop=(now, age, lambda t: 30 * DAY))
    assert result.held.get(part) == "retention age"
    assert await store.fetch_all(f"SELECT 1 FROM relaybox_inbox WHERE id = {last}")
    result = await store.partitions.maintain("day", drop=(now + 31, age, lambda t: 30 * DAY))
    assert part in result.dropped
    assert not await store.fetch_all(f"SELECT 1 FROM relaybox_inbox WHERE id = {last}")


@pytest.mark.parametrize(
    "where",
    [
        "relaybox_inbox_attempts:add_check",
        "relaybox_quarantine:validate",
        "relaybox_quarantine:switch",
    ],
)
async def test_maintenance_finishes_a_conversion_killed_halfway(
    store: Store, pg_url: str, where: str
) -> None:
    """A conversion killed after its first bound CHECK: its CHECKs would refuse rows
    once the day reaches their bound, so the next maintenance pass finishes it."""
    await fill(store, 1000)
    run_killed(pg_url, "convert", where)
    assert await store.partitions.tables() != {
        "relaybox_inbox",
        "relaybox_inbox_attempts",
        "relaybox_quarantine",
    }
    result = await store.partitions.maintain("day")
    assert result.converted
    assert await store.partitions.tables() == {
        "relaybox_inbox",
        "relaybox_inbox_attempts",
        "relaybox_quarantine",
    }
    rows = await store.fetch_all("SELECT count(*) AS n FROM relaybox_inbox")
    assert rows[0]["n"] == 1000
    assert statuses(await store.inbox.accept([delivery("after")])) == ["accepted"]
