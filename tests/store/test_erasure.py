"""The erasure store (relaybox.store.erasure) on SQLite and PostgreSQL: the subject
index, an erasure's record, its batches (finished rows only), what still waits, and
the record's reads. relaybox.erasure drives these; tests/integration/test_erasure.py
proves the whole (surfaces, database bytes, races)."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import AsyncIterator

import pytest

from relaybox.store import Store, open_store
from tests.store.test_store import T0, delivery

DIGEST = hashlib.sha256(b"cus_alice").digest()


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    s = open_store(database_url)
    await s.migrate()
    yield s
    await s.close()


async def test_an_erasure_empties_finished_rows_and_waits_for_pending_ones(store: Store) -> None:
    finished = dataclasses.replace(
        delivery("e1", b'{"email": "alice@example.com"}', ignored=True), subject=DIGEST
    )
    pending = dataclasses.replace(delivery("e2", b'{"email": "alice@example.com"}'), subject=DIGEST)
    other = delivery("e3", b'{"email": "bob@example.com"}', ignored=True)
    [a, b, c] = await store.inbox.accept([finished, pending, other])
    assert [o.status for o in (a, b, c)] == ["ignored", "accepted", "ignored"]

    erasure_id, resumed = await store.erasure.begin(
        actor="dpo", reason="art. 17", scope="subject", digest=DIGEST, tenant=None, now=T0
    )
    assert not resumed
    erasure = await store.erasure.get(erasure_id)
    assert erasure is not None and erasure.finished_at is None
    counts = await store.erasure.erase_batch(erasure, now=T0 + 1, limit=10)
    assert counts == {
        "inbox": 1,
        "quarantine": 0,
        "outbox": 0,
        "attempts": 0,
        "messages": 0,
        "inbox_attempts": 0,
        "projections": 0,
    }
    assert await store.erasure.erase_batch(erasure, now=T0 + 1, limit=10) == dict.fromkeys(
        counts, 0
    )
    await store.erasure.flush()
    assert await store.erasure.settle(erasure, now=T0 + 2) == 1  # the pending row waits
    assert await store.erasure.open_ids() == [erasure_id]
    # Asked again while it waits: the same erasure, resumed.
    assert await store.erasure.begin(
        actor="dpo", reason="again", scope="subject", digest=DIGEST, tenant=None, now=T0 + 3
    ) == (erasure_id, True)  # fmt: skip

    rows = {
        r["event_id"]: r
        for r in await store.fetch_all("SELECT event_id, payload, erased_at FROM relaybox_inbox")
    }
    assert rows["e1"]["payload"] is None and rows["e1"]["erased_at"] == T0 + 1
    assert rows["e2"]["payload"] is not None and rows["e2"]["erased_at"] is None
    assert rows["e3"]["payload"] is not None  # another subject's row

    # A row indexed by hand (as publish indexes its message) is found by the next batch.
    async with store.transaction() as conn:
        await store.erasure.subject_index(conn, DIGEST, "inbox", str(c.inbox_id))
    again = await store.erasure.get(erasure_id)
    assert again is not None
    assert (await store.erasure.erase_batch(again, now=T0 + 4, limit=10))["inbox"] == 1
    assert await store.erasure.settle(again, now=T0 + 5) == 1
    [listed] = await store.erasure.latest()
    assert (listed.id, listed.rows["inbox"], listed.waiting) == (erasure_id, 2, 1)
    assert (listed.actor, listed.reason, listed.scope) == ("dpo", "art. 17", "subject")


async def test_seed_5002_a_later_erasure_reaches_a_conflict_that_came_after_an_earlier_one(
    store: Store,
) -> None:
    """Other content under an erased event's id is quarantined (the key and fingerprint
    stayed): a later erasure of the subject empties it, although the inbox row it is
    stored under was emptied already. The simulation found this (tests/sim, seed 5002
    on SQLite: erasures of one customer before and after a conflicting resend)."""
    first = dataclasses.replace(
        delivery("e1", b'{"email": "alice@example.com"}', ignored=True), subject=DIGEST
    )
    await store.inbox.accept([first])
    erasure_id, _ = await store.erasure.begin(
        actor="dpo", reason="", scope="subject", digest=DIGEST, tenant=None, now=T0
    )
    erasure = await store.erasure.get(erasure_id)
    assert erasure is not None
    assert (await store.erasure.erase_batch(erasure, now=T0 + 1, limit=10))["inbox"] == 1
    assert await store.erasure.settle(erasure, now=T0 + 1) == 0

    conflict = dataclasses.replace(
        delivery("e1", b'{"email": "alice@new.example.com"}', ignored=True), subject=DIGEST
    )
    [outcome] = await store.inbox.accept([conflict])
    assert outcome.status == "quarantined"
    later_id, resumed = await store.erasure.begin(
        actor="dpo", reason="again", scope="subject", digest=DIGEST, tenant=None, now=T0 + 2
    )
    later = await store.erasure.get(later_id)
    assert later is not None and not resumed and later_id != erasure_id
    counts = await store.erasure.erase_batch(later, now=T0 + 3, limit=10)
    assert (counts["inbox"], counts["quarantine"]) == (0, 1)
    assert await store.erasure.erase_batch(later, now=T0 + 3, limit=10) == dict.fromkeys(counts, 0)
    [held] = await store.fetch_all("SELECT payload, headers, erased_at FROM relaybox_quarantine")
    assert (held["payload"], held["headers"], held["erased_at"]) == (None, None, T0 + 3)


async def test_a_tenant_erasure_with_nothing_left_finishes(store: Store) -> None:
    erasure_id, resumed = await store.erasure.begin(
        actor="dpo", reason="", scope="tenant", digest=None, tenant="tenant-9", now=T0
    )
    erasure = await store.erasure.get(erasure_id)
    assert erasure is not None and not resumed
    assert sum((await store.erasure.erase_batch(erasure, now=T0, limit=10)).values()) == 0
    assert await store.erasure.settle(erasure, now=T0 + 1) == 0
    assert await store.erasure.open_ids() == []
    done = await store.erasure.get(erasure_id)
    assert done is not None and done.finished_at == T0 + 1
    assert await store.erasure.get(erasure_id + 1000) is None


async def test_an_operational_event_inherits_the_subjects_of_its_row(store: Store) -> None:
    """``subject_inherit``: a message about inbox row N (or outbox row M) is indexed
    under every digest of that row (of M's message, or of the inbox row whose handler
    added M), once however often it is asked."""
    other = hashlib.sha256(b"cus_bob").digest()
    [a] = await store.inbox.accept(
        [dataclasses.replace(delivery("e1", b"{}", ignored=True), subject=DIGEST)]
    )
    async with store.transaction() as conn:
        await store.erasure.subject_index(conn, other, "inbox", str(a.inbox_id))
        await store.erasure.subject_inherit(conn, "msg_dead", inbox_id=a.inbox_id)
        await store.erasure.subject_inherit(conn, "msg_dead", inbox_id=a.inbox_id)
        await store.erasure.subject_inherit(conn, "msg_none", inbox_id=a.inbox_id + 1000)
    rows = await store.fetch_all("SELECT digest, ref FROM relaybox_subjects WHERE kind = 'message'")
    assert sorted((bytes(r["digest"]), r["ref"]) for r in rows) == sorted(
        [(DIGEST, "msg_dead"), (other, "msg_dead")]
    )


async def _indexed(store: Store) -> set[str]:
    return {r["ref"] for r in await store.fetch_all("SELECT ref FROM relaybox_subjects")}


async def test_the_purge_deletes_index_rows_once_they_find_nothing_more(store: Store) -> None:
    """The purge's scoped passes (by tenant, by id after a scan) delete the subject
    index's rows of the rows they purged, once nothing found through them holds what
    an erasure empties: an event's error text keeps its row until the erasure, a
    handler's row keeps its event's until that row is purged too."""
    rows = [
        dataclasses.replace(delivery(f"e{i}", b'{"email": "alice@example.com"}', ignored=True),
                            subject=DIGEST)
        for i in range(3)
    ]  # fmt: skip
    [plain, failed, handled] = [o.inbox_id for o in await store.inbox.accept(rows)]
    async with store.transaction() as conn:
        await conn.exec_driver_sql(
            f"UPDATE relaybox_inbox SET last_error = 'no alice@example.com' WHERE id = {failed}"
        )
        await conn.exec_driver_sql(
            "INSERT INTO relaybox_outbox (channel, key, payload, inbox_id, status,"
            " next_attempt_at, created_at, updated_at)"
            f" VALUES ('mail', 'k', '{{\"to\": \"alice@example.com\"}}', {handled}, 'sent',"
            f" {T0}, {T0}, {T0})"
        )
    assert await _indexed(store) == {str(plain), str(failed), str(handled)}

    later = T0 + 10
    purged = await store.retention.purge_tenants(
        "inbox", ["tenant-1"], cutoff=later, now=later, limit=10
    )
    assert purged == 3
    assert await _indexed(store) == {str(failed), str(handled)}
    [found] = await store.retention.scan("outbox", cutoff=later, after=None, limit=10)
    assert await store.retention.purge_ids("outbox", [found.id], cutoff=later, now=later) == 1
    assert await _indexed(store) == {str(failed)}

    erasure_id, _ = await store.erasure.begin(
        actor="dpo", reason="", scope="subject", digest=DIGEST, tenant=None, now=later
    )
    erasure = await store.erasure.get(erasure_id)
    assert erasure is not None
    counts = await store.erasure.erase_batch(erasure, now=later, limit=10)
    assert counts["inbox"] == 1
    assert await _indexed(store) == set()
    [row] = await store.fetch_all(f"SELECT last_error FROM relaybox_inbox WHERE id = {failed}")
    assert row["last_error"] == "(erased)"


async def test_a_tenant_erasure_empties_the_projections_its_events_wrote(store: Store) -> None:
    """A projection holds no tenant: a tenant's erasure finds the states its events
    wrote by the inbox rows it empties (the projections' inbox_id index)."""
    rows = [delivery(f"e{i}", b'{"email": "alice@example.com"}', ignored=True) for i in range(2)]
    [mine, theirs] = [o.inbox_id for o in await store.inbox.accept(rows)]
    async with store.transaction() as conn:
        await conn.exec_driver_sql(
            f"UPDATE relaybox_inbox SET tenant = 'other' WHERE id = {theirs}"
        )
        for key, inbox_id in (("r1", mine), ("r2", theirs)):
            await conn.exec_driver_sql(
                "INSERT INTO relaybox_projections (resource_key, origin, version, version_key,"
                f" state, source, inbox_id, updated_at) VALUES ('{key}', 'event', '1', '1',"
                f" '{{\"email\": \"alice@example.com\"}}', 'src', {inbox_id}, {T0})"
            )
    erasure_id, _ = await store.erasure.begin(
        actor="dpo", reason="", scope="tenant", digest=None, tenant="tenant-1", now=T0
    )
    erasure = await store.erasure.get(erasure_id)
    assert erasure is not None
    counts = await store.erasure.erase_batch(erasure, now=T0 + 1, limit=10)
    assert (counts["inbox"], counts["projections"]) == (1, 1)
    states = await store.fetch_all(
        "SELECT resource_key, state, version, erased_at FROM relaybox_projections"
        " ORDER BY resource_key"
    )
    assert [(r["state"] is None, r["version"], r["erased_at"]) for r in states] == [
        (True, "1", T0 + 1),
        (False, "1", None),
    ]
