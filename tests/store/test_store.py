"""Store conformance: every behaviour the rest of relaybox relies on, on SQLite and on a
real PostgreSQL (the ``database_url`` fixture runs each test on both)."""

from __future__ import annotations

import asyncio
import hashlib
import random
import re
import sqlite3
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from relaybox.errors import StoreUnavailable
from relaybox.inbound.accept import Acceptor
from relaybox.store import AcceptOutcome, NewDelivery, Store, open_store
from relaybox.store.backend import _named_blocks, load_migrations, load_queries
from relaybox.store.inbox_rows import NewAttempt, NewOperation
from tests.conftest import _dsn, drop_pg_database, empty_pg_database

T0 = 1_800_000_000.0


def delivery(
    event_id: str,
    body: bytes | str = b'{"n": 1}',
    *,
    source: str = "src",
    account: str = "acct",
    event_type: str = "thing.happened",
    ignored: bool = False,
    at: float = T0,
) -> NewDelivery:
    payload = body.encode() if isinstance(body, str) else body
    return NewDelivery(
        source=source,
        account=account,
        event_id=event_id,
        event_type=event_type,
        tenant="tenant-1",
        fingerprint=hashlib.sha256(payload).digest(),
        payload=payload,
        headers='{"x-test": "1"}',
        version=None,
        received_at=at,
        ignored=ignored,
    )


def statuses(outcomes: Sequence[AcceptOutcome]) -> list[str]:
    return [o.status for o in outcomes]


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    s = open_store(database_url)
    yield s
    await s.close()


@pytest.fixture
async def second_store(database_url: str) -> AsyncIterator[Store]:
    """Another Store on the same database: its own engine, so its own pool."""
    s = open_store(database_url)
    yield s
    await s.close()


async def inbox_rows(store: Store) -> list[dict[str, Any]]:
    return await store.fetch_all("SELECT * FROM relaybox_inbox ORDER BY id")


async def quarantine_rows(store: Store) -> list[dict[str, Any]]:
    return await store.fetch_all("SELECT * FROM relaybox_quarantine ORDER BY id")


async def row(store: Store, inbox_id: int) -> dict[str, Any]:
    [r] = await store.fetch_all(f"SELECT * FROM relaybox_inbox WHERE id = {int(inbox_id)}")
    return r


async def accept_one(store: Store, d: NewDelivery) -> AcceptOutcome:
    [outcome] = await store.inbox.accept([d])
    return outcome


# -- migrations -----------------------------------------------------------------------


async def test_migrate_is_idempotent(store: Store) -> None:
    latest = max(v for v, _, _ in load_migrations(store.backend))
    assert latest >= 1
    assert await store.schema_version() == (latest, latest)
    assert await store.migrate() == []
    assert await store.migrate() == []
    assert await store.schema_version() == (latest, latest)
    versions = await store.fetch_all("SELECT version FROM relaybox_migrations ORDER BY version")
    assert [r["version"] for r in versions] == sorted(
        {v for v, _, _ in load_migrations(store.backend)}
    )


@pytest.fixture(params=["sqlite", "postgres"])
async def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A database on which relaybox never ran (no template, no tables)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh' / 'new.db'}"
        return
    url = await empty_pg_database()
    yield url
    await drop_pg_database(url)


async def test_migrating_a_fresh_database_applies_0001(fresh_url: str) -> None:
    store = open_store(fresh_url)
    try:
        latest = max(v for v, _, _ in load_migrations(store.backend))
        assert await store.schema_version() == (0, latest)
        applied = await store.migrate()
        assert applied[0] == "0001_initial"
        assert len(applied) == len(load_migrations(store.backend))
        assert await store.schema_version() == (latest, latest)
        assert await store.migrate() == []
        # The schema is usable straight away.
        assert statuses(await store.inbox.accept([delivery("e1")])) == ["accepted"]
    finally:
        await store.close()


async def test_concurrent_migrators_apply_each_migration_once(fresh_url: str) -> None:
    stores = [open_store(fresh_url) for _ in range(3)]
    try:
        # Switching a new SQLite file to WAL does not wait for a busy database (see
        # test_sqlite_waits_for_a_writer_while_switching_to_wal): switch it first.
        await stores[0].schema_version()
        results = await asyncio.gather(*(s.migrate() for s in stores))
        applied = [name for names in results for name in names]
        assert sorted(applied) == sorted(
            f"{v:04d}_{n}" for v, n, _ in load_migrations(stores[0].backend)
        )
        latest = max(v for v, _, _ in load_migrations(stores[0].backend))
        assert await stores[0].schema_version() == (latest, latest)
    finally:
        for s in stores:
            await s.close()


async def test_sqlite_event_key_migration_keeps_rows_references_and_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """0019 rebuilds the SQLite inbox with the event key in PostgreSQL's column order:
    every row and column kept, a quarantine entry still pointing at its row, the id
    counter going on past a deleted newest row, one index fewer."""
    path = tmp_path / "old.db"
    url = f"sqlite:///{path}"
    from relaybox.store import base

    every = base.load_migrations
    monkeypatch.setattr(base, "load_migrations", lambda b: [m for m in every(b) if m[0] < 19])
    store = open_store(url)
    try:
        assert "0019_event_key_order" not in await store.migrate()
        # Today's accept writes the trace context column of 0025 (NULL here): the old
        # table gets it for these inserts; 0019's rebuild copies the columns it knows.
        async with store.transaction() as conn:
            await conn.exec_driver_sql("ALTER TABLE relaybox_inbox ADD COLUMN traceparent TEXT")
            # and the event keys of 0027 (dropped below: 0027 makes them, empty)
            await conn.exec_driver_sql(
                "CREATE TABLE relaybox_event_keys (digest BLOB PRIMARY KEY, fingerprint BLOB,"
                " first_seen INTEGER, scope INTEGER, inbox_id INTEGER) WITHOUT ROWID"
            )
        first = await accept_one(store, delivery("e1", b'{"v": 1}'))
        assert (await accept_one(store, delivery("e1", b'{"v": 2}'))).status == "quarantined"
        for n in range(2, 6):
            await accept_one(store, delivery(f"e{n}"))
        before = await store.fetch_all("SELECT * FROM relaybox_inbox ORDER BY id")
    finally:
        await store.close()
    db = sqlite3.connect(path)
    newest = db.execute("SELECT max(id) FROM relaybox_inbox").fetchone()[0]
    db.execute("DELETE FROM relaybox_inbox WHERE id = ?", (newest,))
    db.execute("DROP TABLE relaybox_event_keys")  # the old rows' keys go: 0027 backfills
    db.commit()
    db.close()

    monkeypatch.setattr(base, "load_migrations", every)
    store = open_store(url)
    try:
        assert "0019_event_key_order" in await store.migrate()
        after = await store.fetch_all("SELECT * FROM relaybox_inbox ORDER BY id")
        # Later migrations add columns (0025: erased_at), empty on the rows kept.
        added = {k for r in after for k in r} - {k for r in before for k in r}
        assert all(r[k] is None for r in after for k in added)
        kept = [{k: v for k, v in r.items() if k not in added} for r in after]
        assert kept == [dict(r) for r in before[:-1]]
        assert (await accept_one(store, delivery("e1", b'{"v": 1}'))).status == "duplicate"
        again = await accept_one(store, delivery("e9"))
        assert again.inbox_id > newest  # never the deleted row's id
    finally:
        await store.close()
    db = sqlite3.connect(path)
    try:
        assert db.execute("PRAGMA foreign_key_check").fetchall() == []
        assert db.execute("SELECT inbox_id FROM relaybox_quarantine").fetchall() == [
            (first.inbox_id,)
        ]
        indexes = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
        assert "relaybox_inbox_source_event" not in indexes
        assert "relaybox_inbox_due" in indexes
    finally:
        db.close()


async def test_sqlite_counts_finished_rows_from_their_partial_index(tmp_path: Path) -> None:
    """The stats' count of done and ignored rows reads the partial "finished" index
    (accepted rows enter it only once done), and counts them right."""
    store = open_store(f"sqlite:///{tmp_path / 'counts.db'}")
    try:
        await store.migrate()
        await accept_one(store, delivery("e1"))
        await accept_one(store, delivery("e2", ignored=True))
        sql = load_queries("sqlite")["ops_stats_inbox"]
        first = sql.split("UNION ALL")[0]
    finally:
        await store.close()
    db = sqlite3.connect(tmp_path / "counts.db")
    try:
        plan = " ".join(r[3] for r in db.execute("EXPLAIN QUERY PLAN " + first))
        assert "relaybox_inbox_finished" in plan, plan
        assert db.execute(first).fetchall() == [("src", "ignored", "", 0, 1, None, 0, 0)]
        entries = db.execute(
            "SELECT count(*) FROM relaybox_inbox INDEXED BY relaybox_inbox_finished"
            " WHERE status IN ('done', 'ignored')"
        ).fetchone()
        assert entries == (1,)  # the pending row is not in it
    finally:
        db.close()


# -- accept ---------------------------------------------------------------------------


async def test_accept_outcomes_one_by_one(store: Store) -> None:
    first = await accept_one(store, delivery("e1", b'{"v": 1}'))
    assert first.status == "accepted"

    dup = await accept_one(store, delivery("e1", b'{"v": 1}', at=T0 + 5))
    assert dup == AcceptOutcome("duplicate", first.inbox_id)

    conflict = await accept_one(store, delivery("e1", b'{"v": 2}', at=T0 + 6))
    assert conflict == AcceptOutcome("quarantined", first.inbox_id)

    ignored = await accept_one(store, delivery("e2", ignored=True))
    assert ignored.status == "ignored"
    assert ignored.inbox_id != first.inbox_id

    # The same key under another account or source is another event.
    other_account = await accept_one(store, delivery("e1", b'{"v": 1}', account="acct2"))
    other_source = await accept_one(store, delivery("e1", b'{"v": 1}', source="src2"))
    assert other_account.status == other_source.status == "accepted"

    rows = await inbox_rows(store)
    assert [(r["event_id"], r["account"], r["source"], r["status"]) for r in rows] == [
        ("e1", "acct", "src", "pending"),
        ("e2", "acct", "src", "ignored"),
        ("e1", "acct2", "src", "pending"),
        ("e1", "acct", "src2", "pending"),
    ]
    [q] = await quarantine_rows(store)
    assert q["inbox_id"] == first.inbox_id
    assert bytes(q["payload"]) == b'{"v": 2}'
    assert bytes(q["fingerprint"]) == hashlib.sha256(b'{"v": 2}').digest()
    assert q["received_at"] == T0 + 6
    assert q["resolved_at"] is None

    event = await store.inbox.get(first.inbox_id)
    assert event is not None
    assert event.key == ("src", "acct", "e1")
    assert event.json() == {"v": 1}
    assert event.headers == {"x-test": "1"}
    assert event.attempts == 0
    assert event.tenant == "tenant-1"
    assert await store.inbox.get_by_key("src", "acct", "e1") == event
    assert await store.inbox.get_by_key("src", "acct", "nope") is None
    assert await store.inbox.get(10_000_000) is None

    # An ignored row is deduplicated like any other.
    assert await accept_one(store, delivery("e2", ignored=True)) == AcceptOutcome(
        "duplicate", ignored.inbox_id
    )
    assert await accept_one(store, delivery("e2", b"other", ignored=True)) == AcceptOutcome(
        "quarantined", ignored.inbox_id
    )
    assert (await row(store, ignored.inbox_id))["status"] == "ignored"
    assert len(await quarantine_rows(store)) == 2


async def test_each_row_keeps_its_own_receipt_time(store: Store) -> None:
    """A batch's rows keep the times their requests were received, not the batch's
    (PostgreSQL stored the batch's latest until 2026-12-06, which made every other
    row of the batch look younger than it was), in the accept and in one transaction
    (inline mode)."""
    outcomes = await store.inbox.accept([delivery("r1", at=T0 + 1), delivery("r2", at=T0 + 3)])
    async with store.transaction() as conn:
        more = await store.inbox.insert(conn, [delivery("r3", at=T0 + 2), delivery("r4", at=T0)])
    received = {r["event_id"]: r["received_at"] for r in await inbox_rows(store)}
    assert received == {"r1": T0 + 1, "r2": T0 + 3, "r3": T0 + 2, "r4": T0}
    assert statuses([*outcomes, *more]) == ["accepted"] * 4


async def test_several_copies_of_one_key_inside_one_batch(store: Store) -> None:
    batch = [
        delivery("a", b"1"),
        delivery("a", b"1"),
        delivery("a", b"2"),
        delivery("b", b"1"),
        delivery("a", b"2"),
        delivery("c", b"1", ignored=True),
        delivery("a", b"3"),
        delivery("c", b"1", ignored=True),
        delivery("b", b"9"),
    ]
    outcomes = await store.inbox.accept(batch)
    assert statuses(outcomes) == [
        "accepted",
        "duplicate",
        "quarantined",
        "accepted",
        "quarantined",
        "ignored",
        "quarantined",
        "duplicate",
        "quarantined",
    ]
    ids = {d.event_id: o.inbox_id for d, o in zip(batch, outcomes, strict=True)}
    for d, o in zip(batch, outcomes, strict=True):
        assert o.inbox_id == ids[d.event_id]
    assert len(set(ids.values())) == 3

    rows = await inbox_rows(store)
    assert [(r["event_id"], bytes(r["payload"]), r["status"]) for r in rows] == [
        ("a", b"1", "pending"),
        ("b", b"1", "pending"),
        ("c", b"1", "ignored"),
    ]
    # One quarantine row per distinct conflicting content, however often it came.
    quarantined = sorted((r["event_id"], bytes(r["payload"])) for r in await quarantine_rows(store))
    assert quarantined == [("a", b"2"), ("a", b"3"), ("b", b"9")]


async def test_mixed_batch_against_committed_rows(store: Store) -> None:
    before = await store.inbox.accept(
        [delivery("old", b"x"), delivery("old-ign", b"y", ignored=True)]
    )
    assert statuses(before) == ["accepted", "ignored"]
    old_id, ign_id = before[0].inbox_id, before[1].inbox_id

    batch = [
        delivery("new1", b"n"),
        delivery("old", b"x"),
        delivery("old", b"CHANGED"),
        delivery("new1", b"n"),
        delivery("new2", b"m", ignored=True),
        delivery("old-ign", b"y", ignored=True),
        delivery("new3", b"k"),
        delivery("new3", b"K"),
    ]
    outcomes = await store.inbox.accept(batch)
    assert statuses(outcomes) == [
        "accepted",
        "duplicate",
        "quarantined",
        "duplicate",
        "ignored",
        "duplicate",
        "accepted",
        "quarantined",
    ]
    assert outcomes[1].inbox_id == outcomes[2].inbox_id == old_id
    assert outcomes[5].inbox_id == ign_id
    assert outcomes[0].inbox_id == outcomes[3].inbox_id
    assert outcomes[6].inbox_id == outcomes[7].inbox_id
    assert len({o.inbox_id for o in outcomes}) == 5
    assert len(await inbox_rows(store)) == 5
    assert sorted((r["event_id"], bytes(r["payload"])) for r in await quarantine_rows(store)) == [
        ("new3", b"K"),
        ("old", b"CHANGED"),
    ]


async def test_same_conflicting_content_twice_gives_one_quarantine_row(store: Store) -> None:
    first = await accept_one(store, delivery("e1", b"original"))
    for at in (T0 + 1, T0 + 2):
        outcome = await accept_one(store, delivery("e1", b"conflict", at=at))
        assert outcome == AcceptOutcome("quarantined", first.inbox_id)
    [q] = await quarantine_rows(store)
    assert q["received_at"] == T0 + 1  # the first copy is kept
    # Another conflicting content is another row.
    await accept_one(store, delivery("e1", b"conflict 2"))
    assert len(await quarantine_rows(store)) == 2
    stats = await store.inbox.stats()
    assert stats.quarantined == 2


async def test_original_row_untouched_by_duplicates_and_conflicts(store: Store) -> None:
    first = await accept_one(store, delivery("e1", b'{"original": true}', event_type="a.b"))
    before = await row(store, first.inbox_id)
    await store.inbox.accept(
        [
            delivery("e1", b'{"original": true}', event_type="a.b", at=T0 + 50),
            delivery("e1", b'{"original": false}', event_type="other", at=T0 + 60),
            delivery("e1", b'{"original": true}', ignored=True, at=T0 + 70),
        ]
    )
    await accept_one(store, delivery("e1", b'{"again": 1}', at=T0 + 80))
    assert await row(store, first.inbox_id) == before
    # ... and also when it was already processed.
    async with store.transaction() as conn:
        await store.inbox.complete(conn, [first.inbox_id], T0 + 100)
    done = await row(store, first.inbox_id)
    assert done["status"] == "done"
    await accept_one(store, delivery("e1", b'{"original": true}', at=T0 + 200))
    await accept_one(store, delivery("e1", b'{"late": 1}', at=T0 + 200))
    assert await row(store, first.inbox_id) == done


async def test_a_batch_larger_than_a_statement_keeps_each_keys_first_row(store: Store) -> None:
    """A batch of 100 (SQLite inserts 32 rows a statement): each key's first row in the
    batch is the one stored; a repeat with the same bytes is a duplicate and one with
    other bytes quarantined, whether it shares the first row's statement or not; a key
    stored by an earlier batch keeps its row; an ignored delivery is stored ignored."""
    earlier = await accept_one(store, delivery("k33", "stored before"))
    batch = [delivery(f"k{i:02d}", f"body {i}", ignored=i == 7) for i in range(90)]
    batch[10] = delivery("k01", "body 1")  # same statement as k01, same bytes
    batch[12] = delivery("k02", "other")  # same statement, other bytes
    batch[75] = delivery("k05", "body 5")  # a later statement, same bytes
    batch[80] = delivery("k40", "changed")  # a later statement, other bytes
    batch[33] = delivery("k33", "stored before")  # as stored by the earlier batch
    outcomes = await store.inbox.accept(batch)
    status = {i: o.status for i, o in enumerate(outcomes)}
    replaced = {10, 12, 75, 80, 33}
    first = {d.event_id: outcomes[i].inbox_id for i, d in enumerate(batch) if i not in replaced}
    assert {i for i, s in status.items() if s == "duplicate"} == {10, 33, 75}
    assert {i for i, s in status.items() if s == "quarantined"} == {12, 80}
    assert status[7] == "ignored"
    accepted = {i for i, s in status.items() if s == "accepted"}
    assert accepted == set(range(90)) - replaced - {7}
    assert outcomes[33].inbox_id == earlier.inbox_id
    for i, j in ((10, 1), (12, 2), (75, 5), (80, 40)):
        assert outcomes[i].inbox_id == first[batch[j].event_id]
    rows = await store.fetch_all("SELECT id, event_id, payload, status FROM relaybox_inbox")
    assert len(rows) == 90 - 4  # k10, k12, k75, k80 never stored: their slots held repeats
    by_id = {r["id"]: r for r in rows}
    assert bytes(by_id[first["k02"]]["payload"]) == b"body 2"
    assert bytes(by_id[earlier.inbox_id]["payload"]) == b"stored before"
    assert by_id[outcomes[7].inbox_id]["status"] == "ignored"
    assert len(await store.fetch_all("SELECT id FROM relaybox_quarantine")) == 2


async def test_accept_ids_name_their_rows_across_random_batches(store: Store) -> None:
    """Random batches over a small key space (repeats, conflicting copies, ignored
    ones, batches over a statement's 32 rows), the newest rows deleted between some
    batches (ids then skip: SQLite's AUTOINCREMENT never reuses one): every outcome
    against a model of first-stored-wins, and every id names the row of its key."""
    rng = random.Random(11)
    stored: dict[str, tuple[int, bytes]] = {}  # event id -> (inbox id, body)
    for round_ in range(12):
        batch = []
        for _ in range(rng.choice((1, 5, 31, 32, 33, 70))):
            key = f"k{rng.randrange(120)}"
            body = f"{key}-{rng.randrange(3)}".encode()
            batch.append(delivery(key, body, ignored=rng.random() < 0.1))
        outcomes = await store.inbox.accept(batch)
        rows = {r["id"]: r for r in await inbox_rows(store)}
        for d, o in zip(batch, outcomes, strict=True):
            assert rows[o.inbox_id]["event_id"] == d.event_id, (round_, d.event_id)
            if d.event_id not in stored:
                assert o.status == ("ignored" if d.ignored else "accepted")
                stored[d.event_id] = (o.inbox_id, d.payload)
                continue
            inbox_id, body = stored[d.event_id]
            assert o.inbox_id == inbox_id
            assert o.status == ("duplicate" if body == d.payload else "quarantined")
        if round_ % 4 == 1:  # the newest rows go: the next ids skip theirs
            newest = sorted(rows)[-3:]
            async with store.transaction() as conn:
                for inbox_id in newest:
                    await conn.exec_driver_sql(
                        "DELETE FROM relaybox_quarantine WHERE inbox_id = " + str(inbox_id)
                    )
                    await conn.exec_driver_sql(
                        "DELETE FROM relaybox_inbox WHERE id = " + str(inbox_id)
                    )
                    # and their keys, as an expiry would: the keys table decides
                    await conn.exec_driver_sql(
                        "DELETE FROM relaybox_event_keys WHERE inbox_id = " + str(inbox_id)
                    )
            for key in [k for k, (i, _) in stored.items() if i in newest]:
                del stored[key]
            fresh = [delivery(f"fresh{round_}-{i}") for i in range(40)]  # new keys only
            outcomes = await store.inbox.accept(fresh)
            rows = {r["id"]: r for r in await inbox_rows(store)}
            assert all(o.inbox_id not in newest for o in outcomes)
            for d, o in zip(fresh, outcomes, strict=True):
                assert (o.status, rows[o.inbox_id]["event_id"]) == ("accepted", d.event_id)


async def _accept_concurrently(
    stores: Sequence[Store], *, tasks: int, keys: int, per_batch: int, same_order: bool
) -> None:
    """Batches with overlapping keys (and a conflicting copy) from concurrent tasks:
    exactly one row per key, exactly one ``accepted`` per key, one quarantine row per
    distinct conflicting content."""
    names = [f"k{i:02d}" for i in range(keys)]
    rng = random.Random(7)

    async def one_task(n: int) -> list[tuple[str, AcceptOutcome]]:
        chosen = rng.sample(names, per_batch)
        if same_order:
            chosen.sort()
        batch = [delivery(k, f"body-{k}") for k in chosen]
        if n % 3 == 0:
            batch.append(delivery(chosen[0], "conflicting"))
        s = stores[n % len(stores)]
        return list(zip([d.event_id for d in batch], await s.inbox.accept(batch), strict=True))

    running = [asyncio.create_task(one_task(n)) for n in range(tasks)]
    try:
        results = await asyncio.wait_for(asyncio.gather(*running), 30)
    except Exception:
        for task in running:  # do not leave batches running into the teardown
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        raise
    by_key: dict[str, list[AcceptOutcome]] = {}
    for pairs in results:
        for key, outcome in pairs:
            by_key.setdefault(key, []).append(outcome)
    rows = await inbox_rows(stores[0])
    assert sorted(r["event_id"] for r in rows) == sorted(by_key)  # exactly one row per key
    ids = {r["event_id"]: r["id"] for r in rows}
    for key, outcomes in by_key.items():
        assert all(o.inbox_id == ids[key] for o in outcomes), key
        counts = Counter(statuses(outcomes))
        assert counts["accepted"] == 1, (key, counts)
        assert set(counts) <= {"accepted", "duplicate", "quarantined"}
    assert all(bytes(r["payload"]) == f"body-{r['event_id']}".encode() for r in rows)
    quarantined = Counter(r["inbox_id"] for r in await quarantine_rows(stores[0]))
    assert all(n == 1 for n in quarantined.values()), quarantined


async def test_concurrent_accepts_with_overlapping_keys(store: Store) -> None:
    await _accept_concurrently([store], tasks=12, keys=30, per_batch=12, same_order=True)


async def test_concurrent_accepts_from_two_store_instances(
    store: Store, second_store: Store
) -> None:
    """Two engines: two pools on PostgreSQL, two connections contending for the write
    lock on SQLite."""
    await _accept_concurrently(
        [store, second_store], tasks=16, keys=40, per_batch=15, same_order=True
    )


@pytest.mark.parametrize("two_stores", [False, True], ids=["one-store", "two-stores"])
async def test_concurrent_accepts_in_different_key_orders(
    store: Store, second_store: Store, two_stores: bool
) -> None:
    stores = [store, second_store] if two_stores else [store]
    await _accept_concurrently(stores, tasks=16, keys=30, per_batch=20, same_order=False)


# -- claim ----------------------------------------------------------------------------


async def test_claim_counts_attempts_holds_and_skips_rows_not_due(store: Store) -> None:
    a = await accept_one(store, delivery("a", at=T0))
    b = await accept_one(store, delivery("b", at=T0 + 10))
    await accept_one(store, delivery("ignored", at=T0, ignored=True))

    nothing = await store.inbox.claim(now=T0 - 1, limit=10, max_attempts=5, hold=30)
    assert nothing.ids == [] and nothing.exhausted == []

    first = await store.inbox.claim(now=T0 + 1, limit=10, max_attempts=5, hold=30)
    assert first.ids == [a.inbox_id]  # b is not due yet, the ignored row never is
    r = await row(store, a.inbox_id)
    assert r["attempts"] == 0  # claimed, not started: a crash now charges nothing
    assert r["next_attempt_at"] == T0 + 1 + 30
    assert r["status"] == "pending"
    assert await store.inbox.start(first.ids, T0 + 1) == {a.inbox_id: 1}
    assert (await row(store, a.inbox_id))["started_at"] == T0 + 1

    # Held back: not claimed again before the hold runs out (a worker may hold it).
    held = await store.inbox.claim(now=T0 + 20, limit=10, max_attempts=5, hold=30)
    assert held.ids == [b.inbox_id]
    await store.inbox.start(held.ids, T0 + 20)
    assert (await store.inbox.claim(now=T0 + 30, limit=10, max_attempts=5, hold=30)).ids == []

    # a started and never recorded an outcome (its worker died): it comes back as a
    # suspect, to run alone; its attempts are counted when it starts again.
    again = await store.inbox.claim(now=T0 + 31, limit=10, max_attempts=5, hold=30)
    assert (again.ids, again.suspects) == ([], [a.inbox_id])
    assert await store.inbox.start(again.suspects, T0 + 31) == {a.inbox_id: 2}
    assert (await row(store, b.inbox_id))["attempts"] == 1
    # Recording an outcome clears the mark: a retried row is not a suspect.
    async with store.transaction() as conn:
        await store.inbox.retry_later(conn, a.inbox_id, at=T0 + 40, error="x", now=T0 + 32)
    retried = await store.inbox.claim(now=T0 + 40, limit=10, max_attempts=5, hold=30)
    assert (retried.ids, retried.suspects) == ([a.inbox_id], [])


async def test_claim_counts_the_attempts_of_the_rows_it_starts(store: Store) -> None:
    """``start``: the first rows by due time, suspects excepted, are started by the
    claim itself (PostgreSQL; SQLite's worker runs a claim as one batch and counts
    none here); the rest are counted when they start."""
    ids = [(await accept_one(store, delivery(f"e{i}", at=T0 + i))).inbox_id for i in range(4)]
    suspect = await accept_one(store, delivery("suspect", at=T0 - 10))
    await store.inbox.claim(now=T0 - 5, limit=1, max_attempts=5, hold=1)
    await store.inbox.start([suspect.inbox_id], T0 - 5)  # its worker died in the handler

    claim = await store.inbox.claim(now=T0 + 100, limit=10, max_attempts=5, hold=30, start=2)
    assert (claim.ids, claim.suspects) == (ids, [suspect.inbox_id])
    counted = set(ids[:2]) if store.db.groups else set()
    assert claim.started == counted
    for inbox_id in ids:
        r = await row(store, inbox_id)
        started = inbox_id in counted
        assert (r["attempts"], r["started_at"]) == ((1, T0 + 100) if started else (0, None))
        assert claim.events[inbox_id].attempts == r["attempts"]
    assert (await row(store, suspect.inbox_id))["attempts"] == 1  # a suspect: not counted
    # The rest start as usual; a row the claim started is not counted twice.
    assert await store.inbox.start(ids[2:], T0 + 101) == {i: 1 for i in ids[2:]}


async def test_claim_respects_limit_and_due_order(store: Store) -> None:
    ids = [(await accept_one(store, delivery(f"e{i}", at=T0 + i))).inbox_id for i in range(5)]
    claim = await store.inbox.claim(now=T0 + 100, limit=2, max_attempts=5, hold=30)
    assert claim.ids == ids[:2]
    claim = await store.inbox.claim(now=T0 + 100, limit=2, max_attempts=5, hold=30)
    assert claim.ids == ids[2:4]
    claim = await store.inbox.claim(now=T0 + 100, limit=2, max_attempts=5, hold=30)
    assert claim.ids == ids[4:]


async def test_claim_dead_letters_exhausted_rows(store: Store) -> None:
    poison = await accept_one(store, delivery("poison", at=T0))
    now = T0
    for attempt in (1, 2):
        claim = await store.inbox.claim(now=now, limit=10, max_attempts=2, hold=30)
        assert claim.ids + claim.suspects == [poison.inbox_id]
        assert await store.inbox.start([poison.inbox_id], now) == {poison.inbox_id: attempt}
        now += 30  # the worker died each time: the hold ran out
    fresh = await accept_one(store, delivery("fresh", at=T0))

    # Not yet due: the exhausted row is left alone until its hold runs out.
    early = await store.inbox.claim(now=now - 1, limit=10, max_attempts=2, hold=30)
    assert early.exhausted == [] and early.ids == [fresh.inbox_id]

    claim = await store.inbox.claim(now=now, limit=10, max_attempts=2, hold=30)
    assert claim.ids == []
    assert claim.exhausted == [(poison.inbox_id, "src", "acct", "poison", 2)]
    r = await row(store, poison.inbox_id)
    assert r["status"] == "dead"
    assert r["dead_reason"] == "exhausted"
    assert r["attempts"] == 2
    assert "did not finish" in r["last_error"]
    # Dead is final: never claimed nor exhausted again.
    later = await store.inbox.claim(now=now + 1000, limit=10, max_attempts=2, hold=30)
    assert poison.inbox_id not in later.ids
    assert later.exhausted == []
    stats = await store.inbox.stats()
    assert stats.dead_exhausted == 1 and stats.dead == 1


async def test_lock_returns_only_pending_rows(store: Store) -> None:
    a = await accept_one(store, delivery("a"))
    b = await accept_one(store, delivery("b"))
    c = await accept_one(store, delivery("c", ignored=True))
    async with store.transaction() as conn:
        await store.inbox.complete(conn, [b.inbox_id], T0)
    async with store.transaction() as conn:
        events = await store.inbox.lock(conn, [c.inbox_id, b.inbox_id, a.inbox_id])
    assert [e.id for e in events] == [a.inbox_id]
    assert events[0].json() == {"n": 1}


async def test_pg_accept_probes_the_event_key_even_without_statistics(pg_url: str) -> None:
    """A young inbox has no statistics, and the plan PostgreSQL caches then is kept
    until autovacuum analyzes it. The accept statement and the existing-key lookup
    must probe the event key per key in that plan, never scan the inbox."""
    store = open_store(pg_url)
    try:
        conn = await asyncpg.connect(_dsn(pg_url))
        try:
            await conn.execute("SET plan_cache_mode = force_generic_plan")
            for name, args in [
                (
                    "inbox_accept_fast",
                    "'{a}','{b}','{c}','{d}',NULL,'{}','{}','{}','{}','{x}','{1}',NULL,1,NULL,"
                    "'{\\\\x00}','{1}','{1}'",
                ),
                ("event_keys_get", "'{\\\\x00}'"),
            ]:
                stmt = await conn.prepare(store.db.q[name])
                plan = "\n".join(
                    r[0] for r in await conn.fetch(f"EXPLAIN EXECUTE {stmt.get_name()}({args})")
                )
                assert "Index Scan using relaybox_event_keys_pkey" in plan, plan
                assert "Seq Scan on relaybox_event_keys" not in plan, plan
                assert "Seq Scan on relaybox_inbox" not in plan, plan
        finally:
            await conn.close()
    finally:
        await store.close()


async def test_pg_accept_resolves_a_key_committed_while_it_waited(pg_url: str) -> None:
    """The one-statement accept returns inserted rows and rows that existed before it
    began. A key another transaction commits while the statement waits on it (ON
    CONFLICT) is in neither: the store looks it up again, and classifies it."""
    first, second = open_store(pg_url), open_store(pg_url)
    try:
        racer, same, other = delivery("race"), delivery("race"), delivery("race", body=b"{}")
        inserted = asyncio.Event()
        release = asyncio.Event()

        async def insert_uncommitted() -> None:
            async with second.transaction() as conn:
                await second.inbox.insert(conn, [racer])
                inserted.set()
                await release.wait()

        holder = asyncio.create_task(insert_uncommitted())
        await asyncio.wait_for(inserted.wait(), 5)
        waiting = asyncio.create_task(first.inbox.accept([same, other, delivery("fresh")]))
        await asyncio.sleep(0.3)
        assert not waiting.done()  # blocked on the uncommitted key
        release.set()
        await holder
        outcomes = await asyncio.wait_for(waiting, 5)
        assert statuses(outcomes) == ["duplicate", "quarantined", "accepted"]
        assert len(await quarantine_rows(first)) == 1
        assert len(await inbox_rows(first)) == 2
    finally:
        await first.close()
        await second.close()


async def test_pg_claim_skips_rows_locked_by_another_store(pg_url: str) -> None:
    first, second = open_store(pg_url), open_store(pg_url)
    try:
        ids = [(await accept_one(first, delivery(f"e{i}"))).inbox_id for i in range(6)]
        locked = asyncio.Event()
        release = asyncio.Event()

        async def hold_rows() -> list[int]:
            async with second.transaction() as conn:
                events = await second.inbox.lock(conn, ids[:3])
                locked.set()
                await release.wait()
            return [e.id for e in events]

        holder = asyncio.create_task(hold_rows())
        await asyncio.wait_for(locked.wait(), 5)
        claim = await asyncio.wait_for(
            first.inbox.claim(now=T0 + 1, limit=10, max_attempts=5, hold=30), 5
        )
        assert claim.ids == ids[3:]
        # Locked rows are also passed over by a second lock (a late worker).
        async with first.transaction() as conn:
            assert [e.id for e in await first.inbox.lock(conn, ids)] == ids[3:]
        release.set()
        assert await holder == ids[:3]
        claim = await first.inbox.claim(now=T0 + 1, limit=10, max_attempts=5, hold=30)
        assert claim.ids == ids[:3]
    finally:
        await first.close()
        await second.close()


async def test_pg_concurrent_claims_never_return_the_same_row(pg_url: str) -> None:
    stores = [open_store(pg_url), open_store(pg_url)]
    try:
        await stores[0].inbox.accept([delivery(f"e{i}") for i in range(120)])
        claims = await asyncio.gather(
            *(
                stores[n % 2].inbox.claim(now=T0 + 1, limit=7, max_attempts=5, hold=30)
                for n in range(24)
            )
        )
        claimed = [i for c in claims for i in c.ids]
        assert len(claimed) == len(set(claimed))
        assert len(claimed) <= 120
        rows = await inbox_rows(stores[0])
        held = {r["id"] for r in rows if r["next_attempt_at"] == T0 + 1 + 30}
        assert held == set(claimed)  # every claimed row is held, no other row is
    finally:
        for s in stores:
            await s.close()


# -- complete / retry / kill ------------------------------------------------------------


async def test_complete_retry_and_kill_only_touch_pending_rows(store: Store) -> None:
    done = (await accept_one(store, delivery("done"))).inbox_id
    dead = (await accept_one(store, delivery("dead"))).inbox_id
    ignored = (await accept_one(store, delivery("ignored", ignored=True))).inbox_id
    pending = (await accept_one(store, delivery("pending"))).inbox_id

    async with store.transaction() as conn:
        await store.inbox.complete(conn, [done], T0 + 1)
        await store.inbox.kill(conn, dead, reason="invalid", error="bad input", now=T0 + 2)
    snapshot = {i: await row(store, i) for i in (done, dead, ignored)}
    assert snapshot[done]["status"] == "done" and snapshot[done]["done_at"] == T0 + 1
    assert snapshot[dead]["status"] == "dead" and snapshot[dead]["dead_reason"] == "invalid"
    assert snapshot[dead]["last_error"] == "bad input"

    async with store.transaction() as conn:
        # A late worker must not overwrite what another one already decided.
        await store.inbox.complete(conn, [done, dead, ignored], T0 + 50)
        for i in (done, dead, ignored):
            await store.inbox.retry_later(conn, i, at=T0 + 500, error="late", now=T0 + 50)
            await store.inbox.kill(conn, i, reason="expired", error="late", now=T0 + 50)
    assert {i: await row(store, i) for i in (done, dead, ignored)} == snapshot

    async with store.transaction() as conn:
        await store.inbox.retry_later(conn, pending, at=T0 + 90, error="boom", now=T0 + 3)
    r = await row(store, pending)
    assert (r["status"], r["next_attempt_at"], r["last_error"], r["updated_at"]) == (
        "pending",
        T0 + 90,
        "boom",
        T0 + 3,
    )
    async with store.transaction() as conn:
        await store.inbox.complete(conn, [pending], T0 + 4)
    r = await row(store, pending)
    assert (r["status"], r["done_at"]) == ("done", T0 + 4)

    other = (await accept_one(store, delivery("other"))).inbox_id
    async with store.transaction() as conn:
        await store.inbox.kill(conn, other, reason="expired", error="too old", now=T0 + 5)
    r = await row(store, other)
    assert (r["status"], r["dead_reason"], r["last_error"]) == ("dead", "expired", "too old")

    # A transaction that fails after completing leaves the row pending.
    a = (await accept_one(store, delivery("a"))).inbox_id
    with pytest.raises(RuntimeError):
        async with store.transaction() as conn:
            await store.inbox.complete(conn, [a], T0)
            raise RuntimeError("handler failed after completing")
    assert (await row(store, a))["status"] == "pending"

    # Finished attempts are recorded apart.
    async with store.transaction() as conn:
        await store.inbox.attempt_insert(
            conn,
            NewAttempt(
                inbox_id=a,
                attempt=1,
                outcome="retry",
                error="boom",
                worker="w1",
                started_at=T0,
                finished_at=T0 + 0.5,
            ),
        )
    [r] = await store.fetch_all("SELECT * FROM relaybox_inbox_attempts")
    assert (r["inbox_id"], r["attempt"], r["outcome"], r["error"], r["worker"]) == (
        a,
        1,
        "retry",
        "boom",
        "w1",
    )


# -- operations and outbox ------------------------------------------------------------------


async def test_operation_insert_first_then_existing(store: Store) -> None:
    async with store.transaction() as conn:
        first = await store.inbox.operation_insert(
            conn,
            NewOperation(
                business_key="k1", fingerprint="fp-a", inbox_id=None, source="s", tenant="t", now=T0
            ),
        )
        again = await store.inbox.operation_insert(
            conn,
            NewOperation(
                business_key="k1", fingerprint="fp-b", inbox_id=None, source="s", tenant="t", now=T0
            ),
        )
    assert first == (True, "fp-a")
    assert again == (False, "fp-a")
    async with store.transaction() as conn:
        later = await store.inbox.operation_insert(
            conn,
            NewOperation(
                business_key="k1",
                fingerprint="fp-a",
                inbox_id=7,
                source=None,
                tenant=None,
                now=T0 + 1,
            ),
        )
    assert later == (False, "fp-a")
    [r] = await store.fetch_all("SELECT * FROM relaybox_operations")
    assert (r["business_key"], r["fingerprint"], r["source"], r["created_at"]) == (
        "k1",
        "fp-a",
        "s",
        T0,
    )

    # A business key whose transaction rolled back never happened.
    with pytest.raises(RuntimeError):
        async with store.transaction() as conn:
            await store.inbox.operation_insert(
                conn,
                NewOperation(
                    business_key="k",
                    fingerprint="a",
                    inbox_id=None,
                    source=None,
                    tenant=None,
                    now=T0,
                ),
            )
            raise RuntimeError
    async with store.transaction() as conn:
        assert await store.inbox.operation_insert(
            conn,
            NewOperation(
                business_key="k", fingerprint="b", inbox_id=None, source=None, tenant=None, now=T0
            ),
        ) == (True, "b")


async def test_operation_insert_concurrent_transactions_exactly_one_created(
    store: Store, second_store: Store
) -> None:
    """The first transaction stays open while the second inserts the same key: the
    second waits for the COMMIT and then sees the stored fingerprint."""
    inserted = asyncio.Event()

    async def first() -> tuple[bool, str]:
        async with store.transaction() as conn:
            result = await store.inbox.operation_insert(
                conn,
                NewOperation(
                    business_key="order-1",
                    fingerprint="fp-first",
                    inbox_id=None,
                    source=None,
                    tenant=None,
                    now=T0,
                ),
            )
            inserted.set()
            await asyncio.sleep(0.2)
        return result

    async def second() -> tuple[bool, str]:
        await inserted.wait()
        async with second_store.transaction() as conn:
            return await second_store.inbox.operation_insert(
                conn,
                NewOperation(
                    business_key="order-1",
                    fingerprint="fp-second",
                    inbox_id=None,
                    source=None,
                    tenant=None,
                    now=T0,
                ),
            )

    a, b = await asyncio.wait_for(asyncio.gather(first(), second()), 20)
    assert a == (True, "fp-first")
    assert b == (False, "fp-first")


async def test_operation_insert_many_concurrent_callers(store: Store, second_store: Store) -> None:
    async def attempt(n: int) -> tuple[bool, str]:
        s = store if n % 2 else second_store
        async with s.transaction() as conn:
            return await s.inbox.operation_insert(
                conn,
                NewOperation(
                    business_key="shared",
                    fingerprint=f"fp-{n}",
                    inbox_id=None,
                    source=None,
                    tenant=None,
                    now=T0,
                ),
            )

    results = await asyncio.wait_for(asyncio.gather(*(attempt(n) for n in range(10))), 30)
    created = [fp for ok, fp in results if ok]
    assert len(created) == 1
    assert all(fp == created[0] for _, fp in results)


async def test_outbox_insert_unique_per_channel_and_key(store: Store) -> None:
    async with store.transaction() as conn:
        first = await store.inbox.outbox_insert(
            conn,
            channel="email",
            key="welcome:1",
            payload="{}",
            tenant="t",
            inbox_id=None,
            now=T0,
        )
        again = await store.inbox.outbox_insert(
            conn,
            channel="email",
            key="welcome:1",
            payload='{"other": 1}',
            tenant="t",
            inbox_id=None,
            now=T0 + 1,
        )
        other_channel = await store.inbox.outbox_insert(
            conn,
            channel="slack",
            key="welcome:1",
            payload="{}",
            tenant=None,
            inbox_id=None,
            now=T0,
        )
    assert isinstance(first, int)
    assert again is None
    assert isinstance(other_channel, int) and other_channel != first
    rows = await store.fetch_all("SELECT * FROM relaybox_outbox ORDER BY id")
    assert [(r["channel"], r["key"], r["payload"], r["status"]) for r in rows] == [
        ("email", "welcome:1", "{}", "pending"),
        ("slack", "welcome:1", "{}", "pending"),
    ]
    async with store.transaction() as conn:
        assert (
            await store.inbox.outbox_insert(
                conn,
                channel="email",
                key="welcome:1",
                payload="{}",
                tenant=None,
                inbox_id=None,
                now=T0 + 2,
            )
            is None
        )


# -- stats ----------------------------------------------------------------------------


async def test_stats_counts_each_status(store: Store) -> None:
    s = await store.inbox.stats()
    assert (s.pending, s.done, s.ignored, s.dead, s.quarantined) == (0, 0, 0, 0, 0)
    assert s.oldest_pending_at is None

    ids = {}
    for name, at in [
        ("p1", T0 + 20),
        ("p2", T0 + 10),
        ("done", T0),
        ("invalid", T0),
        ("expired", T0),
        ("poison", T0 + 1),
    ]:
        ids[name] = (await accept_one(store, delivery(name, at=at))).inbox_id
    await accept_one(store, delivery("ign", ignored=True, at=T0 - 100))
    await accept_one(store, delivery("p1", b"conflict"))
    async with store.transaction() as conn:
        await store.inbox.complete(conn, [ids["done"]], T0)
        await store.inbox.kill(conn, ids["invalid"], reason="invalid", error="x", now=T0)
        await store.inbox.kill(conn, ids["expired"], reason="expired", error="x", now=T0)
    # Only "poison" is due at T0 + 1 (p1 and p2 later): it uses its one attempt, then
    # is dead-lettered as exhausted once the hold runs out.
    assert (await store.inbox.claim(now=T0 + 1, limit=10, max_attempts=1, hold=1)).ids == [
        ids["poison"]
    ]
    await store.inbox.start([ids["poison"]], T0 + 1)
    exhausted = await store.inbox.claim(now=T0 + 2, limit=10, max_attempts=1, hold=1)
    assert [e[0] for e in exhausted.exhausted] == [ids["poison"]]

    s = await store.inbox.stats()
    assert s.pending == 2
    assert s.oldest_pending_at == T0 + 10
    assert s.done == 1
    assert s.ignored == 1
    assert (s.dead_invalid, s.dead_exhausted, s.dead_other, s.dead) == (1, 1, 1, 3)
    assert s.quarantined == 1


# -- group commit ---------------------------------------------------------------------


class CountingStore:
    """Wraps ``store.inbox.accept`` to count batches (and optionally fail or stall)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.batches: list[int] = []
        self.fail: BaseException | None = None
        self.stall = False
        self.delays: list[float] = []  # seconds the next batches take first, in order
        self.started = asyncio.Event()  # set when a batch's commit starts
        self._original = store.inbox.accept

    async def inbox_accept(self, batch: Sequence[NewDelivery]) -> list[AcceptOutcome]:
        self.batches.append(len(batch))
        self.started.set()
        if self.stall:
            await asyncio.sleep(3600)
        if self.delays:
            await asyncio.sleep(self.delays.pop(0))
        if self.fail is not None:
            raise self.fail
        return await self._original(batch)


@pytest.fixture
def counting(store: Store, monkeypatch: pytest.MonkeyPatch) -> CountingStore:
    wrapper = CountingStore(store)
    monkeypatch.setattr(store.inbox, "accept", wrapper.inbox_accept)
    return wrapper


async def test_acceptor_group_commit(store: Store, counting: CountingStore) -> None:
    acceptor = Acceptor(store)
    try:
        deliveries = [delivery(f"e{i}", f"b{i}") for i in range(190)]
        deliveries += [delivery(f"e{i}", f"b{i}") for i in range(5)]  # duplicates
        deliveries += [delivery(f"e{i}", "other") for i in range(5, 10)]  # conflicts
        assert len(deliveries) == 200
        outcomes = await asyncio.gather(*(acceptor.accept(d) for d in deliveries))
    finally:
        await acceptor.close()
    assert len(outcomes) == 200
    assert sum(counting.batches) == 200
    assert len(counting.batches) < 200 // 4, counting.batches
    by_id = {r["event_id"]: r["id"] for r in await inbox_rows(store)}
    assert len(by_id) == 190
    for d, o in zip(deliveries, outcomes, strict=True):
        assert o.inbox_id == by_id[d.event_id]
    counts = Counter(statuses(outcomes))
    assert counts["accepted"] == 190
    # Each copy after the first is a duplicate or a quarantine, whichever batch it fell in.
    assert counts["duplicate"] == 5 and counts["quarantined"] == 5


async def test_acceptor_store_error_fails_every_waiting_future(
    store: Store, counting: CountingStore
) -> None:
    acceptor = Acceptor(store)
    try:
        counting.fail = ConnectionRefusedError("database went away")
        results = await asyncio.gather(
            *(acceptor.accept(delivery(f"e{i}")) for i in range(50)), return_exceptions=True
        )
        assert len(results) == 50
        assert all(isinstance(r, StoreUnavailable) for r in results), results
        assert len(counting.batches) < 50
        assert await inbox_rows(store) == []

        # The committer survives a failed batch: the sender's retry is accepted.
        counting.fail = None
        assert (await acceptor.accept(delivery("e1"))).status == "accepted"
    finally:
        await acceptor.close()


async def test_acceptor_commit_that_never_answers_is_unavailable(
    store: Store, counting: CountingStore
) -> None:
    acceptor = Acceptor(store, timeout=0.3)
    counting.stall = True
    try:
        results = await asyncio.gather(
            *(acceptor.accept(delivery(f"e{i}")) for i in range(5)), return_exceptions=True
        )
        assert all(isinstance(r, StoreUnavailable) for r in results), results
    finally:
        await acceptor.close()


async def test_acceptor_answers_requests_queued_behind_a_commit_that_never_answers(
    store: Store, counting: CountingStore
) -> None:
    """One committer, stuck in a commit: the request in its batch and the one queued
    behind it both get StoreUnavailable once they have waited ``timeout`` (give or take
    the quarter the watch sleeps), not whenever the commit returns."""
    acceptor = Acceptor(store, committers=1, timeout=0.4)
    counting.stall = True
    try:
        started = time.monotonic()
        first = asyncio.ensure_future(acceptor.accept(delivery("e0")))
        await counting.started.wait()  # the committer took it: its commit is in flight
        second = asyncio.ensure_future(acceptor.accept(delivery("e1")))
        results = await asyncio.wait_for(asyncio.gather(first, second, return_exceptions=True), 5)
        assert all(isinstance(r, StoreUnavailable) for r in results), results
        assert "in time" in str(results[1])
        assert 0.4 <= time.monotonic() - started < 1.0
    finally:
        await acceptor.close()


async def test_acceptor_rows_queued_behind_a_commit_share_the_next(
    store: Store, counting: CountingStore
) -> None:
    """Beside a commit in flight, a few queued rows wait for it and go out together in
    the next commit (with 3 committers they had each taken a commit of their own)."""
    acceptor = Acceptor(store, committers=3, parallel_at=32, patience=5.0)
    counting.delays = [0.3]
    try:
        first = asyncio.ensure_future(acceptor.accept(delivery("e0")))
        await counting.started.wait()  # the committer took it: its commit is in flight
        rest = [asyncio.ensure_future(acceptor.accept(delivery(f"e{i}"))) for i in range(1, 6)]
        for _ in range(3):
            await asyncio.sleep(0.01)
            rest.append(asyncio.ensure_future(acceptor.accept(delivery(f"e{len(rest) + 1}"))))
        outcomes = await asyncio.wait_for(asyncio.gather(first, *rest), 5)
    finally:
        await acceptor.close()
    assert counting.batches == [1, 8]
    assert {o.status for o in outcomes} == {"accepted"}
    assert len(await inbox_rows(store)) == 9


async def test_acceptor_enough_queued_rows_commit_beside_one_in_flight(
    store: Store, counting: CountingStore
) -> None:
    """``parallel_at`` queued rows do not wait for the commit in flight."""
    acceptor = Acceptor(store, committers=3, parallel_at=4, patience=5.0)
    counting.delays = [1.0]
    try:
        first = asyncio.ensure_future(acceptor.accept(delivery("e0")))
        await counting.started.wait()
        started = time.monotonic()
        rest = await asyncio.wait_for(
            asyncio.gather(*(acceptor.accept(delivery(f"e{i}")) for i in range(1, 5))), 5
        )
        assert time.monotonic() - started < 0.5  # not after the first commit's second
        assert not first.done()
        assert (await first).status == "accepted"
    finally:
        await acceptor.close()
    assert counting.batches == [1, 4]
    assert {o.status for o in rest} == {"accepted"}


async def test_acceptor_commit_stuck_on_one_connection_holds_the_others_back_briefly(
    store: Store, counting: CountingStore
) -> None:
    """A commit that does not answer: after ``patience`` the next rows get a commit
    beside it, long before the accept timeout."""
    acceptor = Acceptor(store, committers=3, patience=0.1, timeout=10.0)
    counting.stall = True
    try:
        stuck = asyncio.ensure_future(acceptor.accept(delivery("e0")))
        await counting.started.wait()
        counting.stall = False  # only the first batch hangs
        started = time.monotonic()
        outcome = await asyncio.wait_for(acceptor.accept(delivery("e1")), 5)
        waited = time.monotonic() - started
        assert outcome.status == "accepted"
        assert 0.04 <= waited < 1.0, waited  # the patience (0.1 s), not the 10 s timeout
        assert not stuck.done()
    finally:
        await acceptor.close()
    with pytest.raises(StoreUnavailable):
        await stuck


# -- named queries and connection settings ------------------------------------------------

_SRC = Path(__file__).resolve().parents[2] / "src" / "relaybox"
_BACKENDS = ("sqlite", "postgres")
# How code names a query: store.db.q["name"] (or a local q = store.db.q), store.db.rows(conn,
# "name") / store.db.first(conn, "name"), and helpers taking (conn, store, "name").
_USES = (
    re.compile(r"""\bq\[\s*(["'])(\w+)\1\s*\]"""),
    re.compile(r"""\b(?:rows|first)\(\s*[\w.]+\s*,\s*(["'])(\w+)\1"""),
    re.compile(r"""\b(?:rows|first)\(\s*[\w.]+\s*,\s*[\w.]+\s*,\s*(["'])(\w+)\1"""),
    # store/statements.py: a statement is its name and parameters, returned or yielded
    re.compile(r"""\breturn\s+(["'])(\w+)\1\s*,\s*\("""),
    re.compile(r"""\byield\s+\(\s*(["'])(\w+)\1\s*,"""),
)
_DYNAMIC = re.compile(r"""\bq\[\s*f(["'])(.+?)\1\s*\]""")


def _used_queries(text: str) -> set[str]:
    names = {m.group(2) for pattern in _USES for m in pattern.finditer(text)}
    for m in _DYNAMIC.finditer(text):
        # notify_{channel}: every channel relaybox notifies on.
        assert m.group(2) == "notify_{channel}", f"unknown dynamic query name {m.group(2)!r}"
        names |= {"notify_inbox", "notify_outbox"}
    return names


def _backends_of(path: Path) -> tuple[str, ...]:
    """A backend's own module needs its queries; any other code needs them on both."""
    for backend in _BACKENDS:
        if path == _SRC / "store" / f"{backend}.py":
            return (backend,)
    return _BACKENDS


def test_every_query_used_exists_in_its_backends_sql() -> None:
    queries = {b: load_queries(b) for b in _BACKENDS}
    seen: set[str] = set()
    problems = []
    for path in sorted(_SRC.rglob("*.py")):
        used = _used_queries(path.read_text())
        seen |= used
        for backend in _backends_of(path):
            missing = sorted(used - set(queries[backend]))
            if missing:
                rel = path.relative_to(_SRC)
                problems.append(f"{rel} uses {missing}, not in sql/{backend}*.sql")
    assert not problems, "\n".join(problems)
    # The scan does find the queries (a changed calling convention would hide them).
    assert {"inbox_claim", "inbox_complete", "stats_inbox", "operation_insert"} <= seen
    assert {"inbox_insert", "inbox_insert_batch", "quarantine_insert"} <= seen


def test_backend_only_queries_are_used_only_by_their_backend() -> None:
    """A query in one backend's SQL only is an implementation detail of that backend's
    modules (``store/<backend>.py``; on PostgreSQL also ``store/partitions.py`` and
    ``store/partition_layout.py``, the time partitions only it has): shared code naming
    it would break on the other."""
    queries = {b: set(load_queries(b)) for b in _BACKENDS}
    own = {
        "postgres": {"postgres.py", "partitions.py", "partition_layout.py"},
        "sqlite": {"sqlite.py"},
    }
    problems = []
    for backend, other in (_BACKENDS, _BACKENDS[::-1]):
        only = queries[backend] - queries[other]
        for path in sorted(_SRC.rglob("*.py")):
            if path.parent == _SRC / "store" and path.name in own[backend]:
                continue
            literals = set(re.findall(r"""["'](\w+)["']""", path.read_text()))
            for name in sorted(literals & only):
                rel = path.relative_to(_SRC)
                problems.append(f"{rel} names {name!r}, which only sql/{backend}*.sql defines")
    assert not problems, "\n".join(problems)


def test_sql_files_are_well_formed() -> None:
    queries = {b: load_queries(b) for b in _BACKENDS}  # raises on a name defined twice
    for backend, named in queries.items():
        for name, sql in named.items():
            assert sql, f"{backend}: query {name} is empty"
    # Parameter styles do not leak from one dialect into the other.
    qmark = re.compile(r"\?\d+|[(,=]\s*\?\s*[,)]")
    for name, sql in queries["postgres"].items():
        assert not qmark.search(sql), f"postgres query {name} uses a qmark parameter"
    for name, sql in queries["sqlite"].items():
        assert not re.search(r"\$\d", sql), f"sqlite query {name} uses a $n parameter"


def test_a_part_stands_where_a_statement_includes_it() -> None:
    shared = "-- part: done\n-- (a comment goes)\nstatus = 'done'\n"
    own = (
        "-- part: finished\nid > 0\nAND (\n  -- include: done\n)\n\n"
        "-- name: finished_count\nSELECT count(*) FROM t\nWHERE\n    -- include: finished\n"
    )
    expanded = "SELECT count(*) FROM t\nWHERE\n    id > 0\n    AND (\n      status = 'done'\n    )"
    assert _named_blocks([("a.sql", own), ("b.sql", shared)]) == {"finished_count": expanded}


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("-- name: q\nSELECT 1\n-- include: nothing\n", "no part 'nothing'"),
        ("-- part: p\nx\n\n-- name: q\nSELECT 1\n", "parts nothing includes: ['p']"),
        ("-- name: q\nSELECT 1\n-- include: p)\n\n-- part: p\nx\n", "names one part alone"),
        ("-- part: p\n-- include: p\n\n-- name: q\n-- include: p\n", "no part 'p'"),
        ("-- part: p\nx\n-- part: p\ny\n-- name: q\n-- include: p\n", "defined twice"),
    ],
)
def test_a_part_is_included_or_an_error_says_why(text: str, error: str) -> None:
    with pytest.raises(RuntimeError, match=re.escape(error)):
        _named_blocks([("a.sql", text)])


async def test_sqlite_connection_pragmas(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'sub' / 'p.db'}")
    try:
        await store.migrate()
        async with store.connect() as conn:

            async def pragma(name: str) -> Any:
                return (await conn.exec_driver_sql(f"PRAGMA {name}")).scalar()

            assert str(await pragma("journal_mode")).lower() == "wal"
            assert await pragma("synchronous") == 2  # FULL
            assert await pragma("foreign_keys") == 1
            assert await pragma("busy_timeout") == 10_000
    finally:
        await store.close()
    assert (tmp_path / "sub" / "p.db").exists()


async def test_sqlite_waits_for_a_writer_while_switching_to_wal(tmp_path: Path) -> None:
    """relaybox joins an application's existing SQLite file (rollback journal) while the
    application is writing: it must wait (busy_timeout), not fail at connect."""
    path = tmp_path / "app.db"
    app = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        app.execute("CREATE TABLE app_data (x INTEGER)")
        app.execute("BEGIN IMMEDIATE")
        app.execute("INSERT INTO app_data VALUES (1)")
        asyncio.get_running_loop().call_later(0.3, app.execute, "COMMIT")
        store = open_store(f"sqlite:///{path}")
        try:
            applied = await asyncio.wait_for(store.migrate(), 10)
            assert applied[0] == "0001_initial"
        finally:
            await store.close()
        assert app.execute("SELECT count(*) FROM app_data").fetchone() == (1,)
    finally:
        app.close()


def test_open_store_schemes(tmp_path: Path) -> None:
    from relaybox.errors import ConfigurationError

    assert open_store(f"sqlite:///{tmp_path / 'x.db'}").backend == "sqlite"
    pg = open_store("postgres://u@127.0.0.1:1/db")
    assert pg.backend == "postgres"
    assert make_url(pg.url).drivername == "postgresql"
    with pytest.raises(ConfigurationError, match="mysql"):
        open_store("mysql://u@h/db")


def test_inline_writes_only_numbers_and_hex() -> None:
    """The statements folded into BEGIN / COMMIT messages are written with literals:
    integers, finite floats, lists of integers, and texts as hex (decoded by the SQL),
    so that nothing a caller passes can become SQL. Anything else is refused."""
    from relaybox.store.postgres import _inline

    sql = "SELECT $1, $2, $3, $4"
    assert _inline(sql, (7, 1.5, [1, 2], [b"it's", b"", None])) == (
        "SELECT 7, 1.5, '{1,2}', '{\"69742773\",\"\",NULL}'"
    )
    for bad in ("x'; DROP TABLE t; --", ["a"], float("nan"), True, [1, "2"], [b"x", "y"]):
        with pytest.raises(TypeError):
            _inline("SELECT $1", (bad,))  # type: ignore[arg-type]
