"""Conformance of the store methods no other file of this suite calls directly, on
SQLite and PostgreSQL: endpoint extras and the credentials sealing pass's page and
compare-and-set, the hold renewal and the start mark riding on a COMMIT, the wake-ups
(``notify`` in a transaction, ``wake`` after one), the accept's row errors and its
warm-up. Last, a guard that every public method of the store is called somewhere in
``tests/store``."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from relaybox.store import NewDelivery, Store, open_store
from relaybox.store.credentials import KEEP
from relaybox.store.postgres import PostgresStore
from relaybox.store.sqlite import SQLiteStore
from tests.conftest import _dsn, free_port
from tests.support.store_rows import endpoint_write as endpoint

T0 = 1_800_000_000.0
SOON = 10.0
"""Seconds a wake-up may take to arrive (it normally takes milliseconds)."""


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    s = open_store(database_url)
    yield s
    await s.close()


def delivery(event_id: str, *, event_type: Any = "thing.happened") -> NewDelivery:
    payload = b'{"n": 1}'
    return NewDelivery(
        source="src",
        account="acct",
        event_id=event_id,
        event_type=event_type,
        tenant="tenant-1",
        fingerprint=hashlib.sha256(payload).digest(),
        payload=payload,
        headers=None,
        version=None,
        received_at=T0,
    )


async def accepted(store: Store, *event_ids: str) -> list[int]:
    outcomes = await store.inbox.accept([delivery(e) for e in event_ids])
    assert [o.status for o in outcomes] == ["accepted"] * len(event_ids)
    return [o.inbox_id for o in outcomes]


async def inbox_row(store: Store, inbox_id: int) -> dict[str, Any]:
    [r] = await store.fetch_all(f"SELECT * FROM relaybox_inbox WHERE id = {int(inbox_id)}")
    return r


async def stored_credentials(store: Store, eid: str) -> tuple[str | None, str | None]:
    [r] = await store.fetch_all(
        f"SELECT credentials_type, credentials FROM relaybox_endpoints WHERE id = '{eid}'"
    )
    return r["credentials_type"], r["credentials"]


# -- endpoint extras and credentials ---------------------------------------------------


async def test_endpoint_extras_write_sets_keeps_and_clears_in_the_callers_transaction(
    store: Store,
) -> None:
    await store.outbox.endpoint_create(endpoint("ep_1"), "whsec_x", quota=5, now=T0)
    await store.outbox.endpoint_create(endpoint("ep_2"), "whsec_y", quota=5, now=T0)
    async with store.transaction() as conn:
        await store.credentials.endpoint_extras_write(
            conn, "ep_1", headers='{"X-Team":"blue"}', credentials=("basic", "sealed:1")
        )
    found = await store.outbox.endpoint_get("ep_1", "t1")
    assert found is not None and (found.headers, found.credentials_type) == (
        {"X-Team": "blue"},
        "basic",
    )
    assert await stored_credentials(store, "ep_1") == ("basic", "sealed:1")
    other = await store.outbox.endpoint_get("ep_2", "t1")  # only the named endpoint changes
    assert other is not None and (other.headers, other.credentials_type) == (None, None)
    # KEEP leaves each one as it is.
    async with store.transaction() as conn:
        await store.credentials.endpoint_extras_write(conn, "ep_1", headers='{"X-Team":"red"}')
    assert await stored_credentials(store, "ep_1") == ("basic", "sealed:1")
    async with store.transaction() as conn:
        await store.credentials.endpoint_extras_write(
            conn, "ep_1", headers=KEEP, credentials=("bearer", "sealed:2")
        )
    found = await store.outbox.endpoint_get("ep_1", "t1")
    assert found is not None and (found.headers, found.credentials_type) == (
        {"X-Team": "red"},
        "bearer",
    )
    # Written in the caller's transaction: a rollback takes it back.
    with pytest.raises(RuntimeError):
        async with store.transaction() as conn:
            await store.credentials.endpoint_extras_write(
                conn, "ep_1", headers=None, credentials=None
            )
            raise RuntimeError("the caller failed")
    assert await stored_credentials(store, "ep_1") == ("bearer", "sealed:2")
    # None clears.
    async with store.transaction() as conn:
        await store.credentials.endpoint_extras_write(conn, "ep_1", headers=None, credentials=None)
    found = await store.outbox.endpoint_get("ep_1", "t1")
    assert found is not None and (found.headers, found.credentials_type) == (None, None)
    assert await stored_credentials(store, "ep_1") == (None, None)


async def test_endpoint_credentials_page_walks_stored_credentials_in_id_order(
    store: Store,
) -> None:
    for eid, credentials in [
        ("ep_d", ("basic", "sealed:d")),
        ("ep_a", ("bearer", "sealed:a")),
        ("ep_b", None),  # nothing stored: never on a page
        ("ep_c", ("basic", "sealed:c")),
        ("ep_e", ("oauth2", "sealed:e")),
    ]:
        await store.outbox.endpoint_create(
            endpoint(eid), "s", quota=10, now=T0, credentials=credentials
        )
    pages: list[list[tuple[str, str]]] = []
    after = ""
    async with store.transaction() as conn:
        for _ in range(5):  # as reseal_credentials walks them (bounded: a bug may loop)
            page = await store.credentials.endpoint_credentials_page(conn, after, 2)
            pages.append(page)
            if len(page) < 2:
                break
            after = page[-1][0]
    assert pages == [
        [("ep_a", "sealed:a"), ("ep_c", "sealed:c")],
        [("ep_d", "sealed:d"), ("ep_e", "sealed:e")],
        [],
    ]
    async with store.transaction() as conn:
        assert await store.credentials.endpoint_credentials_page(conn, "ep_c", 10) == [
            ("ep_d", "sealed:d"),
            ("ep_e", "sealed:e"),
        ]
        assert await store.credentials.endpoint_credentials_page(conn, "ep_e", 10) == []


async def test_endpoint_credentials_swap_is_compare_and_set(store: Store) -> None:
    await store.outbox.endpoint_create(
        endpoint("ep_1"), "s", quota=5, now=T0, credentials=("bearer", "sealed-old-key")
    )
    await store.outbox.endpoint_create(endpoint("ep_2"), "s", quota=5, now=T0)
    async with store.transaction() as conn:
        assert await store.credentials.endpoint_credentials_swap(
            conn, "ep_1", "sealed-old-key", "new-1"
        )
    # The kind stays; only the sealed value changes.
    assert await stored_credentials(store, "ep_1") == ("bearer", "new-1")
    async with store.transaction() as conn:
        # Another pass read the old value and sealed it again meanwhile: no swap.
        assert not await store.credentials.endpoint_credentials_swap(
            conn, "ep_1", "sealed-old-key", "new-2"
        )
        assert not await store.credentials.endpoint_credentials_swap(
            conn, "ep_2", "sealed-old-key", "x"
        )
        assert not await store.credentials.endpoint_credentials_swap(conn, "ep_none", "new-1", "x")
    assert await stored_credentials(store, "ep_1") == ("bearer", "new-1")
    assert await stored_credentials(store, "ep_2") == (None, None)
    # In the caller's transaction: a rollback takes the swap back.
    with pytest.raises(RuntimeError):
        async with store.transaction() as conn:
            assert await store.credentials.endpoint_credentials_swap(conn, "ep_1", "new-1", "new-3")
            raise RuntimeError("the pass failed")
    assert await stored_credentials(store, "ep_1") == ("bearer", "new-1")


# -- processing: hold renewal and the start mark on a COMMIT ----------------------------


async def test_inbox_keep_hold_renews_the_hold_of_claimed_rows(store: Store) -> None:
    """PostgreSQL: the renewed hold keeps other claimers off the rows; rows whose hold is
    not one the worker wrote (rescheduled meanwhile) or that are finished are left
    alone, and rows locked by a transaction are skipped without waiting. SQLite: a batch
    runs in one write transaction, so there is nothing to renew: a no-op."""
    a, b, c, locked = await accepted(store, "a", "b", "c", "locked")
    claim = await store.inbox.claim(now=T0 + 1, limit=10, max_attempts=5, hold=30)
    assert claim.ids == [a, b, c, locked]
    held = T0 + 1 + 30
    async with store.transaction() as conn:  # b rescheduled, c finished meanwhile
        await store.inbox.retry_later(conn, b, at=T0 + 50, error="x", now=T0 + 2)
        await store.inbox.complete(conn, [c], T0 + 2)
    if store.backend == "postgres":
        async with store.transaction() as conn:  # a transaction holds locked's row lock
            await store.inbox.lock(conn, [locked])
            await asyncio.wait_for(
                store.inbox.keep_hold([a, b, c, locked], [T0 + 5, held], T0 + 91), SOON
            )
    else:
        await store.inbox.keep_hold([a, b, c, locked], [T0 + 5, held], T0 + 91)
    due = {i: (await inbox_row(store, i))["next_attempt_at"] for i in (a, b, c, locked)}
    renewed = T0 + 91 if store.backend == "postgres" else held
    assert due == {a: renewed, b: T0 + 50, c: held, locked: held}
    # Once the claim's hold is over, only rows whose hold was renewed stay out of reach.
    later = await store.inbox.claim(now=held + 1, limit=10, max_attempts=5, hold=30)
    if store.backend == "postgres":
        assert later.ids == [locked]
    else:
        assert later.ids == [a, locked]
    # Renewing again names every hold written so far (the claim's and the renewal's).
    await store.inbox.keep_hold([a], [held, T0 + 91], T0 + 200)
    expected = T0 + 200 if store.backend == "postgres" else held + 1 + 30
    assert (await inbox_row(store, a))["next_attempt_at"] == expected


async def test_inbox_start_on_commit_counts_only_with_the_commit_and_as_claimed(
    store: Store,
) -> None:
    """As the worker uses it: in an event's transaction (``event_transaction``, begun by
    ``inbox_begin``; on PostgreSQL the mark rides on the COMMIT), the next claimed
    row's attempt is counted only if that transaction commits, and only while the row
    is still pending at the attempts it was claimed with; the next ``inbox_begin`` with
    ``attempts + 1`` tells whether it was."""
    a, b, c = await accepted(store, "a", "b", "c")
    claim = await store.inbox.claim(now=T0 + 1, limit=10, max_attempts=5, hold=30)
    assert [claim.events[i].attempts for i in (a, b, c)] == [0, 0, 0]
    assert await store.inbox.start([a], T0 + 1) == {a: 1}
    async with store.engine.connect() as conn:
        with pytest.raises(RuntimeError):
            async with store.inbox.event_transaction(conn):
                assert await store.inbox.begin(conn, a, attempt=1, now=T0 + 2)
                await store.inbox.start_on_commit(conn, b, attempts=0, now=T0 + 2)
                raise RuntimeError("the handler failed")
    rolled_back = await inbox_row(store, b)
    assert (rolled_back["attempts"], rolled_back["started_at"]) == (0, None)
    # (SQLite has one connection: the rows are read with it given back.)
    async with store.engine.connect() as conn:
        async with store.inbox.event_transaction(conn):  # committed this time
            assert await store.inbox.begin(conn, a, attempt=1, now=T0 + 3)
            await store.inbox.start_on_commit(conn, b, attempts=0, now=T0 + 3)
    counted = await inbox_row(store, b)
    assert (counted["status"], counted["attempts"], counted["started_at"]) == (
        "pending",
        1,
        T0 + 3,
    )
    assert (await inbox_row(store, a))["status"] == "done"
    # Not as claimed any more: b started since (attempts 1), a is done. Nothing counts.
    async with store.transaction() as conn:
        await store.inbox.start_on_commit(conn, b, attempts=0, now=T0 + 4)
        await store.inbox.start_on_commit(conn, a, attempts=1, now=T0 + 4)
    assert (await inbox_row(store, b))["attempts"] == 1
    done = await inbox_row(store, a)
    assert (done["status"], done["attempts"]) == ("done", 1)
    # In a transaction the caller began itself the mark counts the same way.
    async with store.transaction() as conn:
        await store.inbox.start_on_commit(conn, c, attempts=0, now=T0 + 5)
    assert (await inbox_row(store, c))["attempts"] == 1
    # inbox_begin at attempts + 1 is this worker's: each row was counted once, not twice.
    async with store.engine.connect() as conn:
        async with store.inbox.event_transaction(conn):
            assert await store.inbox.begin(conn, b, attempt=1, now=T0 + 6)
        async with store.inbox.event_transaction(conn):
            assert not await store.inbox.begin(conn, c, attempt=2, now=T0 + 6)
    assert (await inbox_row(store, b))["status"] == "done"
    assert (await inbox_row(store, c))["status"] == "pending"


# -- wake-ups ---------------------------------------------------------------------------


async def _backend(conn: Any) -> int:
    """The PostgreSQL server process of ``conn`` (a notification names it)."""
    return int((await conn.exec_driver_sql("SELECT pg_backend_pid()")).scalar_one())


async def test_notify_wakes_listeners_when_the_transaction_commits(
    store: Store, database_url: str
) -> None:
    """PostgreSQL: a NOTIFY in the transaction, sent by its COMMIT only: never after a
    rollback, and not while the transaction is open (a notification committed by
    another transaction meanwhile arrives alone). Notifications reach a listener in
    commit order, each naming the server process that sent it, so once the other
    transaction's has arrived nothing else was sent before it. SQLite: the only other
    writer is in this process and waits for the write lock, so the in-process signal
    is set at once."""
    woken = asyncio.Event()
    listener = await store.db.listen("outbox", woken)
    assert listener is not None
    try:
        if store.backend == "postgres":
            senders: list[int] = []
            arrived = asyncio.Event()

            def heard(_conn: object, pid: int, _channel: str, _payload: object) -> None:
                senders.append(pid)
                arrived.set()

            async def heard_from(pid: int) -> None:
                while pid not in senders:
                    arrived.clear()
                    await asyncio.wait_for(arrived.wait(), SOON)

            raw = await asyncpg.connect(_dsn(database_url))
            await raw.add_listener("relaybox_outbox", heard)
            try:
                with pytest.raises(RuntimeError):
                    async with store.transaction() as conn:
                        await store.db.notify(conn, "outbox")
                        raise RuntimeError("rolled back")
                async with store.transaction() as conn:
                    await store.db.notify(conn, "outbox")
                    sender = await _backend(conn)
                    async with store.transaction() as other:
                        await store.db.notify(other, "outbox")
                        meanwhile = await _backend(other)
                    await heard_from(meanwhile)
                    assert senders == [meanwhile]
                await heard_from(sender)
                assert senders == [meanwhile, sender]
            finally:
                await raw.close()
        else:
            assert isinstance(store, SQLiteStore)
            store.db.wakeup("outbox").clear()
            async with store.transaction() as conn:
                await store.db.notify(conn, "outbox")
                assert store.db.wakeup("outbox").is_set()
        await asyncio.wait_for(woken.wait(), SOON)  # and the store's own listener woke
    finally:
        await listener.close()


async def test_wake_wakes_listeners_of_each_channel_named(store: Store) -> None:
    """Rows committed already (no transaction open): every channel named wakes its
    listeners; on PostgreSQL the NOTIFYs of channels woken together are coalesced into
    one statement after the call returns."""
    async with store.transaction() as conn:  # a row committed without a notify
        await store.inbox.outbox_insert(
            conn, channel="email", key="k", payload="{}", tenant=None, inbox_id=None, now=T0
        )
    inbox, outbox = asyncio.Event(), asyncio.Event()
    listeners = [await store.db.listen("inbox", inbox), await store.db.listen("outbox", outbox)]
    try:
        if isinstance(store, SQLiteStore):
            store.db.wakeup("inbox").clear()
            store.db.wakeup("outbox").clear()
            store.db.wake("outbox")
            assert store.db.wakeup("outbox").is_set() and not store.db.wakeup("inbox").is_set()
        else:
            store.db.wake("outbox")
        await asyncio.wait_for(outbox.wait(), SOON)
        outbox.clear()
        store.db.wake("inbox")
        store.db.wake("outbox")
        await asyncio.wait_for(asyncio.gather(inbox.wait(), outbox.wait()), SOON)
    finally:
        for listener in listeners:
            assert listener is not None
            await listener.close()


async def test_sqlite_wakeup_is_one_signal_per_channel(tmp_path: Path) -> None:
    """``Backend.wakeup``: the in-process signal of a channel, made on first use and
    the same one afterwards; what ``wake``, ``notify`` and the accept set."""
    store = open_store(f"sqlite:///{tmp_path / 'relaybox.db'}")
    await store.migrate()
    try:
        assert isinstance(store, SQLiteStore)
        inbox = store.db.wakeup("inbox")
        assert store.db.wakeup("inbox") is inbox and store.db.wakeup("outbox") is not inbox
        assert not inbox.is_set()
        await accepted(store, "a")
        assert inbox.is_set() and not store.db.wakeup("outbox").is_set()
    finally:
        await store.close()


# -- accept: row errors and the warm-up ---------------------------------------------------


async def test_row_error_tells_a_rows_values_from_the_database_being_away(
    store: Store, database_url: str, tmp_path: Path
) -> None:
    """What ``inbox_accept`` raises for a row it cannot store (the acceptor then commits
    the batch's rows apart) against what it raises when the database cannot be
    reached (every delivery of the batch gets 503)."""
    refused: list[BaseException] = []
    for bad in (
        delivery("surrogate", event_type="\ud800"),  # cannot be encoded
        delivery("missing", event_type=None),  # NOT NULL
        *([delivery("nul", event_type="a\x00b")] if store.backend == "postgres" else []),
    ):
        with pytest.raises(Exception) as raised:
            await store.inbox.accept([bad])
        refused.append(raised.value)
    assert [store.inbox.row_error(e) for e in refused] == [True] * len(refused), refused
    assert await store.fetch_all("SELECT id FROM relaybox_inbox") == []
    if store.backend == "postgres":
        away = open_store(f"postgresql://postgres@127.0.0.1:{free_port()}/relaybox")
    else:
        away = open_store(f"sqlite:///{tmp_path / 'no-such-folder' / 'relaybox.db'}")
    try:
        with pytest.raises(Exception) as raised:
            await away.inbox.accept([delivery("a")])
        assert not store.inbox.row_error(raised.value), raised.value
    finally:
        await away.close()
    assert store.inbox.row_error(TypeError("not a str")) and store.inbox.row_error(ValueError("x"))
    for exc in (ConnectionResetError(), TimeoutError(), OSError("disk"), RuntimeError()):
        assert not store.inbox.row_error(exc), exc
    if store.backend == "postgres":  # classes 22, 23 and 54 are a row's; others are not
        assert store.inbox.row_error(asyncpg.exceptions.StringDataRightTruncationError("22001"))
        assert store.inbox.row_error(asyncpg.exceptions.UniqueViolationError("23505"))
        assert store.inbox.row_error(asyncpg.exceptions.ProgramLimitExceededError("54000"))
        for exc in (
            asyncpg.exceptions.DeadlockDetectedError("40P01"),
            asyncpg.exceptions.AdminShutdownError("57P01"),
            asyncpg.exceptions.QueryCanceledError("57014"),
            asyncpg.exceptions.TooManyConnectionsError("53300"),
        ):
            assert not store.inbox.row_error(exc), exc


async def test_warm_accept_opens_the_accepts_connections_beforehand(store: Store) -> None:
    """PostgreSQL: the accept's pool holds one connection per committer (up to its
    size) with the accept's statement prepared on each, waiting for the accept's
    uses (the store's idle connections), and the first accept opens none; it inserts
    nothing. SQLite: nothing to open, and nothing changes."""
    await store.inbox.warm_accept(3)
    assert await store.fetch_all("SELECT id FROM relaybox_inbox") == []
    if isinstance(store, PostgresStore):
        pool = await store.db.generic_pool()
        assert pool.get_size() == 3
        statement = store.db.q["inbox_accept_fast"]
        async with contextlib.AsyncExitStack() as uses:  # three uses at once: all three
            held = [await uses.enter_async_context(store.db.borrow(pool)) for _ in range(3)]
            assert pool.get_size() == 3 and len(set(held)) == 3
            for conn in held:
                prepared = await conn.fetchval(
                    "SELECT count(*) FROM pg_prepared_statements WHERE statement = $1",
                    statement,
                )
                assert prepared == 1
        await accepted(store, "a", "b")
        assert pool.get_size() == 3
        await store.inbox.warm_accept(100)  # never more than the pool's size
        assert pool.get_size() == pool.get_max_size()
    else:
        await accepted(store, "a", "b")
    assert len(await store.fetch_all("SELECT id FROM relaybox_inbox")) == 2


async def test_pg_pools_are_made_once_with_their_settings(pg_url: str) -> None:
    """``PostgresStore``'s own asyncpg pools: concurrent first callers share one pool;
    ``start_pool`` commits without waiting for the flush and forces generic plans
    (claims, start marks, holds, wakes), ``generic_pool`` forces generic plans without
    bitmap scans, ``raw_pool`` keeps the server's defaults."""
    store = open_store(pg_url)
    names = ("synchronous_commit", "plan_cache_mode", "enable_bitmapscan")
    query = "SELECT " + ", ".join(f"current_setting('{n}') AS {n}" for n in names)
    try:
        assert isinstance(store, PostgresStore)
        [defaults] = await store.fetch_all(query)  # the engine's connections: as configured
        for make, changed in [
            (store.db.raw_pool, {}),
            (
                store.db.start_pool,
                {"synchronous_commit": "off", "plan_cache_mode": "force_generic_plan"},
            ),
            (
                store.db.generic_pool,
                {"plan_cache_mode": "force_generic_plan", "enable_bitmapscan": "off"},
            ),
        ]:
            first, second = await asyncio.gather(make(), make())
            assert first is second and await make() is first
            async with first.acquire() as conn:
                found = dict(await conn.fetchrow(query))
            assert found == {**defaults, **changed}, make
        pools = [
            await store.db.raw_pool(),
            await store.db.start_pool(),
            await store.db.generic_pool(),
        ]
        assert len({id(pool) for pool in pools}) == 3
    finally:
        await store.close()


# -- the guard ---------------------------------------------------------------------------


def _public(cls: type) -> set[str]:
    return {
        name
        for name, value in inspect.getmembers(cls)
        if not name.startswith("_")
        and (inspect.isfunction(value) or inspect.ismethod(value) or isinstance(value, property))
    }


def _areas() -> dict[str, set[type]]:
    """The classes of each area of a store, both backends. (Not ``db``: the backend's
    methods are the areas' primitives, exercised through them.)"""
    found: dict[str, set[type]] = {}
    for store in (SQLiteStore("sqlite:///:memory:"), PostgresStore("postgresql://x@localhost/x")):
        for name, value in vars(store).items():
            if not name.startswith("_") and name != "db":
                found.setdefault(name, set()).update(type(value).__mro__[:-1])
    return found


def test_every_store_method_is_exercised_by_the_conformance_suite() -> None:
    """Every public method and property of ``Store``, of the backends and of each area
    of the store, is named somewhere in ``tests/store``. A textual check: ``.name``
    must appear in a test file's text (a comment naming it passes too), so it proves a
    method is not forgotten, not that its test is any good."""
    names = {(None, n) for n in _public(Store) | _public(PostgresStore) | _public(SQLiteStore)}
    for area, classes in _areas().items():
        names |= {(area, n) for cls in classes for n in _public(cls)}
    assert len(names) > 150  # the introspection found the store's methods
    text = "\n".join(p.read_text() for p in sorted(Path(__file__).parent.glob("test_*.py")))
    missing = sorted(
        f"{area}.{n}" if area else n for area, n in names if not re.search(rf"\.{n}\b", text)
    )
    assert missing == [], f"no test in tests/store calls: {', '.join(missing)}"
