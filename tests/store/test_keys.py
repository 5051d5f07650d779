"""The keys kept apart from the history (migration 0027, relaybox.store.keys): event
keys decide duplicates and conflicts, idempotency keys repeated publishes, whether or
not the history row still exists; their backfill (KeysStore.backfill,
KeysStore.backfill_status) and their expiry (KeysStore.expire), on both backends."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from relaybox.store import Store, open_store
from relaybox.store.inbox_rows import NewOperation
from relaybox.store.keys import (
    check_scopes,
    day_of,
    event_digest,
    fingerprint_digest,
    message_digest,
    message_ref,
    operation_digest,
    operation_fingerprint,
    scope_of,
)
from relaybox.store.outbox_rows import NewMessage, new_id
from tests.conftest import _dsn, drop_pg_database, empty_pg_database
from tests.store.test_store import T0, accept_one, delivery, statuses
from tests.support.store_rows import endpoint_write as endpoint

DAY = 86400


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    s = open_store(database_url)
    yield s
    await s.close()


async def sql(store: Store, *statements: str) -> None:
    async with store.transaction() as conn:
        for statement in statements:
            await conn.exec_driver_sql(statement)


def raw(digest: Any) -> bytes:
    """A stored 16-byte digest: a uuid on PostgreSQL (no length header, migrations
    0031 and 0035), a blob on SQLite."""
    if isinstance(digest, uuid.UUID):
        return digest.bytes
    assert isinstance(digest, bytes | memoryview), type(digest)
    return bytes(digest)


def message_id(key: dict[str, Any]) -> str:
    """The message id an idempotency key's row names: its 16 bytes, or its text."""
    if key["message_uuid"] is None:
        text = key["message_text"]
        assert isinstance(text, str)
        return text
    assert key["message_text"] is None
    return "msg_" + raw(key["message_uuid"]).hex()[5:]


async def event_keys(store: Store) -> list[dict[str, Any]]:
    return await store.fetch_all("SELECT * FROM relaybox_event_keys ORDER BY inbox_id")


def message(
    tenant: str, key: str | None, n: int, *, at: float = T0, id: str | None = None
) -> NewMessage:
    return NewMessage(
        id=id or new_id("msg", at),
        tenant=tenant,
        event_type="thing.happened",
        idempotency_key=key,
        body=f'{{"n": {n}}}',
        created_at=at,
    )


async def publish(store: Store, m: NewMessage) -> bool:
    async with store.transaction() as conn:
        return await store.outbox.message_insert(conn, m)


async def by_key(store: Store, tenant: str, key: str) -> Any:
    async with store.transaction() as conn:
        return await store.outbox.message_get_by_key(conn, tenant, key)


async def drop_history(store: Store) -> None:
    """What dropping a time partition does to the history: its rows are gone."""
    await sql(
        store,
        "DELETE FROM relaybox_quarantine",
        "DELETE FROM relaybox_inbox_attempts",
        "DELETE FROM relaybox_inbox",
        "DELETE FROM relaybox_outbox",
        "DELETE FROM relaybox_messages",
    )


def test_the_narrow_forms_are_the_old_ones_cut() -> None:
    """Migration 0038 converts stored keys by the same arithmetic: a scope is the top
    half of its old 64-bit number, a fingerprint digest the first 8 of its 16 bytes."""
    for name in ("src", "acme", "", "ü" * 40):
        assert scope_of(name) == old_scope(name) >> 32
    for fp in (b"", b"x", hashlib.sha256(b"y").digest()):
        assert fingerprint_digest(fp) == int.from_bytes(old_fingerprint(fp)[:8], "big", signed=True)
    made = new_id("msg", T0)
    assert message_ref(made) == (bytes.fromhex("00000" + made[4:]), None)
    assert str(uuid.UUID(bytes=bytes.fromhex("00000" + made[4:]))).replace("-", "")[5:] == made[4:]
    for other in ("order-1", "msg_" + "a" * 26, "msg_" + "a" * 28, "msg_" + "A" * 27, "msg_x\n"):
        assert message_ref(other) == (None, other)
    check_scopes(["a", "b", "a"])  # a name twice is one name
    with pytest.raises(ValueError, match=r"src34860.*src82798"):
        check_scopes(["src34860", "b", "src82798"])


async def test_accept_writes_one_narrow_key_per_event(store: Store) -> None:
    outcomes = await store.inbox.accept(
        [delivery("e1"), delivery("e1"), delivery("e2", at=T0 + 3 * DAY)]
    )
    assert statuses(outcomes) == ["accepted", "duplicate", "accepted"]
    rows = await event_keys(store)
    assert [(r["inbox_id"], r["first_seen"]) for r in rows] == [
        (outcomes[0].inbox_id, day_of(T0)),
        (outcomes[2].inbox_id, day_of(T0) + 3),
    ]
    assert raw(rows[0]["digest"]) == event_digest("src", "acct", "e1")
    assert rows[0]["fingerprint"] == fingerprint_digest(hashlib.sha256(b'{"n": 1}').digest())
    assert all(len(raw(r["digest"])) == 16 for r in rows)
    assert all(-(2**63) <= r["fingerprint"] < 2**63 for r in rows)
    assert {r["scope"] for r in rows} == {scope_of("src")}
    assert -(2**31) <= scope_of("src") < 2**31


async def test_duplicates_and_conflicts_outlive_the_history(database_url: str) -> None:
    """A provider's resend of a year-old event is a duplicate, a changed payload
    under its id is quarantined, when the original inbox row is gone."""
    store = open_store(database_url)
    try:
        first = await accept_one(store, delivery("old", b'{"v": 1}'))
        if store.backend == "postgres":
            await drop_history(store)
        else:  # SQLite keeps its rows (retention empties payloads): only the row goes
            await sql(store, f"DELETE FROM relaybox_inbox WHERE id = {first.inbox_id}")
        later = T0 + 365 * DAY
        again = await accept_one(store, delivery("old", b'{"v": 1}', at=later))
        assert (again.status, again.inbox_id) == ("duplicate", first.inbox_id)
        assert await store.fetch_all("SELECT id FROM relaybox_inbox") == []
        if store.backend == "postgres":
            changed = await accept_one(store, delivery("old", b'{"v": 2}', at=later))
            assert (changed.status, changed.inbox_id) == ("quarantined", first.inbox_id)
            # the same conflicting content again: one quarantine row per content
            assert (await accept_one(store, delivery("old", b'{"v": 2}'))).status == "quarantined"
            [q] = await store.fetch_all("SELECT * FROM relaybox_quarantine")
            assert q["inbox_id"] == first.inbox_id  # as its key remembers it, the row gone
            assert (q["event_id"], bytes(q["payload"])) == ("old", b'{"v": 2}')
            # The operator still sees it, with no original to compare.
            [listed] = await store.operator.quarantine_list(
                source=None, resolved=None, before_id=None, limit=10
            )
            assert (listed["id"], listed["inbox_id"], listed["original_status"]) == (
                q["id"],
                first.inbox_id,
                None,
            )
            from relaybox import Relaybox
            from relaybox.ops.inbound import quarantine_get

            box = Relaybox(database_url)
            try:
                detail = await quarantine_get(box, q["id"])
            finally:
                await box.close()
            assert (detail.original, detail.differences) == (None, [])
            assert detail.quarantined.payload == {"v": 2}
    finally:
        await store.close()


async def test_publish_keys_outlive_the_message(store: Store) -> None:
    m = message("t1", "order-1", 1)
    assert await publish(store, m)
    assert not await publish(store, message("t1", "order-1", 2))
    assert await publish(store, message("t2", "order-1", 3))  # another tenant's key
    assert await publish(store, message("t1", None, 4))
    assert await publish(store, message("t1", None, 5))  # no key: never a repeat
    found = await by_key(store, "t1", "order-1")
    assert (found.id, found.body) == (m.id, b'{"n": 1}')
    await sql(store, f"DELETE FROM relaybox_messages WHERE id = '{m.id}'")
    assert not await publish(store, message("t1", "order-1", 6))
    gone = await by_key(store, "t1", "order-1")
    assert (gone.id, gone.body, gone.created) == (m.id, b"null", False)
    assert gone.created_at == day_of(T0) * DAY
    keyed = [k for k in await store.fetch_all("SELECT * FROM relaybox_message_keys")]
    [k] = [k for k in keyed if raw(k["digest"]) == message_digest("t1", "order-1")]
    assert k["scope"] == scope_of("t1")
    # The id relaybox made, as 16 bytes (the uuid of '00000' and its 27 hex digits).
    assert (raw(k["message_uuid"]).hex(), k["message_text"]) == ("00000" + m.id[4:], None)
    assert message_id(k) == m.id
    # An id relaybox did not make (written by hand) is kept as its text, and named back.
    for i, by_hand in enumerate(["order-42", "msg_" + "0" * 28, "msg_" + "A" * 27]):
        assert await publish(store, message("t3", f"hand-{i}", 7, id=by_hand))
        assert not await publish(store, message("t3", f"hand-{i}", 8))
        assert (await by_key(store, "t3", f"hand-{i}")).id == by_hand
        [k] = [
            k
            for k in await store.fetch_all("SELECT * FROM relaybox_message_keys")
            if raw(k["digest"]) == message_digest("t3", f"hand-{i}")
        ]
        assert (k["message_uuid"], k["message_text"]) == (None, by_hand)


async def _forget_keys(store: Store) -> None:
    """The database as before migration 0027: rows without keys, no backfill done."""
    await sql(
        store,
        "DELETE FROM relaybox_event_keys",
        "DELETE FROM relaybox_message_keys",
        "DELETE FROM relaybox_business_keys",
        "DELETE FROM relaybox_keys_backfill",
    )


async def test_keys_backfill_copies_old_rows_in_resumable_batches(database_url: str) -> None:
    store = open_store(database_url)
    try:
        outcomes = await store.inbox.accept([delivery(f"e{i}", at=T0 + i * DAY) for i in range(5)])
        messages = [message("t1", f"k{i}", i) for i in range(3)] + [message("t1", None, 9)]
        for m in messages:
            assert await publish(store, m)
        await _forget_keys(store)
        assert [(p.kind, p.rows, p.finished) for p in await store.keys.backfill_status()] == [
            ("event", 0, False),
            ("message", 0, False),
            ("operation", 0, False),
            ("outbox", 0, False),
        ]
        # Before the backfill the accept copies an old row's key itself.
        assert (await accept_one(store, delivery("e4", at=T0 + 9 * DAY))).status == "duplicate"
        assert (await accept_one(store, delivery("e3", b"{}"))).status == "quarantined"
        assert not await publish(store, message("t1", "k0", 7))  # the old message decides
        assert (await by_key(store, "t1", "k1")).id == messages[1].id

        first = await store.keys.backfill("event", limit=2)
        assert (first.rows, first.finished, first.read) == (2, False, 2)
        # Resumes after the last id, in new transactions (another store, same database).
        other = open_store(database_url)
        try:
            second = await other.keys.backfill("event", limit=2)
        finally:
            await other.close()
        assert (second.rows, second.finished) == (4, False)
        last = await store.keys.backfill("event", limit=2)
        assert (last.rows, last.finished) == (5, True)
        assert (await store.keys.backfill("event", limit=2)).read == 0  # finished: nothing
        assert (await store.keys.backfill("operation", limit=2)).finished
        rows = await event_keys(store)
        assert [r["inbox_id"] for r in rows] == [o.inbox_id for o in outcomes]
        assert [r["first_seen"] for r in rows] == [day_of(T0) + i for i in range(5)]
        assert (await store.keys.backfill("message", limit=10)).finished
        assert (await store.keys.backfill("outbox", limit=10)).finished
        assert {p.kind: p.finished for p in await store.keys.backfill_status()} == {
            "event": True,
            "message": True,
            "operation": True,  # no operations: finished at its first batch
            "outbox": True,  # no outbox rows
        }
        keyed = await store.fetch_all("SELECT * FROM relaybox_message_keys")
        assert sorted(message_id(r) for r in keyed) == sorted(m.id for m in messages[:3])
        # The keys alone decide now, the rows gone.
        if store.backend == "postgres":
            await drop_history(store)
        dup = await accept_one(store, delivery("e2", at=T0 + 40 * DAY))
        assert (dup.status, dup.inbox_id) == ("duplicate", outcomes[2].inbox_id)
        assert not await publish(store, message("t1", "k2", 8))
        with pytest.raises(ValueError, match="no backfill"):
            await store.keys.backfill("thing")
    finally:
        await store.close()


async def test_keys_expire_by_age_per_scope(store: Store) -> None:
    d0 = day_of(T0)
    await store.inbox.accept(
        [delivery(f"a{i}", source="a", at=T0 + i * DAY) for i in range(4)]
        + [delivery(f"b{i}", source="b", at=T0 + i * DAY) for i in range(4)]
    )
    for i in range(3):
        assert await publish(store, message("t1", f"k{i}", i, at=T0 + i * DAY))
        assert await publish(store, message("t2", f"k{i}", i, at=T0 + i * DAY))
    async with store.transaction() as conn:
        for i, source in enumerate(("a", "a", "b")):
            await store.inbox.operation_insert(
                conn,
                NewOperation(
                    business_key=f"op{i}",
                    fingerprint="f",
                    inbox_id=None,
                    source=source,
                    tenant=None,
                    now=T0 + i * DAY,
                ),
            )
    # Scoped: only source a's keys first seen before day d0 + 2, a few a transaction.
    assert await store.keys.expire("event", d0 + 2, scope="a", limit=1) == 2
    left = await event_keys(store)
    assert len(left) == 6 and {r["scope"] for r in left if r["first_seen"] < d0 + 2} == {
        scope_of("b")
    }
    # Forgotten: the resend is new again (its row still there is the inbox's own key,
    # kept where no partition drops it: here the row goes first).
    await sql(store, "DELETE FROM relaybox_inbox WHERE event_id = 'a0'")
    assert (await accept_one(store, delivery("a0", source="a"))).status == "accepted"
    assert (await accept_one(store, delivery("b0", source="b"))).status == "duplicate"
    # Every scope.
    assert await store.keys.expire("event", d0 + 1) == 2  # b0, and a0's new key (day d0)
    assert await store.keys.expire("message", d0 + 1, scope="t2") == 1
    assert await store.keys.expire("message", d0 + 3) == 5
    assert await store.fetch_all("SELECT * FROM relaybox_message_keys") == []
    assert await store.keys.expire("operation", d0 + 2, scope="a") == 2
    assert await store.keys.expire("operation", d0 + 5) == 1
    assert await store.fetch_all("SELECT * FROM relaybox_business_keys") == []
    async with store.transaction() as conn:
        created, _ = await store.inbox.operation_insert(
            conn,
            NewOperation(
                business_key="op0", fingerprint="f", inbox_id=None, source="a", tenant=None, now=T0
            ),
        )
    assert created  # an expired business key happens again
    with pytest.raises(ValueError, match="unknown kind"):
        await store.keys.expire("thing", d0)  # type: ignore[arg-type]


async def test_keys_alone_decide_without_the_old_unique_constraints(pg_url: str) -> None:
    """On PostgreSQL the partitioned history tables lose their old UNIQUE constraints:
    with them dropped here, duplicates (also racing), conflicts, business keys and
    idempotency keys still hold."""
    admin = open_store(pg_url)
    await sql(
        admin,
        "ALTER TABLE relaybox_quarantine DROP CONSTRAINT relaybox_quarantine_once",
        "ALTER TABLE relaybox_inbox DROP CONSTRAINT relaybox_inbox_event_key",
        "ALTER TABLE relaybox_messages DROP CONSTRAINT relaybox_messages_idempotency",
    )
    stores = [open_store(pg_url) for _ in range(4)]
    try:
        names = [f"k{i:02d}" for i in range(12)]

        async def task(n: int) -> None:
            for start in range(0, len(names), 4):
                batch = [delivery(k) for k in names[start : start + 4]] * 2
                batch.append(delivery(names[start], b'{"other": true}'))
                if n % 2:
                    batch.reverse()
                await stores[n % len(stores)].inbox.accept(batch)

        await asyncio.gather(*(task(n) for n in range(8)))
        rows = await admin.fetch_all("SELECT event_id FROM relaybox_inbox")
        assert sorted(r["event_id"] for r in rows) == names  # one row per key
        assert len(await admin.fetch_all("SELECT * FROM relaybox_quarantine")) == 3
        assert (await accept_one(admin, delivery("k01"))).status == "duplicate"

        # Idempotency keys, racing.
        async def racer(n: int) -> bool:
            return await publish(stores[n % len(stores)], message("t", "same", n))

        assert sorted(await asyncio.gather(*(racer(n) for n in range(6)))) == [False] * 5 + [True]
        assert len(await admin.fetch_all("SELECT * FROM relaybox_messages")) == 1
        # Business keys: relaybox_business_keys decides (never partitioned).
        async with admin.transaction() as conn:
            first = await admin.inbox.operation_insert(
                conn,
                NewOperation(
                    business_key="b",
                    fingerprint="x",
                    inbox_id=None,
                    source="s",
                    tenant=None,
                    now=T0,
                ),
            )
            again = await admin.inbox.operation_insert(
                conn,
                NewOperation(
                    business_key="b",
                    fingerprint="y",
                    inbox_id=None,
                    source="s",
                    tenant=None,
                    now=T0,
                ),
            )
        assert (first, again) == ((True, "x"), (False, "x"))
        # The history dropped: the keys still decide.
        await drop_history(admin)
        assert (await accept_one(admin, delivery("k05"))).status == "duplicate"
        assert (await accept_one(admin, delivery("k05", b"[]"))).status == "quarantined"
        assert not await publish(admin, message("t", "same", 99))
    finally:
        for s in stores:
            await s.close()
        await admin.close()


# -- business keys (migration 0031) --------------------------------------------------


async def once(
    store: Store, key: str, fp: str, *, inbox_id: int | None = None, at: float = T0
) -> tuple[bool, str]:
    async with store.transaction() as conn:
        return await store.inbox.operation_insert(
            conn,
            NewOperation(
                business_key=key,
                fingerprint=fp,
                inbox_id=inbox_id,
                source="src",
                tenant="t1",
                now=at,
            ),
        )


async def test_a_business_key_is_one_narrow_digest_row(store: Store) -> None:
    assert await once(store, "grant:1", "fp-a", at=T0 + 2 * DAY) == (True, "fp-a")
    [k] = await store.fetch_all("SELECT * FROM relaybox_business_keys")
    assert raw(k["digest"]) == operation_digest("grant:1")
    assert k["fingerprint"] == operation_fingerprint("fp-a")
    assert (k["scope"], k["first_seen"]) == (scope_of("src"), day_of(T0) + 2)
    [row] = await store.fetch_all("SELECT business_key, fingerprint FROM relaybox_operations")
    assert (row["business_key"], row["fingerprint"]) == ("grant:1", "fp-a")
    # A repeat, then a reuse with another fingerprint (OperationConflict names it).
    assert await once(store, "grant:1", "fp-a") == (False, "fp-a")
    assert await once(store, "grant:1", "fp-b") == (False, "fp-a")
    # The readable row gone (retention purged its event): the digest still decides.
    await sql(store, "DELETE FROM relaybox_operations")
    assert await once(store, "grant:1", "fp-a") == (False, "fp-a")
    created, stored = await once(store, "grant:1", "fp-b")
    assert not created and stored != "fp-b" and stored.startswith("<fingerprint digest ")
    assert await store.fetch_all("SELECT * FROM relaybox_operations") == []
    # Expired: the key happens again, and its readable row is written again.
    assert await store.keys.expire("operation", day_of(T0) + 3) == 1
    assert await once(store, "grant:1", "fp-b") == (True, "fp-b")
    assert len(await store.fetch_all("SELECT * FROM relaybox_operations")) == 1


async def test_business_keys_stored_before_0031_still_decide_until_backfilled(
    store: Store,
) -> None:
    for i in range(5):
        assert (await once(store, f"old:{i}", f"fp{i}", at=T0 + i * DAY))[0]
    # The database as before migration 0031: readable rows only, no backfill done.
    await sql(
        store,
        "DELETE FROM relaybox_business_keys",
        "UPDATE relaybox_keys_backfill SET finished_at = NULL WHERE kind = 'operation'",
    )
    # The old row decides: a repeat, a reuse (the key's digest written ahead of the
    # backfill takes the old row's fingerprint, not the reuse's), a new key is new.
    assert await once(store, "old:1", "fp1") == (False, "fp1")
    assert await once(store, "old:2", "other") == (False, "fp2")
    keyed = {
        r["fingerprint"] for r in await store.fetch_all("SELECT * FROM relaybox_business_keys")
    }
    assert keyed == {operation_fingerprint("fp1"), operation_fingerprint("fp2")}
    assert await once(store, "new:1", "x") == (True, "x")
    # Until the backfill has finished the purge keeps the readable rows (they decide).
    await sql(store, "UPDATE relaybox_operations SET inbox_id = 7")
    async with store.transaction() as conn:
        await store.db.rows(conn, "operations_purge", (store.db.array([7]),))
    assert len(await store.fetch_all("SELECT * FROM relaybox_operations")) == 6
    # The backfill, resumable, in key order; a key written ahead is left alone.
    first = await store.keys.backfill("operation", limit=4)
    assert (first.rows, first.finished, first.last_id) == (4, False, "old:2")
    last = await store.keys.backfill("operation", limit=4)
    assert (last.rows, last.finished) == (6, True)
    rows = await store.fetch_all("SELECT * FROM relaybox_business_keys")
    # Each backfilled key at its row's day; the two written ahead at the day of their
    # repeat (kept a little longer, never shorter).
    assert sorted(r["first_seen"] for r in rows) == sorted(
        [day_of(T0) + i for i in (0, 3, 4)] + [day_of(T0)] * 3
    )
    # Now the readable rows may go: the digests decide alone.
    async with store.transaction() as conn:
        await store.db.rows(conn, "operations_purge", (store.db.array([7]),))
    assert await store.fetch_all("SELECT * FROM relaybox_operations") == []
    for i in range(5):
        assert await once(store, f"old:{i}", f"fp{i}") == (False, f"fp{i}")
        assert await once(store, f"old:{i}", "other") != (True, "other")


async def test_keys_expire_keeps_the_scopes_named(store: Store) -> None:
    d0 = day_of(T0)
    await store.inbox.accept(
        [delivery(f"{s}{i}", source=s, at=T0 + i * DAY) for s in "abc" for i in range(3)]
    )
    # Every scope but a and b (they keep theirs longer): c's three keys before d0 + 3.
    assert await store.keys.expire("event", d0 + 3, keep=["a", "b"], limit=2) == 3
    left = await event_keys(store)
    assert {r["scope"] for r in left} == {scope_of("a"), scope_of("b")}
    for tenant in ("t1", "t2"):
        assert await publish(store, message(tenant, "k", 1))
    assert await store.keys.expire("message", d0 + 1, keep=["t2"]) == 1
    [k] = await store.fetch_all("SELECT scope FROM relaybox_message_keys")
    assert k["scope"] == scope_of("t2")


# -- a property: no duplicate gets through while its key is kept ----------------------


@dataclass
class Key:
    content: int
    day: int
    inbox_id: int
    kept: bool = True
    row: bool = True  # its inbox row still exists
    pending: bool = True


@dataclass
class Op:
    """A business key as the model knows it: its operation's fingerprint (a number)."""

    fingerprint: int
    day: int


@dataclass
class Model:
    ns: str
    day: int = 0
    keys: dict[int, Key] = field(default_factory=dict)
    ops: dict[int, Op] = field(default_factory=dict)

    @property
    def subject(self) -> bytes:
        return hashlib.sha256(self.ns.encode()).digest()


Step = tuple[str, int, int]
steps = st.lists(
    st.one_of(
        st.tuples(st.just("accept"), st.integers(0, 5), st.integers(0, 2)),
        st.tuples(st.just("tick"), st.integers(1, 40), st.just(0)),
        st.tuples(st.just("finish"), st.integers(0, 5), st.just(0)),
        st.tuples(st.just("once"), st.integers(0, 2), st.integers(0, 1)),
        st.tuples(st.just("purge"), st.just(0), st.just(0)),
        st.tuples(st.just("erase"), st.just(0), st.just(0)),
        st.tuples(st.just("expire"), st.integers(0, 2), st.integers(0, 60)),
    ),
    min_size=1,
    max_size=25,
)


def source_of(ns: str, key: int) -> str:
    return f"{ns}-s{key % 3}"


async def check_once(
    store: Store, conn: Any, model: Model, a: int, fp: int, inbox_id: int | None, at: float
) -> None:
    """ctx.once() of the business key ``a`` with fingerprint ``fp``: new unless the
    model keeps it; a repeat answers with the same fingerprint, a reuse with another
    with a different one (OperationConflict), whether its readable row is kept or not."""
    created, stored = await store.inbox.operation_insert(
        conn,
        NewOperation(
            business_key=f"{model.ns}-op{a}",
            fingerprint=f"f{fp}",
            inbox_id=inbox_id,
            source=source_of(model.ns, a),
            tenant=None,
            now=at,
        ),
    )
    op = model.ops.get(a)
    if op is None:
        assert (created, stored) == (True, f"f{fp}"), (a, fp)
        model.ops[a] = Op(fp, model.day)
    else:
        assert not created, (a, fp, op)
        assert (stored == f"f{fp}") == (op.fingerprint == fp), (a, fp, op, stored)


async def check_step(store: Store, model: Model, step: Step) -> None:
    op, a, b = step
    at = T0 + model.day * DAY
    if op == "tick":
        model.day += a
    elif op == "accept":
        k = model.keys.get(a)
        d = delivery(f"{model.ns}-{a}", f'{{"c": {b}}}', source=source_of(model.ns, a), at=at)
        outcome = await accept_one(store, dataclasses.replace(d, subject=model.subject))
        if k is not None and (k.kept or k.row):
            # kept, or forgotten while the row the inbox's own key names still exists
            expected = "duplicate" if k.content == b else "quarantined"
            assert (outcome.status, outcome.inbox_id) == (expected, k.inbox_id), (step, k)
            k.kept = True
        else:
            assert outcome.status == "accepted", (step, k)
            model.keys[a] = Key(b, model.day, outcome.inbox_id)
    elif op == "finish":
        # The handler: its business key (the event's content as its fingerprint) in
        # the transaction that completes the event.
        k = model.keys.get(a)
        if k is not None and k.row and k.pending:
            async with store.transaction() as conn:
                await check_once(store, conn, model, a, k.content, k.inbox_id, at)
                await store.inbox.complete(conn, [k.inbox_id], at)
            k.pending = False
    elif op == "once":
        async with store.transaction() as conn:
            await check_once(store, conn, model, a, b, None, at)
    elif op == "purge":
        # Retention: payloads go (both backends), and the readable business keys of
        # the purged events; on PostgreSQL the finished rows go too, as a dropped
        # partition takes them.
        while await store.history.retention_purge_batch("inbox", cutoff=at + 1, now=at, limit=50):
            pass
        if store.backend == "postgres":
            gone = [k for k in model.keys.values() if k.row and not k.pending]
            ids = ",".join(str(k.inbox_id) for k in gone)
            if ids:
                await sql(
                    store,
                    f"DELETE FROM relaybox_quarantine WHERE inbox_id IN ({ids})",
                    f"DELETE FROM relaybox_inbox WHERE id IN ({ids})",
                )
            for k in gone:
                k.row = False
    elif op == "erase":
        # The namespace's subject erased: finished rows emptied, pending ones wait.
        erasure_id, _ = await store.erasure.begin(
            actor="t", reason="p", scope="subject", digest=model.subject, tenant=None, now=at
        )
        erasure = await store.erasure.get(erasure_id)
        assert erasure is not None
        while any((await store.erasure.erase_batch(erasure, now=at, limit=5)).values()):
            pass
        await store.erasure.settle(erasure, now=at)
    elif op == "expire":
        before = day_of(T0) + model.day - b
        await store.keys.expire("event", before, scope=f"{model.ns}-s{a}", limit=2)
        await store.keys.expire("operation", before, scope=f"{model.ns}-s{a}", limit=2)
        for n, k in model.keys.items():
            if n % 3 == a and day_of(T0) + k.day < before:
                k.kept = False
        for n in [n for n, o in model.ops.items() if n % 3 == a and day_of(T0) + o.day < before]:
            del model.ops[n]
    # Never a pending row lost, never one of them changed by a later delivery.
    found = await store.fetch_all(
        f"SELECT id, status FROM relaybox_inbox WHERE event_id LIKE '{model.ns}-%'"
    )
    status = {r["id"]: r["status"] for r in found}
    for k in model.keys.values():
        if k.pending:
            assert status.get(k.inbox_id) == "pending", (step, k)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(script=steps)
async def test_no_duplicate_through_while_its_key_is_kept(store: Store, script: list[Step]) -> None:
    """Any sequence of accepts (new, duplicate, conflicting), handlers' business keys
    (repeated, reused with another fingerprint), retention purges (with the finished
    rows dropped on PostgreSQL), erasures and key expiries: a delivery whose key is
    kept is a duplicate or quarantined against its first row, a business key that is
    kept is never created twice and tells a reuse from a repeat, and no pending row is
    ever lost. (One database for every example: each in its own sources.)"""
    model = Model(ns=uuid.uuid4().hex[:10])
    for step in script:
        await check_step(store, model, step)


def old_scope(name: str) -> int:
    """A scope as relaybox wrote it before migration 0038: 64 bits."""
    raw = hashlib.blake2b(name.encode(), digest_size=8, person=b"relaybox-scope").digest()
    return int.from_bytes(raw, "big", signed=True)


def old_fingerprint(fingerprint: bytes) -> bytes:
    """An event key's fingerprint digest as relaybox wrote it before migration 0038."""
    return hashlib.blake2b(fingerprint, digest_size=16, person=b"relaybox-fp").digest()


TYPE_OF = (
    "SELECT data_type FROM information_schema.columns"
    " WHERE table_name = '{}' AND column_name = '{}'"
)


async def test_keys_stored_as_bytea_before_0035_still_decide_as_uuid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A PostgreSQL database migrated up to 0034 holds event and idempotency keys as
    bytea digests (their history rows dropped): 0035 converts them to uuid, the same
    16 bytes, after which a resend is a duplicate, changed content is quarantined and
    a repeated publish finds its message, each under what the old key remembers."""
    from relaybox.store import base

    url = await empty_pg_database()
    every = base.load_migrations
    monkeypatch.setattr(base, "load_migrations", lambda b: [m for m in every(b) if m[0] < 35])
    store = open_store(url)
    try:
        assert not any(m.startswith("0035") for m in await store.migrate())
        [before] = await store.fetch_all(TYPE_OF.format("relaybox_event_keys", "digest"))
        assert before["data_type"] == "bytea"
        stored = hashlib.sha256(b'{"v": 1}').digest()
        # What the accept and the publish of before 0035 wrote: the original inbox
        # row and message are gone (their history dropped), the keys stay.
        conn = await asyncpg.connect(_dsn(url))
        try:
            await conn.execute(
                "INSERT INTO relaybox_event_keys (inbox_id, scope, first_seen, digest, fingerprint)"
                " VALUES (41, $1, $2, $3, $4), (42, $1, $2, $5, $4)",
                old_scope("src"),
                day_of(T0),
                event_digest("src", "acct", "old"),
                old_fingerprint(stored),
                event_digest("src", "acct", "older"),
            )
            await conn.execute(
                "INSERT INTO relaybox_message_keys (scope, first_seen, digest, message_id)"
                " VALUES ($1, $2, $3, 'msg_old')",
                old_scope("t1"),
                day_of(T0),
                message_digest("t1", "order-1"),
            )
        finally:
            await conn.close()
    finally:
        await store.close()

    monkeypatch.setattr(base, "load_migrations", every)
    store = open_store(url)
    try:
        assert "0035_key_digests" in await store.migrate()
        for table, column in (
            ("relaybox_event_keys", "digest"),
            ("relaybox_message_keys", "digest"),
        ):
            [row] = await store.fetch_all(TYPE_OF.format(table, column))
            assert row["data_type"] == "uuid", (table, column)
        rows = await event_keys(store)
        assert [(r["inbox_id"], raw(r["digest"]), r["fingerprint"]) for r in rows] == [
            (41, event_digest("src", "acct", "old"), fingerprint_digest(stored)),
            (42, event_digest("src", "acct", "older"), fingerprint_digest(stored)),
        ]
        later = T0 + 365 * DAY
        again = await accept_one(store, delivery("old", b'{"v": 1}', at=later))
        assert (again.status, again.inbox_id) == ("duplicate", 41)
        changed = await accept_one(store, delivery("old", b'{"v": 2}', at=later))
        assert (changed.status, changed.inbox_id) == ("quarantined", 41)
        # In one batch: a resend, a changed one, a new event and its own resend.
        batch = [
            delivery("older", b'{"v": 1}', at=later),
            delivery("older", b'{"v": 3}', at=later),
            delivery("new", at=later),
            delivery("new", at=later),
        ]
        outcomes = await store.inbox.accept(batch)
        assert statuses(outcomes) == ["duplicate", "quarantined", "accepted", "duplicate"]
        assert [o.inbox_id for o in outcomes[:2]] == [42, 42]
        assert outcomes[3].inbox_id == outcomes[2].inbox_id
        [q1, q2] = await store.fetch_all(
            "SELECT inbox_id, event_id FROM relaybox_quarantine ORDER BY id"
        )
        assert (q1["inbox_id"], q1["event_id"], q2["inbox_id"], q2["event_id"]) == (
            41,
            "old",
            42,
            "older",
        )
        # The repeated publish answers with the message its old key named.
        assert not await publish(store, message("t1", "order-1", 2))
        assert (await by_key(store, "t1", "order-1")).id == "msg_old"
        assert await publish(store, message("t1", "order-2", 3))
        # Expiry by age reaches the converted keys: the resend is then new.
        assert await store.keys.expire("event", day_of(T0) + 1) == 2
        fresh = await accept_one(store, delivery("old", b'{"v": 1}', at=later))
        assert fresh.status == "accepted"
    finally:
        await store.close()
        await drop_pg_database(url)


async def test_the_outbox_keys_expire_by_age(store: Store) -> None:
    """retention.keys_max_age bounds the outbox's keys too (PostgreSQL's tables: a
    handler row's by the day it was first seen, a delivery's by its message's day);
    SQLite keeps each with its row (its UNIQUE), none to forget. A row still stored
    keeps deciding through its own UNIQUE key where the table is not partitioned."""
    d0 = day_of(T0)
    await store.outbox.endpoint_create(endpoint("ep_1"), "s", quota=5, now=T0)
    for i in range(3):
        async with store.transaction() as conn:
            await store.inbox.outbox_insert(
                conn,
                channel="mail",
                key=f"h{i}",
                payload="{}",
                tenant="t1",
                inbox_id=None,
                now=T0 + i * DAY,
            )
            new = NewMessage(new_id("msg", T0 + i * DAY), "t1", "x", None, "{}", T0 + i * DAY)
            assert await store.outbox.message_publish(conn, new, ["ep_1"])
    postgres = store.backend == "postgres"
    with pytest.raises(ValueError, match="no scope"):
        await store.keys.expire("outbox", d0 + 2, scope="t1")
    # two handler keys and two delivery keys (the messages of days d0 and d0 + 1)
    assert await store.keys.expire("outbox", d0 + 2, limit=1) == (4 if postgres else 0)
    assert await store.keys.expire("outbox", d0 + 2) == 0
    if postgres:
        kept = await store.fetch_all("SELECT first_seen FROM relaybox_outbox_keys")
        assert [r["first_seen"] for r in kept] == [d0 + 2]
        days = await store.fetch_all("SELECT day FROM relaybox_delivery_keys")
        assert [r["day"] for r in days] == [d0 + 2]
    async with store.transaction() as conn:
        again = await store.inbox.outbox_insert(
            conn, channel="mail", key="h0", payload="{}", tenant="t1", inbox_id=None, now=T0
        )
    assert again is None  # its row's own UNIQUE (channel, key) still decides
    await sql(store, "DELETE FROM relaybox_outbox WHERE key IN ('h1', 'h2')")
    async with store.transaction() as conn:
        forgotten = await store.inbox.outbox_insert(
            conn, channel="mail", key="h1", payload="{}", tenant="t1", inbox_id=None, now=T0
        )
        kept_key = await store.inbox.outbox_insert(
            conn, channel="mail", key="h2", payload="{}", tenant="t1", inbox_id=None, now=T0
        )
    assert forgotten is not None  # its key expired with its row gone: new again
    assert (kept_key is None) is postgres  # SQLite's key went with its row


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_keys_written_under_0037_convert_and_still_decide(
    backend: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Migration 0038 narrows the keys kept for good: an event key's fingerprint digest
    to its first 8 bytes, every scope to its top 32 bits, an idempotency key's message
    id to 16 bytes when relaybox made it. Keys written under 0037 (their history rows
    gone) then decide as before: a resend is a duplicate, changed content is
    quarantined, a repeated publish finds its message (an id relaybox made, and one
    written by hand), a business key's repeat and reuse are told apart, and the expiry
    of a scope reaches them."""
    from relaybox.store import base

    if backend == "postgres":
        url = await empty_pg_database()
    else:
        url = f"sqlite:///{tmp_path / 'relaybox.db'}"
    every = base.load_migrations
    monkeypatch.setattr(base, "load_migrations", lambda b: [m for m in every(b) if m[0] < 38])
    stored = hashlib.sha256(b'{"v": 1}').digest()
    other = hashlib.sha256(b"x").digest()
    made = new_id("msg", T0)
    day = day_of(T0)
    event_rows = [
        (41, old_scope("src"), day, event_digest("src", "acct", "old"), old_fingerprint(stored)),
        (42, old_scope("src"), day, event_digest("src", "acct", "older"), old_fingerprint(other)),
    ]
    message_rows = [
        (old_scope("t1"), day, message_digest("t1", "order-1"), made),
        (old_scope("t1"), day, message_digest("t1", "order-2"), "order-2-by-hand"),
    ]
    business_row = (operation_digest("op:1"), operation_fingerprint("fp"), old_scope("src"), day)
    store = open_store(url)
    try:
        assert not any(m.startswith("0038") for m in await store.migrate())
        # What the accept, the publish and once() of 0037 wrote; the history is gone.
        if backend == "postgres":
            conn = await asyncpg.connect(_dsn(url))
            try:
                await conn.executemany(
                    "INSERT INTO relaybox_event_keys (inbox_id, scope, first_seen, digest,"
                    " fingerprint) VALUES ($1, $2, $3, encode($4::bytea, 'hex')::uuid,"
                    " encode($5::bytea, 'hex')::uuid)",
                    event_rows,
                )
                await conn.executemany(
                    "INSERT INTO relaybox_message_keys (scope, first_seen, digest, message_id)"
                    " VALUES ($1, $2, encode($3::bytea, 'hex')::uuid, $4)",
                    message_rows,
                )
                await conn.execute(
                    "INSERT INTO relaybox_business_keys (digest, fingerprint, scope, first_seen)"
                    " VALUES (encode($1::bytea, 'hex')::uuid, $2, $3, $4)",
                    *business_row,
                )
            finally:
                await conn.close()
        else:
            async with store.transaction() as c:
                # SQLite keeps its inbox rows (a quarantined newcomer refers to one).
                for inbox_id, event_id, fp in ((41, "old", stored), (42, "older", other)):
                    await c.exec_driver_sql(
                        "INSERT INTO relaybox_inbox (id, source, account, event_id, event_type,"
                        " fingerprint, status, next_attempt_at, received_at, updated_at)"
                        " VALUES (?, 'src', 'acct', ?, 'thing', ?, 'done', ?, ?, ?)",
                        (inbox_id, event_id, fp, T0, T0, T0),
                    )
                for row in event_rows:
                    await c.exec_driver_sql(
                        "INSERT INTO relaybox_event_keys (inbox_id, scope, first_seen, digest,"
                        " fingerprint) VALUES (?, ?, ?, ?, ?)",
                        row,
                    )
                for m_row in message_rows:
                    await c.exec_driver_sql(
                        "INSERT INTO relaybox_message_keys (scope, first_seen, digest, message_id)"
                        " VALUES (?, ?, ?, ?)",
                        m_row,
                    )
                await c.exec_driver_sql(
                    "INSERT INTO relaybox_business_keys (digest, fingerprint, scope, first_seen)"
                    " VALUES (?, ?, ?, ?)",
                    business_row,
                )
    finally:
        await store.close()

    monkeypatch.setattr(base, "load_migrations", every)
    store = open_store(url)
    try:
        assert "0038_narrow_keys" in await store.migrate()
        rows = await event_keys(store)
        assert [(r["inbox_id"], r["scope"], r["fingerprint"]) for r in rows] == [
            (41, scope_of("src"), fingerprint_digest(stored)),
            (42, scope_of("src"), fingerprint_digest(other)),
        ]
        assert scope_of("src") == old_scope("src") >> 32
        found = await store.fetch_all("SELECT * FROM relaybox_message_keys")
        keyed = {raw(k["digest"]): k for k in found}
        assert {message_id(k) for k in keyed.values()} == {made, "order-2-by-hand"}
        assert {k["scope"] for k in keyed.values()} == {scope_of("t1")}
        by_hand = keyed[message_digest("t1", "order-2")]
        assert (by_hand["message_uuid"], by_hand["message_text"]) == (None, "order-2-by-hand")
        if backend == "postgres":  # SQLite before 3.41 cannot unhex: the old ids stay text
            ours = keyed[message_digest("t1", "order-1")]
            assert (raw(ours["message_uuid"]), ours["message_text"]) == (
                bytes.fromhex("00000" + made[4:]),
                None,
            )
        [b] = await store.fetch_all("SELECT * FROM relaybox_business_keys")
        assert (b["scope"], b["fingerprint"]) == (scope_of("src"), operation_fingerprint("fp"))

        later = T0 + 365 * DAY
        again = await accept_one(store, delivery("old", b'{"v": 1}', at=later))
        assert (again.status, again.inbox_id) == ("duplicate", 41)
        changed = await accept_one(store, delivery("old", b'{"v": 2}', at=later))
        assert (changed.status, changed.inbox_id) == ("quarantined", 41)
        outcomes = await store.inbox.accept(
            [delivery("older", b"x", at=later), delivery("older", b"y", at=later)]
        )
        assert [(o.status, o.inbox_id) for o in outcomes] == [
            ("duplicate", 42),
            ("quarantined", 42),
        ]
        assert not await publish(store, message("t1", "order-1", 2))
        assert (await by_key(store, "t1", "order-1")).id == made
        assert not await publish(store, message("t1", "order-2", 2))
        assert (await by_key(store, "t1", "order-2")).id == "order-2-by-hand"
        assert await once(store, "op:1", "fp") == (False, "fp")
        created, answer = await once(store, "op:1", "another")
        assert not created and answer.startswith("<fingerprint digest ")
        # The expiry of a scope reaches the converted keys.
        assert await store.keys.expire("event", day + 1, scope="src") == 2
        assert await store.keys.expire("message", day + 1, scope="t1") == 2
        assert await store.keys.expire("operation", day + 1, scope="src") == 1
        fresh = await accept_one(store, delivery("old", b'{"v": 1}', at=later))
        # Forgotten; SQLite's inbox row, kept, still knows the event by its own key.
        assert fresh.status == ("accepted" if backend == "postgres" else "duplicate")
    finally:
        await store.close()
        if backend == "postgres":
            await drop_pg_database(url)


async def test_a_key_committed_while_0038_waits_is_not_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Migration 0038 copies each keys table into its new form and drops the old one: a
    key that an accept of the previous version commits during the copy would be left in
    the dropped table (a resend of that event then accepted as new). The migration
    locks the three tables before it reads them, so such an accept either commits
    before the copy reads the table or waits for the migration to end."""
    from relaybox.store import base

    url = await empty_pg_database()
    every = base.load_migrations
    monkeypatch.setattr(base, "load_migrations", lambda b: [m for m in every(b) if m[0] < 38])
    store = open_store(url)
    try:
        await store.migrate()
    finally:
        await store.close()
    monkeypatch.setattr(base, "load_migrations", every)
    late = await asyncpg.connect(_dsn(url))
    watch = await asyncpg.connect(_dsn(url))
    store = open_store(url)
    try:
        # An accept of the previous version, its transaction open when the migration starts.
        tx = late.transaction()
        await tx.start()
        await late.execute(
            "INSERT INTO relaybox_event_keys (inbox_id, scope, first_seen, digest, fingerprint)"
            " VALUES ($1, $2, $3, encode($4::bytea, 'hex')::uuid, encode($5::bytea, 'hex')::uuid)",
            7,
            old_scope("src"),
            day_of(T0),
            event_digest("src", "acct", "late"),
            old_fingerprint(hashlib.sha256(b"late").digest()),
        )
        migrating = asyncio.create_task(store.migrate())
        for _ in range(200):  # until the migration waits for the open transaction's lock
            waiting = await watch.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'"
            )
            if waiting:
                break
            await asyncio.sleep(0.05)
        assert waiting, "the migration never waited for the open transaction"
        await tx.commit()
        assert "0038_narrow_keys" in await asyncio.wait_for(migrating, 60)
        rows = await event_keys(store)
        assert [(r["inbox_id"], r["scope"]) for r in rows] == [(7, scope_of("src"))]
        again = await accept_one(store, delivery("late", b"late", at=T0 + DAY))
        assert (again.status, again.inbox_id) == ("duplicate", 7)
    finally:
        await store.close()
        await late.close()
        await watch.close()
        await drop_pg_database(url)
