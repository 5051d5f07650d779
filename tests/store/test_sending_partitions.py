"""Time partitions of the sending side on PostgreSQL (relaybox.store.partitions):
messages by their TEXT ids, outbox rows by day-encoded ids, their attempts with them;
the outbox's keys table (migration 0034) deciding a (channel, key) across drops; drops
held back by what must stay; the dispatcher's lease on partial indexes."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator

import asyncpg
import pytest

from relaybox.store import Store, open_store
from relaybox.store.backend import load_queries
from relaybox.store.outbox_rows import NewMessage, new_id
from relaybox.store.partition_layout import msg_bound
from relaybox.store.partitions import MESSAGES_SLACK, convert
from tests.conftest import _dsn
from tests.store.test_outbox import lease_request, no_secrets
from tests.store.test_partitions import DAY, DROP, NOW, RECEIVING, SENDING, names, sql, today
from tests.store.test_plans import GENERIC_POOL
from tests.store.test_store import T0
from tests.support.store_rows import endpoint_write as endpoint


@pytest.fixture
async def store(pg_url: str) -> AsyncIterator[Store]:
    s = open_store(pg_url)
    await s.migrate()
    await s.outbox.endpoint_create(endpoint("ep_1"), "s", quota=5, now=T0)
    yield s
    await s.close()


async def publish(store: Store, key: str | None, *, tenant: str = "t1", at: float = T0) -> bool:
    """A message with idempotency key ``key`` and its delivery to ep_1; whether it was
    new."""
    async with store.transaction() as conn:
        new = NewMessage(new_id("msg", at), tenant, "pet.adopted", key, '{"n": 1}', at)
        return await store.outbox.message_publish(conn, new, ["ep_1"])


async def handler_row(store: Store, key: str, at: float = T0) -> int | None:
    async with store.transaction() as conn:
        return await store.inbox.outbox_insert(
            conn, channel="mail", key=key, payload="{}", tenant="t1", inbox_id=None, now=at
        )


def first(parts: list[str], table: str) -> str:
    return next(p for p in parts if p != f"{table}_default")


async def test_convert_keeps_messages_deliveries_and_their_keys(store: Store) -> None:
    assert await publish(store, "k1")
    assert await handler_row(store, "h1") is not None
    converted = await store.partitions.convert("day")
    assert converted[-4:] == SENDING
    d = await today(store)
    for table in SENDING:
        assert f"{table}_default" in await names(store, table)
    # messages' first partition reaches MESSAGES_SLACK days further (publishers' clocks),
    # and past the newest message (T0 lies ahead of today)
    [bound] = await store.fetch_all(
        "SELECT pg_get_expr(c.relpartbound, c.oid) AS b FROM pg_class c"
        " WHERE c.relname = 'relaybox_messages_p' || to_char(now(), 'YYYYMMDD')"
    )
    assert msg_bound(max(d + 2 + MESSAGES_SLACK, int(T0 // DAY) + 1)) in bound["b"]
    # a message is still found by its idempotency key through an index (the UNIQUE one
    # went: a plain one, built beside the traffic, took its place)
    indexes = await store.fetch_all(
        "SELECT indexname FROM pg_indexes WHERE tablename = 'relaybox_messages'"
    )
    assert "relaybox_messages_idempotency_key" in {r["indexname"] for r in indexes}
    assert "relaybox_messages_sequence" not in {r["indexname"] for r in indexes}
    found = await store.outbox.message_list(
        "t1", event_type=None, before=None, limit=10, idempotency_key="k1"
    )
    assert len(found) == 1
    # a duplicate is still one, by idempotency key and by (channel, key)
    assert not await publish(store, "k1")
    assert await handler_row(store, "h1") is None
    assert await publish(store, "k2")
    new = await store.fetch_all(
        "SELECT o.id FROM relaybox_outbox o JOIN relaybox_messages m ON m.id = o.message_id"
        " WHERE m.idempotency_key = 'k2'"
    )
    assert new[0]["id"] >> 32 == d  # day-encoded
    # the ids are no longer held below the first bound once every table is switched
    [default] = await store.fetch_all(
        "SELECT pg_get_expr(adbin, adrelid) AS d FROM pg_attrdef"
        " WHERE adrelid = 'relaybox_outbox'::regclass AND adnum = 1"
    )
    assert "relaybox_day_id(" in default["d"] and "below" not in default["d"]
    # an ordered lane still numbers its messages once each (relaybox_outbound_sequences)
    async with store.transaction() as conn:
        numbers = [await store.outbox.message_sequence_next(conn, "t1", "o1") for _ in range(3)]
    assert numbers == [1, 2, 3]


async def test_the_drop_waits_for_live_deliveries_then_keys_still_decide(store: Store) -> None:
    assert await publish(store, "k1", at=T0)
    assert await handler_row(store, "h1", at=T0) is not None
    await store.partitions.convert("day")
    outbox = first(await names(store, "relaybox_outbox"), "relaybox_outbox")
    attempts = outbox.replace("outbox", "outbox_attempts")
    messages = first(await names(store, "relaybox_messages"), "relaybox_messages")
    result = await store.partitions.maintain("day", drop=DROP)
    assert result.held[outbox] == "pending"
    assert result.held[messages] == "deliveries still live"
    await sql(store, "UPDATE relaybox_outbox SET status = 'held', updated_at = 0")
    result = await store.partitions.maintain("day", drop=DROP)
    assert result.held[outbox] == "pending"
    assert result.held[messages] == "deliveries still live"
    # a dead delivery not purged keeps its message (it may be redelivered); its own
    # partition goes at its age, counted from its death
    await sql(store, f"UPDATE relaybox_outbox SET status = 'dead', updated_at = {NOW - DAY}")
    result = await store.partitions.maintain("day", drop=DROP)
    assert result.held[outbox] == "retention age"
    assert result.held[messages] == "deliveries still live"
    # under a dispatcher's lease: kept (the message, its delivery sent, may go)
    await sql(store, "UPDATE relaybox_outbox SET status = 'pending', next_attempt_at = 0")
    leased = await store.dispatch.outbox_lease(lease_request(at=T0 + 1), no_secrets)
    assert len(leased.deliveries) == 1  # the webhook's
    await sql(store, "UPDATE relaybox_outbox SET status = 'sent', updated_at = 0")
    result = await store.partitions.maintain("day", drop=DROP)
    assert result.held[outbox] == "leased"
    assert messages in result.dropped
    await sql(store, "DELETE FROM relaybox_outbox_leases")
    result = await store.partitions.maintain("day", drop=DROP)
    assert outbox in result.dropped and attempts in result.dropped
    for table in SENDING:
        assert await store.fetch_all(f"SELECT 1 FROM {table}") == []
    # the keys outlive their rows: a duplicate publish and a duplicate handler row
    assert not await publish(store, "k1", at=NOW)
    assert await handler_row(store, "h1", at=NOW) is None
    assert await publish(store, "k3", at=NOW)


async def test_a_longer_tenant_age_holds_the_messages(store: Store) -> None:
    assert await publish(store, None, tenant="keeps-long", at=NOW - 60 * DAY)
    await sql(store, f"UPDATE relaybox_outbox SET status = 'sent', updated_at = {NOW - 60 * DAY}")
    await store.partitions.convert("day")
    messages = first(await names(store, "relaybox_messages"), "relaybox_messages")

    def ages(table: str, tenant: str | None, source: str | None) -> float:
        return 90 * DAY if tenant == "keeps-long" else 30 * DAY

    result = await store.partitions.maintain("day", drop=(NOW, ages, lambda t: 30 * DAY))
    assert result.held[messages] == "retention age"
    result = await store.partitions.maintain("day", drop=(NOW + 31 * DAY, ages, lambda t: 0.0))
    assert messages in result.dropped


async def test_a_tenant_erasure_reaches_partitioned_sending_tables(store: Store) -> None:
    assert await publish(store, "k1")
    await sql(store, "UPDATE relaybox_outbox SET status = 'sent'")
    await store.partitions.convert("day")
    assert await publish(store, "k2", at=T0 + 1)  # into the new partitions
    await sql(store, "UPDATE relaybox_outbox SET status = 'sent'")
    erasure_id, _ = await store.erasure.begin(
        actor="dpo", reason="", scope="tenant", digest=None, tenant="t1", now=T0 + 2
    )
    erasure = await store.erasure.get(erasure_id)
    assert erasure is not None
    counts = await store.erasure.erase_batch(erasure, now=T0 + 3, limit=10)
    assert counts["messages"] == 2 and counts["outbox"] == 2
    rows = await store.fetch_all("SELECT body, erased_at FROM relaybox_messages")
    assert all(r["erased_at"] == T0 + 3 for r in rows)
    assert await store.erasure.settle(erasure, now=T0 + 4) == 0


async def test_missing_deliveries_are_found_through_the_keys(store: Store) -> None:
    """Replay missing after a partition of deliveries was dropped: a message whose
    delivery row is gone still has its key, so no second delivery is made."""
    assert await publish(store, None)
    await store.partitions.convert("day")
    async with store.transaction() as conn:
        missing = await store.flow.message_missing_page(
            conn, "t1", "ep_1", since=0, until=NOW, after=None, limit=10
        )
    assert missing == []
    await sql(store, "DELETE FROM relaybox_outbox")  # as a drop of its partition does
    async with store.transaction() as conn:
        missing = await store.flow.message_missing_page(
            conn, "t1", "ep_1", since=0, until=NOW, after=None, limit=10
        )
    assert missing == []


@pytest.mark.parametrize("name", ["outbox_lease", "delivery_insert"])
async def test_the_lease_stays_on_partial_indexes_with_partitions(
    store: Store, pg_url: str, name: str
) -> None:
    """The lease reads the partial indexes of due pending rows of each partition, in
    the generic plan on a filled outbox never analyzed: no partition is scanned."""
    await store.partitions.convert("day")
    queries = load_queries("postgres")
    conn = await asyncpg.connect(_dsn(pg_url))
    try:
        for table in SENDING:
            for part in await names(store, table):
                await conn.execute(f"ALTER TABLE {part} SET (autovacuum_enabled = false)")
        await conn.execute(
            "INSERT INTO relaybox_outbox (channel, key, payload, tenant, status,"
            " next_attempt_at, created_at, updated_at, lane, endpoint_id, message_id)"
            " SELECT 'webhook', 'm' || i || ':ep_1', 'null', 't1',"
            " CASE WHEN i % 10 = 0 THEN 'pending' ELSE 'sent' END, 0, 0, 0, 'ep_1', 'ep_1',"
            " 'm' || i FROM generate_series(1, 20000) AS i"
        )
        await conn.execute(GENERIC_POOL)
        stmt = await conn.prepare(queries[name])
        args = ", ".join(["NULL"] * len(stmt.get_parameters()))
        rows = await conn.fetch(f"EXPLAIN EXECUTE {stmt.get_name()}({args})")
        plan = "\n".join(r[0] for r in rows)
    finally:
        await conn.close()
    assert not re.search(r"Seq Scan on relaybox_outbox_p", plan), plan
    if name == "outbox_lease":
        assert re.search(r"relaybox_outbox_p\d{8}_lane_due", plan), plan


async def test_the_outbox_keys_backfill_copies_old_rows(store: Store) -> None:
    """Rows stored before migration 0034 have no key: until the backfill has copied
    them, the outbox's UNIQUE (channel, key) still decides; the conversion finishes the
    backfill, and the keys alone decide once the rows are gone."""
    for i in range(5):
        assert await handler_row(store, f"h{i}") is not None
    await sql(
        store,
        "DELETE FROM relaybox_outbox_keys",
        "UPDATE relaybox_keys_backfill SET finished_at = NULL, last_id = NULL, rows = 0"
        " WHERE kind = 'outbox'",
    )
    assert await handler_row(store, "h1") is None  # the old UNIQUE decides
    first = await store.keys.backfill("outbox", limit=2)
    assert (first.rows, first.finished, first.read) == (2, False, 2)
    await store.partitions.convert("day")  # the rest of the backfill first
    [state] = [p for p in await store.keys.backfill_status() if p.kind == "outbox"]
    assert (state.rows, state.finished) == (5, True)
    keys = await store.fetch_all("SELECT count(*) AS n FROM relaybox_outbox_keys")
    assert keys[0]["n"] == 5
    await sql(store, "DELETE FROM relaybox_outbox")  # as a drop of its partition does
    for i in range(5):
        assert await handler_row(store, f"h{i}") is None
    assert await handler_row(store, "h5") is not None


async def test_each_live_table_is_attached_without_a_scan(store: Store, pg_url: str) -> None:
    """The validated bound CHECK proves every row fits its first partition: PostgreSQL
    says so (DEBUG1) for each table, messages and their TEXT ids included."""
    assert await publish(store, "k1", at=time.time())
    conn = await asyncpg.connect(_dsn(pg_url))
    said: list[str] = []
    conn.add_log_listener(lambda c, m: said.append(str(m)))
    try:
        await conn.execute("SET client_min_messages = debug1")
        await convert(conn, load_queries("postgres"), "day")
    finally:
        await conn.close()
    implied = {m.split('"')[1] for m in said if "is implied by existing constraints" in m}
    d = time.strftime("%Y%m%d", time.gmtime())
    assert {f"{t}_p{d}" for t in (*RECEIVING, *SENDING)} <= implied, said


async def test_dropped_messages_take_their_subject_index_rows_along(pg_url: str) -> None:
    """The maintenance job, after dropping a partition of messages, deletes the subject
    index's rows of the dropped messages (``retention.batch`` of them a transaction), and
    keeps those of a message still stored."""
    from relaybox import FrozenClock, Relaybox
    from relaybox.config import Settings
    from relaybox.retention import Maintenance
    from relaybox.sources.base import subject_digest

    clock = FrozenClock(T0)
    box = Relaybox(
        settings=Settings(database_url=pg_url, retention={"partitions": "day", "batch": 1}),
        clock=clock,
    )
    try:
        store = box.store
        await store.migrate()
        await store.outbox.endpoint_create(endpoint("ep_1"), "s", quota=5, now=T0)
        alice = subject_digest("cus_alice")
        old = [new_id("msg", T0 + i) for i in range(3)]
        for msg_id in old:
            async with store.transaction() as conn:
                new = NewMessage(msg_id, "t1", "pet.adopted", None, '{"to": "alice"}', T0)
                assert await store.outbox.message_publish(conn, new, ["ep_1"])
                await store.erasure.subject_index(conn, alice, "message", msg_id)
        await sql(store, f"UPDATE relaybox_outbox SET status = 'sent', updated_at = {T0}")
        await store.partitions.convert("day")
        now = T0 + 100 * DAY
        clock.set(now)
        # A message published on the day of the maintenance stays, and its index row
        # (to no endpoint: a delivery would share the first partition of the outbox,
        # made on the database's day, with the old ones, and hold them there).
        recent = new_id("msg", now)
        async with store.transaction() as conn:
            new = NewMessage(recent, "t1", "pet.adopted", None, '{"to": "alice"}', now)
            assert await store.outbox.message_publish(conn, new, [])
            await store.erasure.subject_index(conn, alice, "message", recent)
        assert len(await store.fetch_all("SELECT 1 FROM relaybox_subjects")) == 4
        await Maintenance(box).run_once()
        [kept] = await store.fetch_all("SELECT id FROM relaybox_messages")
        assert kept["id"] == recent
        left = await store.fetch_all("SELECT kind, ref FROM relaybox_subjects")
        assert left == [{"kind": "message", "ref": recent}]
        # Asked again (the next drop): nothing more to forget.
        assert await store.erasure.forget_dropped_messages(limit=10) == 0
        assert await store.erasure.forget_dropped(limit=10) == 0
    finally:
        await box.close()


async def missing_after(store: Store) -> tuple[list[str], int]:
    """Replay missing to ep_1: the messages it finds, and the deliveries it inserts for
    every message still stored."""
    async with store.transaction() as conn:
        page = await store.flow.message_missing_page(
            conn, "t1", "ep_1", since=0, until=NOW * 2, after=None, limit=10
        )
        ids = [r["id"] for r in await store.fetch_all("SELECT id FROM relaybox_messages")]
        inserted = await store.flow.delivery_insert_missing(conn, "ep_1", "t1", ids, now=NOW)
    return [m.id for m in page], inserted


async def test_a_delivery_key_outlives_its_row_while_its_message_lives(store: Store) -> None:
    """The outbox's partition dropped, the message's kept (a longer age): replay
    missing finds no message without its delivery and inserts none, the key (by the
    message's day, migration 0037) still there; a delivery key written before 0037, in
    relaybox_outbox_keys, decides as well."""
    assert await publish(store, None)
    assert await publish(store, None, at=T0 + 1)
    await sql(store, "UPDATE relaybox_outbox SET status = 'sent', updated_at = 0")
    await store.partitions.convert("day")

    def ages(table: str, tenant: str | None, source: str | None) -> float:
        return 120 * DAY if table == "relaybox_messages" else 30 * DAY

    outbox = first(await names(store, "relaybox_outbox"), "relaybox_outbox")
    messages = first(await names(store, "relaybox_messages"), "relaybox_messages")
    result = await store.partitions.maintain("day", drop=(NOW, ages, lambda t: 30 * DAY))
    assert outbox in result.dropped and result.held[messages] == "retention age"
    assert await store.fetch_all("SELECT 1 FROM relaybox_outbox") == []
    days = await store.fetch_all(
        "SELECT k.day, relaybox_message_day(m.id) AS message_day FROM relaybox_delivery_keys k,"
        " relaybox_messages m WHERE k.digest = relaybox_outbox_digest('webhook', m.id || ':ep_1')"
    )
    assert [r["day"] for r in days] == [r["message_day"] for r in days] == [T0 // DAY] * 2
    assert await missing_after(store) == ([], 0)
    # one message's key as written before migration 0037: in the outbox's keys
    await sql(
        store,
        "WITH moved AS (DELETE FROM relaybox_delivery_keys WHERE digest IN (SELECT digest"
        " FROM relaybox_delivery_keys LIMIT 1) RETURNING digest)"
        " INSERT INTO relaybox_outbox_keys (digest, first_seen) SELECT digest, 1 FROM moved",
    )
    assert await missing_after(store) == ([], 0)
    assert await store.fetch_all("SELECT 1 FROM relaybox_outbox") == []


async def test_the_messages_drop_takes_their_delivery_keys_not_the_handlers(
    store: Store,
) -> None:
    """A delivery's key goes with its message: once the messages' partition is dropped,
    the delivery keys' partition of the same days follows (no row deleted one by one);
    a handler row's key stays and still decides."""
    assert await publish(store, "k1")
    assert await handler_row(store, "h1") is not None
    await sql(store, "UPDATE relaybox_outbox SET status = 'sent', updated_at = 0")
    await store.partitions.convert("day")
    keys_part = first(await names(store, "relaybox_delivery_keys"), "relaybox_delivery_keys")
    messages = first(await names(store, "relaybox_messages"), "relaybox_messages")
    assert keys_part.endswith(messages.rsplit("_p", 1)[1])  # the same days
    assert len(await store.fetch_all("SELECT 1 FROM relaybox_delivery_keys")) == 1
    result = await store.partitions.maintain("day", drop=DROP)
    assert messages in result.dropped and keys_part in result.dropped
    assert result.dropped.index(keys_part) > result.dropped.index(messages)
    assert await store.fetch_all("SELECT 1 FROM relaybox_delivery_keys") == []
    outbox_keys = await store.fetch_all("SELECT first_seen FROM relaybox_outbox_keys")
    assert len(outbox_keys) == 1  # the handler row's
    assert await handler_row(store, "h1", at=NOW) is None
    # the idempotency key outlives both
    assert not await publish(store, "k1", at=NOW)


async def test_delivery_keys_wait_for_a_late_message_in_the_default_partition(
    store: Store,
) -> None:
    """A publisher's clock far behind: a message whose id falls in the dropped days
    lands in the messages' DEFAULT partition, its key in the delivery keys' partition of
    its days, which is then kept (the check runs under the DETACH's lock)."""
    assert await publish(store, None)
    await sql(store, "UPDATE relaybox_outbox SET status = 'sent', updated_at = 0")
    await store.partitions.convert("day")
    keys_part = first(await names(store, "relaybox_delivery_keys"), "relaybox_delivery_keys")

    async def publish_late(part: str, step: str) -> None:
        if part.startswith("relaybox_messages_p") and step == "drop":
            assert await publish(store, None, at=T0 - 5 * DAY)

    result = await store.partitions.maintain("day", drop=DROP, before_drop=publish_late)
    assert result.held[keys_part] == "messages in the DEFAULT partition"
    assert keys_part in await names(store, "relaybox_delivery_keys")
    late = await store.fetch_all("SELECT tableoid::regclass::text AS t FROM relaybox_messages")
    assert [r["t"] for r in late] == ["relaybox_messages_default"]
    assert await missing_after(store) == ([], 0)  # its key decides still


async def test_a_side_partitioned_before_0037_has_its_delivery_keys_converted(
    store: Store,
) -> None:
    """Migration 0037 on a database whose sending side is partitioned already: the
    delivery keys' table starts plain, and the next maintenance pass converts it (as a
    conversion left halfway), its first partition past the newest key; publishes go on
    meanwhile, and its keys decide."""
    await store.partitions.convert("day")
    await sql(
        store,
        "DROP TABLE relaybox_delivery_keys",
        "CREATE TABLE relaybox_delivery_keys (day INTEGER NOT NULL, digest UUID NOT NULL,"
        " CONSTRAINT relaybox_delivery_keys_pkey PRIMARY KEY (day, digest))",
    )
    assert "relaybox_delivery_keys" not in await store.partitions.tables()
    now = time.time()
    assert await publish(store, None, at=now)
    result = await store.partitions.maintain("day")
    assert result.converted == ["relaybox_delivery_keys"]
    [bound] = await store.fetch_all(
        "SELECT pg_get_expr(c.relpartbound, c.oid) AS b FROM pg_class c"
        " WHERE c.relname = 'relaybox_delivery_keys_p' || to_char(now(), 'YYYYMMDD')"
    )
    upper = int(re.search(r"TO \((\d+)\)", bound["b"]).group(1))  # type: ignore[union-attr]
    assert upper >= await today(store) + MESSAGES_SLACK  # the messages' slack, at least
    assert await publish(store, None, at=now)
    keys = await store.fetch_all(
        "SELECT tableoid::regclass::text AS part FROM relaybox_delivery_keys"
    )
    assert len(keys) == 2 and all(k["part"] != "relaybox_delivery_keys_default" for k in keys)
    assert await missing_after(store) == ([], 0)
