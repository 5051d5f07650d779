"""The worker in-process with a frozen clock, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import sqlite3
import time
from contextlib import redirect_stderr
from typing import Any

import aiohttp
import asyncpg
import pytest
import stripe
from sqlalchemy import text
from sqlalchemy.engine import make_url

from relaybox import (
    Backoff,
    Context,
    FrozenClock,
    OperationConflict,
    PermanentError,
    Relaybox,
    Secret,
    sources,
)
from relaybox.config import Settings, WorkerSettings
from relaybox.log import configure_logging
from relaybox.store import NewDelivery
from relaybox.store.inbox_rows import NewOperation
from tests.conftest import Served
from tests.support.procs import wait_until


def delivery(clock: FrozenClock, event_id: str, event_type: str, body: Any) -> NewDelivery:
    raw = json.dumps(body).encode()
    return NewDelivery(
        source="s",
        account="a",
        event_id=event_id,
        event_type=event_type,
        tenant="t",
        fingerprint=hashlib.sha256(raw).digest(),
        payload=raw,
        headers=None,
        version=None,
        received_at=clock.now(),
    )


async def rows(box: Relaybox) -> dict[str, dict[str, Any]]:
    found = await box.store.fetch_all(
        "SELECT event_id, status, dead_reason, attempts, last_error FROM relaybox_inbox"
    )
    return {r["event_id"]: r for r in found}


async def test_failing_event_rolls_back_only_its_savepoint(
    box: Relaybox, clock: FrozenClock
) -> None:
    async with box.store.transaction() as conn:
        await conn.execute(text("CREATE TABLE effects (name TEXT PRIMARY KEY)"))

    @box.handler("s", "*")
    async def handler(ctx: Context) -> None:
        await ctx.conn.execute(text("INSERT INTO effects VALUES (:n)"), {"n": ctx.event.event_id})
        await ctx.once(f"op:{ctx.event.event_id}")
        await ctx.outbox.add("email", f"op:{ctx.event.event_id}", {"n": 1})
        if ctx.event.event_type == "fail":
            raise RuntimeError("transient")

    await box.store.inbox.accept(
        [
            delivery(clock, "ok1", "ok", {}),
            delivery(clock, "bad", "fail", {}),
            delivery(clock, "ok2", "ok", {}),
        ]
    )
    assert await box.worker().run_once() == 3
    state = await rows(box)
    assert [state[k]["status"] for k in ("ok1", "bad", "ok2")] == ["done", "pending", "done"]
    assert "RuntimeError: transient" in state["bad"]["last_error"]
    effects = await box.store.fetch_all("SELECT name FROM effects ORDER BY name")
    assert [e["name"] for e in effects] == ["ok1", "ok2"]
    ops = await box.store.fetch_all("SELECT business_key FROM relaybox_operations ORDER BY 1")
    assert [o["business_key"] for o in ops] == ["op:ok1", "op:ok2"]
    outbox = await box.store.fetch_all("SELECT key FROM relaybox_outbox ORDER BY 1")
    assert [o["key"] for o in outbox] == ["op:ok1", "op:ok2"]


async def test_a_handler_that_hangs_is_cancelled_and_its_attempt_retried(
    box: Relaybox, clock: FrozenClock
) -> None:
    """A handler that hangs after its first statement (a call without a timeout of its
    own) is cancelled past ``worker.handler_timeout``: its statements roll back, the
    others of its group commit, and the event is retried and done at its next attempt."""
    box.settings.worker.handler_timeout = 0.5
    async with box.store.transaction() as conn:
        await conn.execute(text("CREATE TABLE effects (name TEXT PRIMARY KEY)"))
    forever = asyncio.Event()

    @box.handler("s", "*")
    async def handler(ctx: Context) -> None:
        await ctx.conn.execute(text("INSERT INTO effects VALUES (:n)"), {"n": ctx.event.event_id})
        if ctx.event.event_type == "hang" and ctx.event.attempts == 1:
            await forever.wait()

    await box.store.inbox.accept(
        [delivery(clock, "ok1", "ok", {}), delivery(clock, "stuck", "hang", {})]
    )
    started = time.monotonic()
    assert await asyncio.wait_for(box.worker().run_once(), 20) == 2
    assert time.monotonic() - started < 10
    state = await rows(box)
    assert (state["ok1"]["status"], state["stuck"]["status"]) == ("done", "pending")
    assert "HandlerTimeout" in state["stuck"]["last_error"]
    assert "worker.handler_timeout (0.5 s)" in state["stuck"]["last_error"]
    effects = await box.store.fetch_all("SELECT name FROM effects ORDER BY name")
    assert [e["name"] for e in effects] == ["ok1"]

    clock.advance(3600)
    assert await box.worker().run_once() == 1
    state = await rows(box)
    assert (state["stuck"]["status"], state["stuck"]["attempts"]) == ("done", 2)


async def test_a_handler_on_the_driver_connection_commits_and_rolls_back_with_its_event(
    box: Relaybox, clock: FrozenClock
) -> None:
    """``ctx.driver`` is the driver's connection in the handler's transaction: a write
    through it commits with the event's completion, and rolls back with a failing
    handler (on PostgreSQL inside a group, which runs again with savepoints)."""
    async with box.store.transaction() as conn:
        await conn.execute(text("CREATE TABLE effects (name TEXT PRIMARY KEY)"))
    sqlite = box.store.db.single_writer
    drivers: set[str] = set()

    @box.handler("s", "*")
    async def handler(ctx: Context) -> None:
        drivers.add(type(ctx.driver).__module__.split(".")[0])
        if sqlite:
            await ctx.driver.execute("INSERT INTO effects VALUES (?)", (ctx.event.event_id,))
        else:
            await ctx.driver.execute("INSERT INTO effects VALUES ($1)", ctx.event.event_id)
        await ctx.once(f"op:{ctx.event.event_id}")
        if ctx.event.event_type == "fail":
            raise RuntimeError("transient")

    await box.store.inbox.accept(
        [delivery(clock, n, "fail" if n == "bad" else "ok", {}) for n in ("ok1", "bad", "ok2")]
    )
    assert await box.worker().run_once() == 3
    assert drivers == {"aiosqlite" if sqlite else "asyncpg"}
    state = await rows(box)
    assert [state[k]["status"] for k in ("ok1", "bad", "ok2")] == ["done", "pending", "done"]
    effects = await box.store.fetch_all("SELECT name FROM effects ORDER BY name")
    assert [e["name"] for e in effects] == ["ok1", "ok2"]


async def test_backoff_schedule_follows_the_settings(box: Relaybox, clock: FrozenClock) -> None:
    box.settings.worker.backoff_jitter = 0.0
    box.settings.worker.backoff_base = 2.0
    box.settings.worker.max_attempts = 4
    calls = 0

    @box.handler("s")
    async def flaky(ctx: Context) -> None:
        nonlocal calls
        calls += 1
        raise ConnectionError("upstream down")

    await box.store.inbox.accept([delivery(clock, "e", "x", {})])
    worker = box.worker()
    expected_delays = [2.0, 4.0, 8.0]
    for delay in expected_delays:
        await worker.run_once()
        [row] = await box.store.fetch_all("SELECT next_attempt_at, status FROM relaybox_inbox")
        assert row["status"] == "pending"
        assert row["next_attempt_at"] == clock.now() + delay
        clock.advance(delay - 0.001)
        assert await worker.run_once() == 0  # not due yet: nothing claimed
        clock.advance(0.001)
    await worker.run_once()
    state = (await rows(box))["e"]
    assert (state["status"], state["dead_reason"], state["attempts"]) == ("dead", "exhausted", 4)
    assert calls == 4
    attempts = await box.store.fetch_all(
        "SELECT attempt, outcome FROM relaybox_inbox_attempts ORDER BY attempt"
    )
    assert [(a["attempt"], a["outcome"]) for a in attempts] == [
        (1, "retry"),
        (2, "retry"),
        (3, "retry"),
        (4, "exhausted"),
    ]


async def test_permanent_error_and_conflict_go_to_dead_letters(
    box: Relaybox, clock: FrozenClock
) -> None:
    @box.handler("s", "invalid")
    async def invalid(ctx: Context) -> None:
        raise PermanentError("invoice is not eligible")

    @box.handler("s", "op")
    async def op(ctx: Context) -> None:
        await ctx.once("shared-key", fingerprint=ctx.payload["fp"])

    await box.store.inbox.accept(
        [
            delivery(clock, "i", "invalid", {}),
            delivery(clock, "o1", "op", {"fp": "amount=100"}),
            delivery(clock, "o2", "op", {"fp": "amount=100"}),
            delivery(clock, "o3", "op", {"fp": "amount=999"}),
            delivery(clock, "u", "unknown", {}),
        ]
    )
    box.handler("t")(op)  # unrelated registration must not match source "s"
    await box.worker(concurrency=1).run_once()  # in id order: o1 records the key first
    state = await rows(box)
    assert (state["i"]["status"], state["i"]["dead_reason"]) == ("dead", "invalid")
    assert state["i"]["last_error"] == "invoice is not eligible"
    assert state["o1"]["status"] == state["o2"]["status"] == "done"
    assert (state["o3"]["status"], state["o3"]["dead_reason"]) == ("dead", "conflict")
    assert "amount=999" in state["o3"]["last_error"]
    assert (state["u"]["status"], state["u"]["dead_reason"]) == ("dead", "unhandled")


async def test_once_raises_a_clear_conflict(box: Relaybox, clock: FrozenClock) -> None:
    seen: list[BaseException] = []

    @box.handler("s")
    async def handler(ctx: Context) -> None:
        await ctx.once("k", fingerprint="a")
        try:
            await ctx.once("k", fingerprint="b")
        except OperationConflict as exc:
            seen.append(exc)

    await box.store.inbox.accept([delivery(clock, "e", "x", {})])
    await box.worker().run_once()
    assert "'k'" in str(seen[0]) and "different operation" in str(seen[0])


async def test_a_completed_row_is_never_overwritten(box: Relaybox, clock: FrozenClock) -> None:
    """A late worker that still holds a claim finds the row done and leaves it."""

    @box.handler("s")
    async def handler(ctx: Context) -> None:
        await ctx.once("grant")

    await box.store.inbox.accept([delivery(clock, "e", "x", {})])
    claim = await box.store.inbox.claim(now=clock.now(), limit=10, max_attempts=5, hold=30)
    await box.worker().run_once()  # nothing due: the row is held by the first claim
    clock.advance(31)
    await box.worker().run_once()  # the hold expired: a second worker completes it
    async with box.store.transaction() as conn:  # the first (late) worker resumes
        assert await box.store.inbox.lock(conn, claim.ids) == []
        await box.store.inbox.retry_later(conn, claim.ids[0], at=0, error="late", now=clock.now())
        await box.store.inbox.kill(
            conn, claim.ids[0], reason="invalid", error="late", now=clock.now()
        )
    state = (await rows(box))["e"]
    assert (state["status"], state["last_error"]) == ("done", None)


@pytest.mark.parametrize("others", [0, 2])
@pytest.mark.parametrize("counted_by", ["claim", "start"])
async def test_a_row_completed_after_its_claim_is_left_out(
    box: Relaybox,
    clock: FrozenClock,
    monkeypatch: pytest.MonkeyPatch,
    others: int,
    counted_by: str,
) -> None:
    """Another worker completed the claim's first row before this one ran it: whether
    the claim counted its attempt (chains free for it, PostgreSQL) or its start mark
    does (the chain's first event counted with the rest of its group), that row is
    left alone and the others run."""
    handled: list[str] = []

    @box.handler("s")
    async def handler(ctx: Context) -> None:
        handled.append(ctx.event.event_id)

    names = ["a", *(f"b{i}" for i in range(others))]
    await box.store.inbox.accept([delivery(clock, n, "x", {"n": n}) for n in names])

    async def complete_a(now: float) -> None:
        async with box.store.transaction() as conn:
            await conn.execute(
                text("UPDATE relaybox_inbox SET status = 'done', done_at = :now"
                     " WHERE event_id = 'a'"),
                {"now": now},
            )  # fmt: skip

    worker = box.worker()
    if counted_by == "claim":
        claim = box.store.inbox.claim

        async def claimed_then_completed(**kwargs: Any) -> Any:
            found = await claim(**kwargs)
            await complete_a(kwargs["now"])
            return found

        monkeypatch.setattr(box.store.inbox, "claim", claimed_then_completed)
    else:
        monkeypatch.setattr(worker, "_room", lambda: 0)  # no chain free at the claim
        start = box.store.inbox.start

        async def completed_first(ids: list[int], now: float) -> dict[int, int]:
            await complete_a(now)
            return await start(ids, now)  # type: ignore[no-any-return]

        monkeypatch.setattr(box.store.inbox, "start", completed_first)
    assert await worker.run_once() == len(names)
    assert sorted(handled) == names[1:]
    state = await rows(box)
    assert state["a"]["status"] == "done"
    assert {n: (state[n]["status"], state[n]["attempts"]) for n in names[1:]} == {
        n: ("done", 1) for n in names[1:]
    }


async def test_handler_resolution_prefers_the_most_specific(box: Relaybox) -> None:
    async def a(ctx: Context) -> None: ...
    async def b(ctx: Context) -> None: ...
    async def c(ctx: Context) -> None: ...

    box.handler("*")(a)
    box.handler("stripe", "invoice.*")(b)
    box.handler("stripe", "invoice.paid")(c)
    assert box.handler_for("stripe", "invoice.paid") is c
    assert box.handler_for("stripe", "invoice.voided") is b
    assert box.handler_for("github", "push") is a


def test_backoff_caps_and_jitters() -> None:
    b = Backoff(base=1, factor=2, cap=10, jitter=0.2, max_attempts=20, max_age=1000)
    import random

    rng = random.Random(7)
    delays = [b.delay(n, rng) for n in range(1, 10)]
    assert all(
        0.8 * min(10, 2 ** (n - 1)) <= d <= 1.2 * min(10, 2 ** (n - 1))
        for n, d in zip(range(1, 10), delays, strict=True)
    )
    assert max(delays) <= 12
    assert b.next_attempt(attempt=20, received_at=0, now=0) is None
    assert b.next_attempt(attempt=1, received_at=0, now=999.5, rng=rng) is None  # time budget


async def test_logs_carry_keys_and_never_the_payload(box: Relaybox, clock: FrozenClock) -> None:
    @box.handler("s")
    async def handler(ctx: Context) -> None:
        await ctx.once("s:a:inv_1:initial-credit-grant")

    await box.store.inbox.accept([delivery(clock, "evt_log", "x", {"card": "4242-SECRET"})])
    out = io.StringIO()
    with redirect_stderr(out):
        configure_logging("info", json=True)
        await box.worker().run_once()
    configure_logging("info", json=False)
    lines = [json.loads(line) for line in out.getvalue().splitlines() if line.startswith("{")]
    [done] = [line for line in lines if line["event"] == "event_done"]
    assert done["event_key"] == ["s", "a", "evt_log"]
    assert done["business_keys"] == ["s:a:inv_1:initial-credit-grant"]
    assert "4242-SECRET" not in out.getvalue()


async def test_inline_source_answers_after_the_handler_committed(box: Relaybox) -> None:
    secret = "whsec_inline"
    box.clock = __import__("relaybox").SystemClock()
    box.source("inline", sources.stripe(secrets=[Secret(secret, account="acct")], inline=True))
    async with box.store.transaction() as conn:
        await conn.execute(text("CREATE TABLE grants (invoice TEXT PRIMARY KEY)"))

    @box.handler("inline", "invoice.paid")
    async def grant(ctx: Context) -> None:
        invoice = ctx.payload["data"]["object"]["id"]
        if await ctx.once(f"inline:{invoice}"):
            await ctx.conn.execute(text("INSERT INTO grants VALUES (:i)"), {"i": invoice})
        if invoice == "in_fail":
            raise RuntimeError("handler failed inline")

    async def send(event_id: str, invoice: str) -> int:
        body = json.dumps(
            {"id": event_id, "type": "invoice.paid", "data": {"object": {"id": invoice}}}
        ).encode()
        t = int(time.time())
        sig = stripe.WebhookSignature._compute_signature(f"{t}.{body.decode()}", secret)
        async with http.post(
            "/inline", data=body, headers={"stripe-signature": f"t={t},v1={sig}"}
        ) as r:
            return r.status

    async with Served(box.receiver) as server, aiohttp.ClientSession(server.url) as http:
        assert await send("evt_1", "in_ok") == 200
        assert await send("evt_2", "in_fail") == 200  # nothing lost: stored as pending
    state = await rows(box)
    assert state["evt_1"]["status"] == "done"  # no worker ran: the handler ran inline
    assert state["evt_2"]["status"] == "pending"
    assert "handler failed inline" in state["evt_2"]["last_error"]
    grants = await box.store.fetch_all("SELECT invoice FROM grants")
    assert [g["invoice"] for g in grants] == ["in_ok"]  # the failed effect rolled back


async def outside(box: Relaybox, sql: str) -> dict[str, Any]:
    """Committed state, read on a connection of its own (SQLite's pool has one)."""
    url = make_url(box.store.url)
    if box.store.backend == "sqlite":
        with contextlib.closing(sqlite3.connect(url.database)) as db:
            found = db.execute(sql).fetchall()
    else:
        conn = await asyncpg.connect(url.set(drivername="postgresql").render_as_string(False))
        try:
            found = await conn.fetch(sql)
        finally:
            await conn.close()
    return {r[0]: tuple(r[1:]) for r in found}


@pytest.mark.parametrize("group", [1, 3])
async def test_attempts_are_counted_as_events_start_never_while_they_wait(
    box: Relaybox, clock: FrozenClock, group: int
) -> None:
    """One event at a time (concurrency 1), whatever the grouping: when a handler runs,
    its own attempt is already committed (seen from another connection) and the
    events after it are not charged yet. On PostgreSQL with one event per
    transaction the next event's start mark rides on the previous COMMIT."""
    seen: dict[str, dict[str, Any]] = {}
    order: list[str] = []

    @box.handler("s")
    async def handler(ctx: Context) -> None:
        order.append(ctx.event.event_id)
        seen[ctx.event.event_id] = await outside(
            box, "SELECT event_id, attempts, started_at IS NOT NULL FROM relaybox_inbox"
        )
        assert ctx.event.attempts == 1
        if ctx.event.event_id == "e2":
            raise RuntimeError("e2 fails once")

    await box.store.inbox.accept([delivery(clock, f"e{i}", "x", {}) for i in range(1, 4)])
    worker = box.worker(concurrency=1, group=group)
    assert await worker.run_once() == 3
    if group > 1 and box.store.backend == "postgres":
        # No savepoints until a handler fails: e2's failure rolls the group back and it
        # runs again with one savepoint each, e2 keeping its outcome (not run again).
        assert order == ["e1", "e2", "e1", "e3"]
    else:
        assert order == ["e1", "e2", "e3"]
    if group == 1:
        assert seen["e1"] == {"e1": (1, True), "e2": (0, False), "e3": (0, False)}
        assert seen["e2"] == {"e1": (1, False), "e2": (1, True), "e3": (0, False)}
        assert seen["e3"] == {"e1": (1, False), "e2": (1, False), "e3": (1, True)}
    else:  # one transaction for the group: the group starts together
        assert all(s == {f"e{i}": (1, True) for i in (1, 2, 3)} for s in seen.values())
    state = await rows(box)
    assert {e: (r["status"], r["attempts"]) for e, r in state.items()} == {
        "e1": ("done", 1),
        "e2": ("pending", 1),
        "e3": ("done", 1),
    }
    started = await outside(box, "SELECT event_id, started_at FROM relaybox_inbox")
    assert started == {"e1": (None,), "e2": (None,), "e3": (None,)}  # outcomes recorded


async def test_a_row_started_again_elsewhere_is_left_to_that_worker(
    box: Relaybox, clock: FrozenClock
) -> None:
    """The row's completion is fenced by the attempt this worker counted: if another
    worker counted one more meanwhile (its hold ran out), this one does not run it."""
    ran: list[int] = []

    @box.handler("s")
    async def handler(ctx: Context) -> None:
        ran.append(ctx.event.attempts)

    await box.store.inbox.accept([delivery(clock, "e", "x", {})])
    claim = await box.store.inbox.claim(now=clock.now(), limit=1, max_attempts=5, hold=0)
    [inbox_id] = claim.ids
    assert await box.store.inbox.start([inbox_id], clock.now()) == {inbox_id: 1}
    async with box.store.transaction() as conn:
        assert not await box.store.inbox.begin(conn, inbox_id, attempt=2, now=clock.now())
    async with box.store.transaction() as conn:  # the worker that counted attempt 1
        assert await box.store.inbox.begin(conn, inbox_id, attempt=1, now=clock.now())
    assert (await rows(box))["e"]["status"] == "done"
    assert await box.worker().run_once() == 0 and ran == []


async def test_a_rolled_back_begin_leaves_the_row_pending_and_the_connection_usable(
    box: Relaybox, clock: FrozenClock
) -> None:
    await box.store.inbox.accept([delivery(clock, f"e{i}", "x", {}) for i in (1, 2)])
    ids = (await box.store.inbox.claim(now=clock.now(), limit=2, max_attempts=5, hold=30)).ids
    await box.store.inbox.start(ids, clock.now())
    async with box.store.engine.connect() as conn:
        with pytest.raises(RuntimeError):
            async with conn.begin():
                assert await box.store.inbox.begin(conn, ids[0], attempt=1, now=clock.now())
                await box.store.inbox.start_on_commit(conn, ids[1], attempts=1, now=clock.now())
                raise RuntimeError("the handler failed")
        async with conn.begin():  # the same connection, a new transaction
            assert await box.store.inbox.begin(conn, ids[1], attempt=1, now=clock.now())
            await box.store.inbox.start_on_commit(conn, ids[0], attempts=1, now=clock.now())
    state = await rows(box)
    assert {e: (r["status"], r["attempts"]) for e, r in state.items()} == {
        "e1": ("pending", 2),  # its start mark rode on e2's COMMIT
        "e2": ("done", 1),
    }


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_a_failed_statement_on_the_commit_fails_the_commit_and_frees_the_connection(
    box: Relaybox, clock: FrozenClock
) -> None:
    """PostgreSQL sends the next start mark in the COMMIT's own message: if it fails,
    nothing commits and the connection is not left in an aborted transaction."""
    from relaybox.store.postgres import _adapted

    await box.store.inbox.accept([delivery(clock, "e", "x", {})])
    claim = await box.store.inbox.claim(now=clock.now(), limit=1, max_attempts=5, hold=30)
    [inbox_id] = claim.ids
    await box.store.inbox.start([inbox_id], clock.now())
    async with box.store.engine.connect() as conn:
        with pytest.raises(Exception, match="division by zero"):
            async with conn.begin():
                assert await box.store.inbox.begin(conn, inbox_id, attempt=1, now=clock.now())
                (await _adapted(conn))._transaction.before_commit("SELECT 1/0")
        assert not (await _adapted(conn))._connection.is_in_transaction()
        assert (await conn.exec_driver_sql("SELECT 1")).scalar() == 1
    assert (await rows(box))["e"]["status"] == "pending"


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_a_handler_that_swallows_a_database_error_completes_nothing(
    box: Relaybox, clock: FrozenClock
) -> None:
    """PostgreSQL aborts the transaction at the failed statement and answers its COMMIT
    with ROLLBACK: the worker says so instead of counting the event done. The row comes
    back after the hold (a suspect: its attempt never recorded an outcome)."""

    @box.handler("s")
    async def handler(ctx: Context) -> None:
        await ctx.once("k")
        try:
            await ctx.conn.execute(text("SELECT 1/0"))
        except Exception:
            pass  # the handler's bug: the transaction is aborted all the same

    await box.store.inbox.accept([delivery(clock, "e", "x", {})])
    with pytest.raises(Exception, match="nothing committed"):
        await box.worker(group=1).run_once()
    state = (await rows(box))["e"]
    assert (state["status"], state["attempts"]) == ("pending", 1)
    assert await box.store.fetch_all("SELECT * FROM relaybox_operations") == []
    clock.advance(31)
    claim = await box.store.inbox.claim(now=clock.now(), limit=10, max_attempts=5, hold=30)
    assert (len(claim.suspects), claim.ids) == (1, [])


async def test_a_handler_cannot_begin_a_second_transaction(
    box: Relaybox, clock: FrozenClock
) -> None:
    """The handler's connection is already in the event's transaction when it starts:
    ``ctx.conn.begin()`` fails (the event is retried), it never commits part of it."""
    async with box.store.transaction() as conn:
        await conn.execute(text("CREATE TABLE effects (name TEXT PRIMARY KEY)"))

    @box.handler("s")
    async def handler(ctx: Context) -> None:
        assert ctx.conn.in_transaction()
        async with ctx.conn.begin():
            await ctx.conn.execute(text("INSERT INTO effects VALUES ('half')"))

    await box.store.inbox.accept([delivery(clock, "e", "x", {})])
    await box.worker().run_once()
    state = (await rows(box))["e"]
    assert state["status"] == "pending" and "InvalidRequestError" in state["last_error"]
    assert await box.store.fetch_all("SELECT name FROM effects") == []


async def test_listeners_wake_after_the_rows_commit(box: Relaybox, clock: FrozenClock) -> None:
    """Accept wakes the workers and a handler's outbox row wakes the dispatchers, once
    the rows are committed: a listener woken by either finds them (PostgreSQL sends the
    NOTIFY after COMMIT, not inside the transaction whose COMMIT it would serialise)."""
    store = box.store
    inbox_woken, outbox_woken = asyncio.Event(), asyncio.Event()
    inbox_listener = await store.db.listen("inbox", inbox_woken)
    outbox_listener = await store.db.listen("outbox", outbox_woken)
    assert inbox_listener is not None and outbox_listener is not None

    @box.handler("s", "wake.test")
    async def handle(ctx: Context) -> None:
        await ctx.outbox.add("email", f"wake:{ctx.event.event_id}", {"n": 1})

    try:
        inbox_woken.clear()
        [outcome] = await store.inbox.accept([delivery(clock, "w1", "wake.test", {})])
        assert outcome.status == "accepted"
        async with asyncio.timeout(5):
            await inbox_woken.wait()
        assert (await rows(box))["w1"]["status"] == "pending"

        outbox_woken.clear()
        assert await box.worker().run_once() == 1
        async with asyncio.timeout(5):
            await outbox_woken.wait()
        found = await store.fetch_all("SELECT key FROM relaybox_outbox")
        assert [r["key"] for r in found] == ["wake:w1"]

        # A duplicate commits nothing and wakes nobody. (SQLite: its refused INSERT
        # still changes the file's data_version, which the commit watch that wakes
        # listeners for other processes' commits reads.)
        inbox_woken.clear()
        [again] = await store.inbox.accept([delivery(clock, "w1", "wake.test", {})])
        assert again.status == "duplicate"
        if store.backend == "postgres":
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.3):
                    await inbox_woken.wait()
            assert not inbox_woken.is_set()
    finally:
        await inbox_listener.close()
        await outbox_listener.close()


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_in_a_group_a_handler_that_swallows_a_database_error_fails_alone(
    box: Relaybox, clock: FrozenClock
) -> None:
    """Several events per transaction: the aborted transaction is found at that event's
    savepoint, rolled back to it and recorded as a failure (retried later); the events
    around it commit."""

    @box.handler("s")
    async def handler(ctx: Context) -> None:
        await ctx.once(f"k:{ctx.event.event_id}")
        if ctx.event.event_id in ("e2", "e4"):  # e4 is the group's last event
            with contextlib.suppress(Exception):
                await ctx.conn.execute(text("SELECT 1/0"))

    await box.store.inbox.accept([delivery(clock, f"e{i}", "x", {}) for i in range(1, 5)])
    assert await box.worker(group=4, concurrency=1).run_once() == 4
    state = await rows(box)
    assert {e: (r["status"], r["attempts"]) for e, r in state.items()} == {
        "e1": ("done", 1),
        "e2": ("pending", 1),
        "e3": ("done", 1),
        "e4": ("pending", 1),
    }
    assert "aborted its transaction" in state["e2"]["last_error"]
    keys = await box.store.fetch_all("SELECT business_key FROM relaybox_operations")
    assert sorted(r["business_key"] for r in keys) == ["k:e1", "k:e3"]


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_a_groups_statements_are_prepared_once_per_connection(
    box: Relaybox, clock: FrozenClock
) -> None:
    """The statements a group's BEGIN and COMMIT messages carry run as ``EXECUTE`` of
    statements prepared on the connection before its first group. If something
    deallocates one (``DISCARD ALL`` from elsewhere, say), the next group fails with
    the database's error, its rows come back after the hold, and the connection
    prepares its statements again."""
    prepared: list[list[str]] = []

    @box.handler("s")
    async def handler(ctx: Context) -> None:
        await ctx.once(f"k:{ctx.event.event_id}")
        await ctx.outbox.add("email", f"m:{ctx.event.event_id}", {})
        found = await ctx.conn.execute(
            text("SELECT name FROM pg_prepared_statements WHERE name LIKE 'relaybox%'")
        )
        prepared.append(sorted(r[0] for r in found))
        if ctx.event.event_id == "e2":
            await ctx.conn.execute(text("DEALLOCATE relaybox_inbox_lock_group"))

    await box.store.inbox.accept([delivery(clock, f"e{i}", "x", {}) for i in range(1, 7)])
    worker = box.worker(group=2, concurrency=1, batch=2)
    assert await worker.run_once() == 2  # e1, e2: committed; e2's DEALLOCATE with them
    assert prepared[0] == [
        "relaybox_inbox_begin_done",
        "relaybox_inbox_complete",
        "relaybox_inbox_lock_group",
        "relaybox_inbox_start_next",
        "relaybox_inbox_start_next_group",
        "relaybox_operations_release",
        "relaybox_outbox_insert_rows",
    ]
    with pytest.raises(asyncpg.InvalidSQLStatementNameError):
        await worker.run_once()  # e3, e4: their group's BEGIN finds no statement
    clock.advance(worker.claim_hold + 1)
    while await worker.run_once():
        pass
    assert "relaybox_inbox_lock_group" in prepared[-1]
    state = await rows(box)
    assert {e: (r["status"], r["attempts"]) for e, r in state.items()} == {
        "e1": ("done", 1),
        "e2": ("done", 1),
        "e3": ("done", 2),
        "e4": ("done", 2),
        "e5": ("done", 1),
        "e6": ("done", 1),
    }
    outbox = await box.store.fetch_all("SELECT key FROM relaybox_outbox ORDER BY key")
    assert [r["key"] for r in outbox] == [f"m:e{i}" for i in range(1, 7)]


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_in_a_group_the_last_handler_swallowing_a_database_error_is_found_at_commit(
    box: Relaybox, clock: FrozenClock
) -> None:
    """No savepoints at first, and no statement after the last handler's: the COMMIT
    finds the transaction aborted, nothing is applied, and the group runs again with a
    savepoint each, which names the event at fault."""
    calls: list[str] = []

    @box.handler("s")
    async def handler(ctx: Context) -> None:
        calls.append(ctx.event.event_id)
        await ctx.once(f"k:{ctx.event.event_id}")
        await ctx.outbox.add("email", f"m:{ctx.event.event_id}", {})
        if ctx.event.event_id == "e3":
            with contextlib.suppress(Exception):
                await ctx.conn.execute(text("SELECT 1/0"))

    await box.store.inbox.accept([delivery(clock, f"e{i}", "x", {}) for i in range(1, 4)])
    assert await box.worker(group=3, concurrency=1).run_once() == 3
    assert calls == ["e1", "e2", "e3", "e1", "e2", "e3"]
    state = await rows(box)
    assert {e: (r["status"], r["attempts"]) for e, r in state.items()} == {
        "e1": ("done", 1),
        "e2": ("done", 1),
        "e3": ("pending", 1),
    }
    assert "aborted its transaction" in state["e3"]["last_error"]
    keys = await box.store.fetch_all("SELECT business_key FROM relaybox_operations")
    assert sorted(r["business_key"] for r in keys) == ["k:e1", "k:e2"]
    outbox = await box.store.fetch_all("SELECT key FROM relaybox_outbox")
    assert sorted(r["key"] for r in outbox) == ["m:e1", "m:e2"]


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("savepoints", [False, True])
async def test_a_group_takes_savepoints_once_a_handler_failed(
    box: Relaybox, clock: FrozenClock, savepoints: bool
) -> None:
    """A group runs its handlers without savepoints (a round trip each saved). The first
    failure rolls it back; it runs again with a savepoint per event, the failed event
    keeping its outcome (its handler does not run twice), and so do the groups after
    it: e5's failure costs no second run of e4. ``worker.savepoints`` takes them from
    the start."""
    box.settings.worker.savepoints = savepoints
    calls: list[str] = []

    @box.handler("s")
    async def handler(ctx: Context) -> None:
        calls.append(ctx.event.event_id)
        await ctx.once(f"k:{ctx.event.event_id}")
        if ctx.event.event_id in ("e2", "e5"):
            raise RuntimeError("down")

    await box.store.inbox.accept([delivery(clock, f"e{i}", "x", {}) for i in range(1, 7)])
    assert await box.worker(group=3, concurrency=1).run_once() == 6
    if savepoints:
        assert calls == ["e1", "e2", "e3", "e4", "e5", "e6"]
    else:
        assert calls == ["e1", "e2", "e1", "e3", "e4", "e5", "e6"]
    state = await rows(box)
    assert {e: (r["status"], r["attempts"]) for e, r in state.items()} == {
        f"e{i}": ("pending" if i in (2, 5) else "done", 1) for i in range(1, 7)
    }
    keys = await box.store.fetch_all("SELECT business_key FROM relaybox_operations")
    assert sorted(r["business_key"] for r in keys) == ["k:e1", "k:e3", "k:e4", "k:e6"]
    attempts = await box.store.fetch_all(
        "SELECT inbox_id, attempt, outcome FROM relaybox_inbox_attempts ORDER BY inbox_id"
    )
    assert [(r["attempt"], r["outcome"]) for r in attempts] == [(1, "retry"), (1, "retry")]


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_in_a_group_an_event_with_no_handler_costs_no_second_run(
    box: Relaybox, clock: FrozenClock
) -> None:
    """An event with no handler ran nothing in the group's transaction: it goes to dead
    letters with the group, which neither rolls back nor takes savepoints."""
    calls: list[str] = []

    @box.handler("s", "x")
    async def handler(ctx: Context) -> None:
        calls.append(ctx.event.event_id)

    await box.store.inbox.accept(
        [
            delivery(clock, "e1", "x", {}),
            delivery(clock, "u", "y", {}),
            delivery(clock, "e2", "x", {}),
        ]
    )
    worker = box.worker(group=3, concurrency=1)
    assert await worker.run_once() == 3
    assert calls == ["e1", "e2"]
    state = await rows(box)
    assert {e: (r["status"], r["dead_reason"]) for e, r in state.items()} == {
        "e1": ("done", None),
        "u": ("dead", "unhandled"),
        "e2": ("done", None),
    }


async def test_outbox_rows_are_written_with_the_commit_exactly_as_given(
    box: Relaybox, clock: FrozenClock
) -> None:
    """``ctx.outbox.add`` records the row; it is written before the COMMIT (on
    PostgreSQL inside the COMMIT's message, its texts sent as hex). Quotes, backslashes
    and any Unicode arrive as given; a key added twice keeps its first row; a failed
    handler's rows are not written; a key that cannot be stored fails in the handler."""
    odd = "it's \\ a \"quoted\" '); DROP TABLE relaybox_inbox; -- ünï 🦆 \\x00"

    @box.handler("s")
    async def handler(ctx: Context) -> None:
        n = ctx.event.event_id
        if n == "bad-key":
            await ctx.outbox.add("email", "nul\x00key", {})
        await ctx.outbox.add("email", f"{n}:{odd}", {"text": odd, "n": n})
        await ctx.outbox.add("email", f"{n}:{odd}", {"text": "second"})
        if n == "fails":
            raise RuntimeError("after recording")

    ids = ["a", "fails", "bad-key", "b"]
    await box.store.inbox.accept([delivery(clock, n, "x", {}) for n in ids])
    assert await box.worker().run_once() == 4
    state = await rows(box)
    assert {e: r["status"] for e, r in state.items()} == {
        "a": "done",
        "fails": "pending",
        "bad-key": "pending",
        "b": "done",
    }
    assert "NUL" in state["bad-key"]["last_error"]
    found = await box.store.fetch_all(
        "SELECT key, payload, tenant, inbox_id, status FROM relaybox_outbox ORDER BY key"
    )
    inbox = await box.store.fetch_all("SELECT id, event_id FROM relaybox_inbox")
    by_event = {r["event_id"]: r["id"] for r in inbox}
    assert [
        (r["key"], json.loads(r["payload"]), r["tenant"], r["inbox_id"], r["status"]) for r in found
    ] == [(f"{n}:{odd}", {"text": odd, "n": n}, "t", by_event[n], "pending") for n in ("a", "b")]


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_in_a_group_a_handler_blocked_on_a_lock_runs_again_alone(
    box: Relaybox, clock: FrozenClock
) -> None:
    """A group holds its rows' locks until its COMMIT, so its handlers give up waiting
    for a lock after a short time (no deadlock between groups can last): that event is
    rolled back and runs again alone, where it waits as long as it takes. Not a
    failure: no retry is recorded and the attempt is not charged twice."""
    async with box.store.connect() as conn:
        await conn.exec_driver_sql("CREATE TABLE balances (id TEXT PRIMARY KEY, n INT NOT NULL)")
        await conn.exec_driver_sql("INSERT INTO balances VALUES ('hot', 0), ('cold', 0)")
    calls: list[str] = []

    @box.handler("s")
    async def handler(ctx: Context) -> None:
        calls.append(ctx.event.event_id)
        row = "hot" if ctx.event.event_id == "e2" else "cold"
        await ctx.conn.execute(text("UPDATE balances SET n = n + 1 WHERE id = :r"), {"r": row})

    await box.store.inbox.accept([delivery(clock, f"e{i}", "x", {}) for i in range(1, 4)])
    url = make_url(box.store.url).set(drivername="postgresql")
    holder = await asyncpg.connect(url.render_as_string(False))
    try:
        await holder.execute("BEGIN")
        await holder.execute("UPDATE balances SET n = n + 100 WHERE id = 'hot'")
        run = asyncio.create_task(box.worker(group=3, concurrency=1).run_once())

        async def others_done() -> dict[str, str] | None:
            state = {e: r["status"] for e, r in (await rows(box)).items()}
            return state if state["e1"] == state["e3"] == "done" else None

        # The group gives up on the locked row and commits e1 and e3 without it.
        state = await wait_until(others_done, within=10, what="e1 and e3 done", interval=0.02)
        assert state == {"e1": "done", "e2": "pending", "e3": "done"}
        await holder.execute("COMMIT")
        assert await run == 3
    finally:
        await holder.close()
    state = await rows(box)
    assert {e: (r["status"], r["attempts"], r["last_error"]) for e, r in state.items()} == {
        "e1": ("done", 1, None),
        "e2": ("done", 1, None),
        "e3": ("done", 1, None),
    }
    # No savepoints at first: e2's lock wait rolled the group back; e1 and e3 ran again
    # (with a savepoint each), e2 alone once the lock was free.
    assert calls == ["e1", "e2", "e1", "e3", "e2"]
    [balance] = await box.store.fetch_all("SELECT n FROM balances WHERE id = 'hot'")
    assert balance["n"] == 101


async def test_batch_and_group_defaults_follow_the_backend(box: Relaybox) -> None:
    """PostgreSQL: 16 events per transaction, 4 at once, claims of 128 (enough for
    every chain's groups); SQLite (one writer): the claim of 32 is the transaction."""
    worker = box.worker()
    if box.store.backend == "postgres":
        assert (worker.batch, worker.group, worker.concurrency) == (128, 16, 4)
    else:
        assert (worker.batch, worker.group, worker.concurrency) == (32, 32, 1)
    assert box.worker(batch=10, group=2).batch == 10


@pytest.mark.parametrize("group", [1, 4])
async def test_outcomes_are_logged_and_counted_only_once_committed(
    box: Relaybox, clock: FrozenClock, group: int
) -> None:
    """A transaction that does not commit logs no ``event_done`` and counts nothing
    processed: its events come back, and the warning says the outcome is uncertain."""

    @box.handler("s")
    async def handler(ctx: Context) -> None:
        await ctx.once(f"k:{ctx.event.event_id}")

    async def commit_fails(ids: list[int]) -> None:
        raise RuntimeError("the COMMIT is lost")

    box.hooks.before_commit.append(commit_fails)
    await box.store.inbox.accept([delivery(clock, f"e{i}", "x", {}) for i in range(1, 3)])
    counted = box.metrics.processed.labels("s", "done")
    before = counted._value.get()
    out = io.StringIO()
    worker = box.worker(group=group, concurrency=1)
    with redirect_stderr(out):
        configure_logging("info", json=True)
        with contextlib.suppress(Exception):
            await worker.run_once()
    configure_logging("info", json=False)
    events = [json.loads(x)["event"] for x in out.getvalue().splitlines() if x.startswith("{")]
    assert "event_done" not in events
    assert "worker_commit_uncertain" in events
    assert counted._value.get() == before
    assert {r["status"] for r in (await rows(box)).values()} == {"pending"}

    box.hooks.before_commit.remove(commit_fails)
    clock.advance(31)  # the hold runs out; they run again and commit
    out = io.StringIO()
    worker = box.worker(group=group, concurrency=1)
    with redirect_stderr(out):
        configure_logging("info", json=True)
        await worker.run_once()
    configure_logging("info", json=False)
    events = [json.loads(x)["event"] for x in out.getvalue().splitlines() if x.startswith("{")]
    assert events.count("event_done") == 2
    assert counted._value.get() == before + 2


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_the_connection_pool_has_room_for_every_chain(database_url: str) -> None:
    """``worker.concurrency`` chains each hold a connection while their events run: the
    engine's pool is sized for them (it was a fixed 10 + 10 overflow: pool timeouts
    above 20)."""
    wide = Relaybox(
        settings=Settings(database_url=database_url, worker=WorkerSettings(concurrency=40))
    )
    try:
        assert wide.store.engine.pool.size() == 42  # type: ignore[attr-defined]
    finally:
        await wide.close()


async def test_the_pool_sizes_are_settings(database_url: str) -> None:
    """``pool_size`` and ``pool_overflow`` size SQLAlchemy's pool on PostgreSQL (an
    application running more transactions at once than the pool keeps opened and
    closed a connection for each one over); SQLite keeps its one connection."""
    box = Relaybox(settings=Settings(database_url=database_url, pool_size=3, pool_overflow=0))
    try:
        pool = box.store.engine.pool
        sqlite = box.store.db.single_writer
        assert (pool.size(), pool._max_overflow) == ((1, 0) if sqlite else (3, 0))  # type: ignore[attr-defined]
        async with box.store.transaction() as conn:
            assert (await conn.exec_driver_sql("SELECT 1")).scalar() == 1
    finally:
        await box.close()


# -- declared business keys ------------------------------------------------------------


async def _balances(box: Relaybox) -> None:
    async with box.store.transaction() as conn:
        await conn.execute(text("CREATE TABLE grants (invoice TEXT, event TEXT)"))


async def _grants(box: Relaybox) -> list[tuple[str, str]]:
    found = await box.store.fetch_all("SELECT invoice, event FROM grants ORDER BY event")
    return [(r["invoice"], r["event"]) for r in found]


async def _operations(box: Relaybox) -> dict[str, str]:
    found = await box.store.fetch_all("SELECT business_key, fingerprint FROM relaybox_operations")
    return {r["business_key"]: r["fingerprint"] for r in found}


def _declare_grant(box: Relaybox, answers: dict[str, bool] | None = None) -> None:
    """A handler declaring ``grant:{invoice}`` (fingerprint ``v1``), granting once."""

    def key(ctx: Context) -> str | None:
        return f"grant:{ctx.payload['invoice']}" if "invoice" in ctx.payload else None

    @box.handler("s", "paid", business_key=key, fingerprint="v1")
    async def grant(ctx: Context) -> None:
        if ctx.payload.get("skip"):
            return  # never asks: the declared key must not be recorded
        first = await ctx.once()
        if answers is not None:
            answers[ctx.event.event_id] = first
        if first:
            await ctx.conn.execute(
                text("INSERT INTO grants VALUES (:i, :e)"),
                {"i": ctx.payload["invoice"], "e": ctx.event.event_id},
            )
        if ctx.payload.get("fail"):
            raise RuntimeError("after the grant")


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_a_group_claims_its_declared_business_keys_with_its_begin(
    box: Relaybox, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: the keys that handlers declare are inserted by the group's BEGIN
    statement, so ``ctx.once()`` answers without a round trip of its own; the keys are
    recorded with their fingerprint, and a key its handler did not ask for is not."""
    await _balances(box)
    answers: dict[str, bool] = {}
    _declare_grant(box, answers)
    asked: list[str] = []
    insert = box.store.inbox.operation_insert

    async def counting(conn: Any, operation: NewOperation) -> tuple[bool, str]:
        asked.append(operation.business_key)
        return await insert(conn, operation)

    monkeypatch.setattr(box.store.inbox, "operation_insert", counting)
    bodies = [{"invoice": "in_1"}, {"invoice": "in_2"}, {"invoice": "in_3", "skip": True}]
    await box.store.inbox.accept(
        [delivery(clock, f"e{i}", "paid", body) for i, body in enumerate(bodies, 1)]
    )
    assert await box.worker(group=4, concurrency=1).run_once() == 3
    assert asked == []  # every answer came from the BEGIN's claim
    assert answers == {"e1": True, "e2": True}
    assert await _grants(box) == [("in_1", "e1"), ("in_2", "e2")]
    assert await _operations(box) == {"grant:in_1": "v1", "grant:in_2": "v1"}
    assert {r["status"] for r in (await rows(box)).values()} == {"done"}
    # An event whose key function says None declares no key: its ctx.once() refuses.
    await box.store.inbox.accept([delivery(clock, "e4", "paid", {})])
    assert await box.worker(group=4, concurrency=1).run_once() == 1
    e4 = (await rows(box))["e4"]
    assert e4["status"] == "pending"
    assert "needs a business key: the handler declares none" in e4["last_error"]


async def test_declared_keys_that_exist_or_that_two_events_name_grant_once(
    box: Relaybox, clock: FrozenClock
) -> None:
    """Different event ids, one operation, with declared keys: two events
    in one group name one invoice, and a third names an invoice granted before. On
    PostgreSQL the group's claim comes back short, the group runs again asking per
    event; either way each invoice is granted once and every event completes."""
    await _balances(box)
    answers: dict[str, bool] = {}
    _declare_grant(box, answers)
    await box.store.inbox.accept([delivery(clock, "e0", "paid", {"invoice": "in_0"})])
    await box.worker(group=4, concurrency=1).run_once()
    await box.store.inbox.accept(
        [
            delivery(clock, "e1", "paid", {"invoice": "in_1"}),
            delivery(clock, "e2", "paid", {"invoice": "in_1"}),
            delivery(clock, "e3", "paid", {"invoice": "in_0"}),
            delivery(clock, "e4", "paid", {"invoice": "in_4"}),
        ]
    )
    assert await box.worker(group=4, concurrency=1).run_once() == 4
    assert answers == {"e0": True, "e1": True, "e2": False, "e3": False, "e4": True}
    assert await _grants(box) == [("in_0", "e0"), ("in_1", "e1"), ("in_4", "e4")]
    assert set(await _operations(box)) == {"grant:in_0", "grant:in_1", "grant:in_4"}
    assert {r["status"] for r in (await rows(box)).values()} == {"done"}


async def test_a_declared_key_rolls_back_with_its_failing_handler(
    box: Relaybox, clock: FrozenClock
) -> None:
    """A handler that failed after its ``ctx.once()``: its grant and its key roll back
    (on PostgreSQL the group runs again with a savepoint per event, where nothing is
    claimed with the BEGIN), its neighbours commit theirs, and its retry grants."""
    await _balances(box)
    _declare_grant(box)
    await box.store.inbox.accept(
        [
            delivery(clock, "e1", "paid", {"invoice": "in_1"}),
            delivery(clock, "e2", "paid", {"invoice": "in_2", "fail": True}),
            delivery(clock, "e3", "paid", {"invoice": "in_3"}),
        ]
    )
    worker = box.worker(group=3, concurrency=1)
    assert await worker.run_once() == 3
    assert await _grants(box) == [("in_1", "e1"), ("in_3", "e3")]
    assert set(await _operations(box)) == {"grant:in_1", "grant:in_3"}
    state = await rows(box)
    assert (state["e2"]["status"], state["e2"]["attempts"]) == ("pending", 1)
    assert "after the grant" in state["e2"]["last_error"]


async def test_a_declared_key_with_another_fingerprint_is_a_conflict(
    box: Relaybox, clock: FrozenClock
) -> None:
    """The key exists with another fingerprint (another operation reuses it): dead
    letter ``conflict``, as with ``ctx.once(key, fingerprint=...)``."""
    await _balances(box)
    _declare_grant(box)
    async with box.store.transaction() as conn:
        await box.store.inbox.operation_insert(
            conn,
            NewOperation(
                business_key="grant:in_1",
                fingerprint="v0",
                inbox_id=None,
                source=None,
                tenant=None,
                now=clock.now(),
            ),
        )
    await box.store.inbox.accept(
        [
            delivery(clock, "e1", "paid", {"invoice": "in_1"}),
            delivery(clock, "e2", "paid", {"invoice": "in_2"}),
        ]
    )
    assert await box.worker(group=2, concurrency=1).run_once() == 2
    state = await rows(box)
    assert (state["e1"]["status"], state["e1"]["dead_reason"]) == ("dead", "conflict")
    assert state["e2"]["status"] == "done"
    assert await _grants(box) == [("in_2", "e2")]
    assert await _operations(box) == {"grant:in_1": "v0", "grant:in_2": "v1"}


async def test_a_declared_key_function_that_raises_fails_the_event_at_ctx_once(
    box: Relaybox, clock: FrozenClock
) -> None:
    """The key function's error is raised by ``ctx.once()``, in the handler: that event
    retries with the error, the others in its group complete."""
    await _balances(box)

    def key(ctx: Context) -> str:
        return "grant:" + ctx.payload["invoice"]

    @box.handler("s", "paid", business_key=key)
    async def grant(ctx: Context) -> None:
        if await ctx.once():
            await ctx.conn.execute(text("INSERT INTO grants VALUES ('x', :e)"), {"e": "y"})

    await box.store.inbox.accept(
        [delivery(clock, "e1", "paid", {"invoice": "in_1"}), delivery(clock, "e2", "paid", {})]
    )
    assert await box.worker(group=2, concurrency=1).run_once() == 2
    state = await rows(box)
    assert state["e1"]["status"] == "done"
    assert (state["e2"]["status"], state["e2"]["attempts"]) == ("pending", 1)
    assert "KeyError" in state["e2"]["last_error"]
    assert set(await _operations(box)) == {"grant:in_1"}


async def test_ctx_once_checks_the_declared_fingerprint(box: Relaybox, clock: FrozenClock) -> None:
    """``ctx.once(key)`` for the declared key takes its fingerprint; another one is a
    programming error, raised in the handler."""
    seen: list[str] = []

    @box.handler("s", "x", business_key=lambda ctx: "k:" + ctx.event.event_id, fingerprint="v1")
    async def handler(ctx: Context) -> None:
        if ctx.event.event_id == "e1":
            assert await ctx.once("k:e1")  # the declared key, its fingerprint
            assert not await ctx.once("k:e1")  # asked twice: the second is not the first
            seen.append("e1")
        else:
            await ctx.once("k:e2", fingerprint="v2")

    await box.store.inbox.accept([delivery(clock, "e1", "x", {}), delivery(clock, "e2", "x", {})])
    await box.worker(group=2, concurrency=1).run_once()
    state = await rows(box)
    assert seen == ["e1"] or seen == ["e1", "e1"]
    assert state["e1"]["status"] == "done"
    assert "declared with fingerprint 'v1', not 'v2'" in state["e2"]["last_error"]
    assert await _operations(box) == {"k:e1": "v1"}


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_a_live_worker_keeps_the_hold_on_rows_waiting_their_turn(
    database_url: str, clock: FrozenClock
) -> None:
    """A claim's rows that wait for their turn past ``claim_hold`` stay with the worker
    running them (it renews the hold): another worker's claim finds nothing, and every
    event runs once, at attempt 1. Without the renewal they came back as if this worker
    had died and, started by both, could be charged until dead-lettered "exhausted"."""
    box = Relaybox(
        settings=Settings(database_url=database_url, worker=WorkerSettings(claim_hold=0.3)),
        clock=clock,
    )
    running, release = asyncio.Event(), asyncio.Event()
    ran: list[tuple[str, int]] = []

    @box.handler("s")
    async def handler(ctx: Context) -> None:
        ran.append((ctx.event.event_id, ctx.event.attempts))
        running.set()
        await release.wait()

    try:
        await box.store.inbox.accept([delivery(clock, f"e{i}", "x", {}) for i in range(1, 4)])
        task = asyncio.create_task(box.worker(concurrency=1, group=1).run_once())
        await asyncio.wait_for(running.wait(), 10)
        clock.advance(5.0)  # every hold of the claim has run out in the clock's time
        await asyncio.sleep(0.5)  # renewals run every 0.1 s (a third of the hold)
        other = await box.store.inbox.claim(now=clock.now(), limit=10, max_attempts=3, hold=0.3)
        assert (other.ids, other.suspects, other.exhausted) == ([], [], [])
        release.set()
        assert await asyncio.wait_for(task, 10) == 3
        assert ran == [("e1", 1), ("e2", 1), ("e3", 1)]
        state = await rows(box)
        assert {e: (r["status"], r["attempts"]) for e, r in state.items()} == {
            f"e{i}": ("done", 1) for i in range(1, 4)
        }
    finally:
        release.set()
        await box.close()
