"""Time partitions of the sending side under faults (PostgreSQL): a conversion
SIGKILLed halfway with publishes flowing, a conversion left after its bound CHECKs
for days (no insert refused meanwhile), a drop of messages and their delivery keys
SIGKILLed, two maintainers at once, and a clock a minute off. Each time the next run
finishes what was left, and no row is lost or refused."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest

from relaybox.store import Store, open_store
from relaybox.store.backend import load_queries
from relaybox.store.partition_layout import INBOX, OUTBOX, day_id
from relaybox.store.partitions import convert
from tests.conftest import _dsn
from tests.store.test_partition_faults import maintain_twice, run_killed
from tests.store.test_partitions import DAY, DROP, RECEIVING, SENDING, names, sql, today
from tests.store.test_sending_partitions import handler_row, publish
from tests.store.test_store import delivery, statuses
from tests.support.store_rows import endpoint_write as endpoint

ROWS = 20_000


@pytest.fixture
async def store(pg_url: str) -> AsyncIterator[Store]:
    s = open_store(pg_url)
    await s.migrate()
    await s.outbox.endpoint_create(endpoint("ep_1"), "s", quota=5, now=time.time())
    yield s
    await s.close()


async def fill(store: Store, n: int) -> None:
    """``n`` sent messages of a day long gone, a delivery each (their keys marked
    copied: the bulk rows come without, and only new publishes are checked)."""
    await sql(
        store,
        "INSERT INTO relaybox_messages (id, tenant, event_type, body, created_at)"
        " SELECT 'msg_' || lpad(to_hex(1000000000000 + i), 11, '0') || 'bulk', 't1', 't',"
        " '{}', 1000000000 FROM generate_series(1, " + str(n) + ") AS i",
        "INSERT INTO relaybox_outbox (channel, key, payload, tenant, status, next_attempt_at,"
        " created_at, updated_at, lane, endpoint_id, message_id)"
        " SELECT 'webhook', id || ':ep_1', 'null', 't1', 'sent', 0, 0, 0, 'ep_1', 'ep_1', id"
        " FROM relaybox_messages",
        "INSERT INTO relaybox_outbox_attempts (outbox_id, attempt, started_at, duration,"
        " outcome) SELECT id, 1, 0, 0, 'sent' FROM relaybox_outbox",
        "INSERT INTO relaybox_delivery_keys (day, digest) SELECT relaybox_message_day(id),"
        " relaybox_outbox_digest('webhook', id || ':ep_1') FROM relaybox_messages",
        "UPDATE relaybox_keys_backfill SET finished_at = 1 WHERE kind IN ('message', 'outbox')",
    )


async def test_sigkill_in_a_live_conversion_with_publishes(store: Store, pg_url: str) -> None:
    """Publishes flowing the whole time; the conversion is killed before the outbox
    attempts' switch (the outbox switched already), then run again to its end."""
    await fill(store, ROWS)
    stop = asyncio.Event()
    published: list[str] = []
    errors: list[BaseException] = []

    async def traffic() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                if await publish(store, f"live-{n}", at=time.time()):
                    published.append(f"live-{n}")
            except Exception as exc:
                errors.append(exc)
            await asyncio.sleep(0.005)

    load = asyncio.create_task(traffic())
    try:
        await asyncio.sleep(0.3)
        await asyncio.to_thread(run_killed, pg_url, "convert", "relaybox_outbox_attempts:switch")
        assert await store.partitions.tables() == {*RECEIVING, "relaybox_outbox"}
        await asyncio.sleep(0.3)
        assert await store.partitions.convert("day") == SENDING[1:]
        await asyncio.sleep(0.3)
    finally:
        stop.set()
        await load
    assert not errors, errors[:3]
    assert len(published) > 20
    rows = await store.fetch_all(
        "SELECT count(*) FILTER (WHERE idempotency_key IS NULL) AS bulk,"
        " count(*) FILTER (WHERE idempotency_key LIKE 'live-%') AS live FROM relaybox_messages"
    )
    assert rows[0]["bulk"] == ROWS
    assert rows[0]["live"] == len(published)
    deliveries = await store.fetch_all("SELECT count(*) AS n FROM relaybox_outbox")
    assert deliveries[0]["n"] == ROWS + len(published)
    assert await store.partitions.tables() == {*RECEIVING, *SENDING}
    # a publish again with a key of the live traffic is still a duplicate
    assert not await publish(store, published[0], at=time.time())


async def test_a_conversion_left_for_days_after_its_checks_refuses_no_insert(
    store: Store, pg_url: str
) -> None:
    """A conversion killed after its bound CHECKs were added, two days before any
    maintenance comes: the ids drawn meanwhile stay below the bound (and messages,
    whose ids are the publishers', have MESSAGES_SLACK days): nothing is refused. The
    next maintenance finishes it; ids are day-encoded by today again."""
    d = await today(store)
    queries = dict(load_queries("postgres"))
    queries["part_today"] = f"SELECT {d - 2}::bigint AS day"  # the conversion's day

    class Killed(Exception):
        pass

    def kill_at(table: str, step: str) -> None:
        if step == "validate" and table in ("relaybox_quarantine", "relaybox_messages"):
            raise Killed

    conn = await asyncpg.connect(_dsn(pg_url))
    try:
        for group in (INBOX, OUTBOX):
            with pytest.raises(Killed):
                await convert(conn, queries, "day", before_switch=kill_at, groups=(group,))
    finally:
        await conn.close()
    assert await store.partitions.tables() == set()
    # Two days later, by the real clock: events, messages, deliveries, handler rows.
    now = time.time()
    assert statuses(await store.inbox.accept([delivery("late", at=now)])) == ["accepted"]
    assert await publish(store, "late", at=now)
    assert await handler_row(store, "late", at=now) is not None
    ids = await store.fetch_all(
        "SELECT id FROM relaybox_inbox UNION ALL SELECT id FROM relaybox_outbox"
    )
    assert all(r["id"] >> 32 == d - 1 for r in ids)  # held below the bound (day d)
    result = await store.partitions.maintain("day")
    assert set(result.converted) == {*RECEIVING, *SENDING}
    assert statuses(await store.inbox.accept([delivery("after", at=now)])) == ["accepted"]
    assert await publish(store, "after", at=now)
    new = await store.fetch_all(
        "SELECT id FROM relaybox_outbox WHERE key LIKE '%:ep_1' ORDER BY id DESC LIMIT 1"
    )
    assert new[0]["id"] >> 32 == d  # by today's day again


async def test_two_maintainers_drop_the_sending_side_once(store: Store) -> None:
    await fill(store, 100)
    await store.partitions.convert("day")
    done, second = await maintain_twice(store)
    assert second.skipped and not second.dropped
    for table in SENDING:
        part = next(n for n in done.dropped if n.startswith(f"{table}_p"))
        assert part not in await names(store, table)
        assert await store.fetch_all(f"SELECT 1 FROM {table}") == []


async def test_a_clock_a_minute_off_keeps_a_delivery_to_its_own_age(store: Store) -> None:
    """An outbox row's id takes the database's day, its ages the application's clock:
    written just before midnight by an application 60 s ahead, it says it changed after
    its partition's range ended, and is dropped at its own age."""
    await store.partitions.convert("day")
    d = await today(store)
    last = day_id(d + 2, 1)
    end = (d + 3) * DAY
    await sql(
        store,
        "INSERT INTO relaybox_outbox (id, channel, key, payload, tenant, status,"
        " next_attempt_at, created_at, updated_at)"
        f" VALUES ({last}, 'mail', 'k', '{{}}', 't1', 'sent', 0, {end + 60}, {end + 60})",
    )
    part = f"relaybox_outbox_p{time.strftime('%Y%m%d', time.gmtime((d + 2) * DAY))}"
    assert part in await names(store, "relaybox_outbox")

    def age(table: str, tenant: str | None, source: str | None) -> float:
        return 30 * DAY

    now = end + 30 * DAY + 30
    result = await store.partitions.maintain("day", drop=(now, age, lambda t: 30 * DAY))
    assert result.held.get(part) == "retention age"
    result = await store.partitions.maintain("day", drop=(now + 31, age, lambda t: 30 * DAY))
    assert part in result.dropped
    assert not await store.fetch_all(f"SELECT 1 FROM relaybox_outbox WHERE id = {last}")


_WITHOUT_KEY = (
    "SELECT m.id FROM relaybox_messages m WHERE NOT EXISTS (SELECT 1 FROM"
    " relaybox_delivery_keys k WHERE k.day = relaybox_message_day(m.id)"
    " AND k.digest = relaybox_outbox_digest('webhook', m.id || ':ep_1'))"
)


@pytest.mark.parametrize(
    "where",
    [
        "relaybox_messages_p:detach",
        "relaybox_messages_p:drop",
        "relaybox_delivery_keys_p:detach",
        "relaybox_delivery_keys_p:drop",
    ],
)
async def test_sigkill_in_the_drop_of_messages_and_their_keys(
    store: Store, pg_url: str, where: str
) -> None:
    """Killed anywhere in the drop of a messages' partition and of its delivery keys'
    (which comes after): a message still stored always has its delivery keys, and the
    next run drops what was left; the handler rows' keys stay."""
    await fill(store, 1000)
    assert await handler_row(store, "h1", at=0) is not None
    await sql(store, "UPDATE relaybox_outbox SET status = 'sent', updated_at = 0")
    await store.partitions.convert("day")
    await asyncio.to_thread(run_killed, pg_url, "drop", where)
    assert await store.fetch_all(_WITHOUT_KEY) == []
    keys = await store.fetch_all("SELECT count(*) AS n FROM relaybox_delivery_keys")
    if where.startswith("relaybox_messages"):  # killed before the keys' turn: all there
        assert keys[0]["n"] == 1000
    await store.partitions.maintain("day", drop=DROP)
    for table in ("relaybox_messages", "relaybox_delivery_keys", "relaybox_outbox"):
        assert await store.fetch_all(f"SELECT 1 FROM {table}") == [], table
    leftover = await store.fetch_all(
        "SELECT relname FROM pg_class WHERE relname LIKE 'relaybox\\_%\\_p2%' AND relkind = 'r'"
        " AND obj_description(oid, 'pg_class') = 'relaybox: detached, to drop'"
    )
    assert leftover == []
    assert await handler_row(store, "h1") is None  # its key stays and decides
