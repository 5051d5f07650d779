"""The credits example's failure cases, against real ``relaybox`` processes.

The credits example runs as ``tests.support.faultapp:box`` in ``relaybox serve`` and
``relaybox worker`` subprocesses (SQLite file or a fresh PostgreSQL database), with
faults injected through the environment: a SIGKILL before or after the business
COMMIT, a poison event that kills its worker on every attempt. Processes are killed
with SIGKILL, never asked to stop, wherever a test interrupts one.

Deliveries reach the inbox in one of two ways, each stated in the test:

- **HTTP**: signed with the official ``stripe`` package, POSTed to a ``relaybox
  serve`` process;
- **in process**: through the same receiver code, called as an ASGI app without a
  socket (verification, tenant mapping and the group-committing acceptor all run);
  one store-level test calls ``store.inbox.accept`` with whole batches.

Each test that once documented a bug now asserts its fix, naming the code that
holds it in its message.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import random
import signal
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import stripe
from examples.credits import app as credits
from sqlalchemy import text

from relaybox import Context, FrozenClock, Relaybox, SystemClock
from relaybox.config import Settings, WorkerSettings
from relaybox.store import NewDelivery
from tests.support.faultapp import POISON_INVOICE, invoice_paid, post_asgi, signed
from tests.support.procs import Procs, wait_until

pytestmark = pytest.mark.slow

KILLED = -signal.SIGKILL


def granted(n: int) -> dict[str, Any]:
    """The state after ``n`` invoice.paid events, each of its own invoice and processed
    once: a grant of 100 each, its business key, its e-mail."""
    return {"inbox": {"done": n}, "grants": n, "credits": 100 * n, "operations": n, "outbox": n}


GRANTED_ONCE = granted(1)


class Db:
    """The test's own view of the database: the example's tables and relaybox's."""

    def __init__(self, url: str, env: Mapping[str, str] | None = None) -> None:
        self.url = url
        self.box = credits.configure(
            Relaybox(settings=Settings(database_url=url), clock=SystemClock()), env or {}
        )

    async def rows(self, sql: str, **params: Any) -> list[dict[str, Any]]:
        async with self.box.store.transaction() as conn:
            return [dict(r._mapping) for r in await conn.execute(text(sql), params)]

    async def scalar(self, sql: str, **params: Any) -> Any:
        async with self.box.store.transaction() as conn:
            return (await conn.execute(text(sql), params)).scalar()

    async def execute(self, sql: str, **params: Any) -> None:
        async with self.box.store.transaction() as conn:
            await conn.execute(text(sql), params)

    async def deliver(self, event: dict[str, Any]) -> str:
        """In process, through the receiver."""
        status, answer = await post_asgi(self.box, event)
        assert status == 200, answer
        return str(answer["status"])

    async def inbox(self, event_id: str) -> dict[str, Any]:
        [row] = await self.rows(
            "SELECT status, dead_reason, attempts, last_error, started_at, received_at"
            " FROM relaybox_inbox WHERE event_id = :e",
            e=event_id,
        )
        return row

    async def state(self) -> dict[str, Any]:
        """Inbox rows by status and the effects, read in one transaction."""
        async with self.box.store.transaction() as conn:

            async def one(sql: str) -> Any:
                return (await conn.execute(text(sql))).scalar()

            by_status = await conn.execute(
                text("SELECT status, count(*) FROM relaybox_inbox GROUP BY status")
            )
            return {
                "inbox": {status: n for status, n in by_status},
                "grants": await one("SELECT count(*) FROM credit_grants WHERE kind = 'grant'"),
                "credits": await one("SELECT coalesce(sum(credits), 0) FROM workspace_balances"),
                "operations": await one("SELECT count(*) FROM relaybox_operations"),
                "outbox": await one("SELECT count(*) FROM relaybox_outbox"),
            }

    async def settled(self, done: int) -> bool:
        """``done`` rows done and nothing pending."""
        inbox = (await self.state())["inbox"]
        return inbox.get("done", 0) >= done and not inbox.get("pending")


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Db]:
    d = Db(database_url)
    await credits.setup(d.box)  # relaybox's migrations (done) + the example's tables
    yield d
    await d.box.close()


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    yield p
    p.cleanup()


def new_delivery(box: Relaybox, event: dict[str, Any]) -> NewDelivery:
    """What the receiver builds from a verified delivery."""
    body, headers = signed(box, event)
    v = box.sources["stripe"].verify(headers, body, box.clock.now())
    return NewDelivery(
        source=v.source,
        account=v.account,
        event_id=v.event_id,
        event_type=v.event_type,
        tenant=v.tenant,
        fingerprint=v.fingerprint,
        payload=body,
        headers=None,
        version=v.version,
        received_at=box.clock.now(),
    )


def stripe_signed(event: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    """Signed by the official Stripe library, as Stripe would send it."""
    body = json.dumps(event, separators=(",", ":")).encode()
    t = int(time.time())
    sig = stripe.WebhookSignature._compute_signature(f"{t}.{body.decode()}", credits.DEV_SECRET)
    return body, {"stripe-signature": f"t={t},v1={sig}", "content-type": "application/json"}


async def post(http: aiohttp.ClientSession, url: str, event: dict[str, Any]) -> tuple[int, Any]:
    body, headers = stripe_signed(event)
    async with http.post(url + "/webhooks/stripe", data=body, headers=headers) as r:
        return r.status, await r.json()


async def like_a_sender(send: Callable[[], Awaitable[tuple[int, Any]]]) -> str:
    """Deliver until a 2xx, as Stripe does: a 503 (nothing committed) is retried.
    Returns the 2xx answer's status (accepted, duplicate, ...)."""
    for attempt in range(20):
        status, answer = await send()
        if status == 200:
            return str(answer["status"])
        assert status == 503, answer
        await asyncio.sleep(0.05 * (attempt + 1))
    raise AssertionError("still 503 after 20 tries")


async def post_until_2xx(http: aiohttp.ClientSession, url: str, event: dict[str, Any]) -> str:
    return await like_a_sender(lambda: post(http, url, event))


# -- 1. the same event, concurrently ----------------------------------------------------


async def test_fifty_concurrent_copies_make_one_receipt_and_one_grant(db: Db, procs: Procs) -> None:
    """HTTP: 50 copies of one signed delivery at once to ``serve --roles receiver,worker``."""
    server = await procs.serve(db.url)
    event = invoice_paid("evt_dup", "in_1")
    async with aiohttp.ClientSession() as http:
        results = await asyncio.gather(*(post(http, server.url, event) for _ in range(50)))
    assert [status for status, _ in results] == [200] * 50
    assert sorted(a["status"] for _, a in results) == ["accepted"] + ["duplicate"] * 49

    await wait_until(lambda: db.settled(1), within=15, what="the event processed", procs=procs)
    assert await db.state() == GRANTED_ONCE


# -- 2. different events, one invoice ---------------------------------------------------


async def test_different_event_ids_for_one_invoice_grant_once(db: Db, procs: Procs) -> None:
    """HTTP: three event ids naming one invoice, at once, each sent twice."""
    server = await procs.serve(db.url)
    events = [invoice_paid(f"evt_{n}", "in_1") for n in (1, 2, 3)]
    async with aiohttp.ClientSession() as http:
        answers = await asyncio.gather(*(post_until_2xx(http, server.url, e) for e in events * 2))
    assert sorted(answers) == ["accepted"] * 3 + ["duplicate"] * 3

    await wait_until(lambda: db.settled(3), within=15, what="3 events processed", procs=procs)
    assert await db.state() == {
        "inbox": {"done": 3},  # three receipts ...
        "grants": 1,  # ... one grant ...
        "credits": 100,
        "operations": 1,
        "outbox": 1,  # ... and one confirmation intent
    }
    [mail] = await db.rows("SELECT key FROM relaybox_outbox")
    assert mail["key"] == credits.grant_key("stripe", credits.DEV_ACCOUNT, "in_1") + ":confirmation"


# -- 3. the receiver dies right after its 2xx -------------------------------------------


async def test_receiver_killed_after_2xx_leaves_the_work_findable(db: Db, procs: Procs) -> None:
    """HTTP: 20 deliveries at once to ``serve --roles receiver``; SIGKILL as soon as
    the first 2xx arrives. Every acknowledged delivery is then processed by a worker
    started afterwards."""
    receiver = await procs.serve(db.url, roles="receiver")
    acked: list[str] = []

    async def send(http: aiohttp.ClientSession, n: int) -> None:
        try:
            status, _ = await post(http, receiver.url, invoice_paid(f"evt_{n}", f"in_{n}"))
        except (TimeoutError, aiohttp.ClientError):
            return  # the process died first: no 2xx, the sender would retry
        if status == 200:
            acked.append(f"evt_{n}")
            receiver.kill()

    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(send(http, n) for n in range(20)))
    assert receiver.returncode == KILLED
    assert acked

    stored = {r["event_id"]: r["status"] for r in await db.rows("SELECT * FROM relaybox_inbox")}
    assert set(acked) <= set(stored)  # 2xx means committed
    assert set(stored.values()) == {"pending"}  # nobody processed anything yet
    # (A batch whose COMMIT was already on its way may still land, unacknowledged:
    # the sender will retry it and get "duplicate". Count rows again at the end.)

    procs.worker(db.url)
    await wait_until(
        lambda: db.settled(len(acked)), within=15, what="the pending rows done", procs=procs
    )
    final = {r["event_id"] for r in await db.rows("SELECT event_id FROM relaybox_inbox")}
    assert set(acked) <= final
    state = await db.state()
    assert state["inbox"] == {"done": len(final)}
    assert state["grants"] == len(final)
    assert state["credits"] == 100 * len(final)


# -- 4. the worker dies before / after the business COMMIT ------------------------------


async def test_worker_killed_before_commit_rolls_back_and_a_new_worker_grants_once(
    db: Db, procs: Procs, tmp_path: Path
) -> None:
    """In process delivery; ``relaybox worker`` SIGKILLs itself in before_commit."""
    await db.deliver(invoice_paid("evt_1", "in_1"))
    env = {"FAULT": "kill_before_commit", "FAULT_MARKER": str(tmp_path / "fired")}

    first = procs.worker(db.url, env=env)
    assert await first.wait_exit(20) == KILLED, first.tail()
    # Rolled back: no grant, no balance, no key, no e-mail, no outcome; the attempt
    # itself was counted before the handler ran.
    assert await db.state() == {
        "inbox": {"pending": 1},
        "grants": 0,
        "credits": 0,
        "operations": 0,
        "outbox": 0,
    }
    assert (await db.inbox("evt_1"))["attempts"] == 1
    assert await db.scalar("SELECT count(*) FROM relaybox_inbox_attempts") == 0

    second = procs.worker(db.url, env=env)  # the marker exists: no fault this time
    await wait_until(lambda: db.settled(1), within=15, what="the retry", procs=procs)
    assert await db.state() == GRANTED_ONCE
    assert (await db.inbox("evt_1"))["attempts"] == 2
    assert second.terminate() == 0


async def test_worker_killed_after_commit_never_grants_twice(
    db: Db, procs: Procs, tmp_path: Path
) -> None:
    """In process delivery; ``relaybox worker`` SIGKILLs itself in after_commit."""
    await db.deliver(invoice_paid("evt_1", "in_1"))
    env = {"FAULT": "kill_after_commit", "FAULT_MARKER": str(tmp_path / "fired")}

    first = procs.worker(db.url, env=env)
    assert await first.wait_exit(20) == KILLED, first.tail()
    assert await db.state() == GRANTED_ONCE

    # The sender re-delivers, and another event names the same invoice.
    assert await db.deliver(invoice_paid("evt_1", "in_1")) == "duplicate"
    assert await db.deliver(invoice_paid("evt_2", "in_1")) == "accepted"
    second = procs.worker(db.url, env=env)
    await wait_until(lambda: db.settled(2), within=15, what="evt_2 processed", procs=procs)
    assert await db.state() == {**GRANTED_ONCE, "inbox": {"done": 2}}  # balance exactly +100
    assert (await db.inbox("evt_1"))["attempts"] == 1  # never run again
    assert second.terminate() == 0


# -- 4a. the worker freezes inside its transaction ----------------------------------------


def _frozen(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP): state ``T`` in /proc."""
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] == "T"
    return False


async def _stopped(pid: int) -> bool:
    return _frozen(pid)


async def test_worker_frozen_in_its_transaction(db: Db, procs: Procs, tmp_path: Path) -> None:
    """``relaybox worker`` runs the grant's statements, then its process freezes
    (SIGSTOP) with the transaction open: its connection idle in transaction, holding the
    row and the balance's locks, its hold no longer renewed.

    PostgreSQL: the server ends that session after ``idle_in_transaction_timeout`` (2
    s here), which rolls the grant back and releases the locks; once the hold (5 s)
    ends, another worker takes the row and grants once, with the frozen process still
    stopped. SQLite: no server ends anything, and the frozen process keeps the file's
    write lock: no other worker can take the row, and a delivery meanwhile is answered
    503 (not stored, the sender retries) once the lock wait gives up. Only when the
    process dies (an operator's or a supervisor's kill) does the row come back, a hold
    later."""
    postgres = db.url.startswith("postgresql")
    await db.deliver(invoice_paid("evt_1", "in_1"))
    env = {
        "FAULT": "freeze",
        "FAULT_MARKER": str(tmp_path / "fired"),
        "RELAYBOX_IDLE_IN_TRANSACTION_TIMEOUT": "2",
        "RELAYBOX_WORKER__CLAIM_HOLD": "5",
        "RELAYBOX_WORKER__POLL_INTERVAL": "0.1",
    }
    first = procs.worker(db.url, env=env)
    await wait_until(lambda: _stopped(first.pid), within=20, what="the worker frozen", procs=procs)
    frozen_at = time.monotonic()
    if postgres:
        stuck = await db.rows(
            "SELECT pid, state FROM pg_stat_activity WHERE datname = current_database()"
            " AND state = 'idle in transaction' AND pid <> pg_backend_pid()"
        )
        assert len(stuck) == 1, stuck  # (2 s later the server has ended it)

    second = procs.worker(db.url, env=env)  # the marker exists: no fault this time
    if postgres:
        await wait_until(lambda: db.settled(1), within=30, what="the row taken over", procs=procs)
        took = time.monotonic() - frozen_at
        # The hold (5 s) and the other worker's start and polls: a few seconds on a
        # quiet machine (never, without the server's timeout: the row stays locked).
        assert took < 5 + 15, f"taken over {took:.1f} s after the freeze (hold 5 s)"
        assert _frozen(first.pid)  # still stopped: the server ended its transaction
        ended = await db.rows(
            "SELECT pid FROM pg_stat_activity WHERE pid = :pid", pid=stuck[0]["pid"]
        )
        assert ended == [], "the frozen worker's session still exists"
    else:
        await asyncio.sleep(5 + 2)  # past the hold: still nobody can take the row
        # A plain read (relaybox's own transactions all take the write lock first).
        with contextlib.closing(sqlite3.connect(db.url.removeprefix("sqlite:///"))) as plain:
            [(status,)] = plain.execute(
                "SELECT status FROM relaybox_inbox WHERE event_id = 'evt_1'"
            ).fetchall()
        assert status == "pending"
        assert _frozen(first.pid)
        status, answer = await post_asgi(db.box, invoice_paid("evt_2", "in_2"))
        assert status == 503, answer  # the write lock wait gave up: not stored
        first.kill()
        await wait_until(lambda: db.settled(1), within=30, what="the row taken over", procs=procs)
    assert await db.state() == GRANTED_ONCE
    assert (await db.inbox("evt_1"))["attempts"] == 2
    assert second.terminate() == 0
    first.kill()


# -- 4b. one process that receives and works dies with rows it took at accept ----------


def _taken_at_accept(db: Db, row: dict[str, Any]) -> bool:
    """Whether this process's worker took ``row`` from the accept: the attempt counted
    by the accept's own statement (started at its time), not by a claim after it.
    Always on SQLite, whose worker runs claimed batches only."""
    return not db.url.startswith("postgresql") or row["started_at"] == row["received_at"]


async def test_one_process_killed_before_commit_of_a_row_taken_at_accept(
    db: Db, procs: Procs, tmp_path: Path
) -> None:
    """HTTP to ``serve --roles receiver,worker``, which SIGKILLs itself in
    before_commit: on PostgreSQL its worker took the row from the accept (the attempt
    counted and the row held in the accept's COMMIT). Rolled back, the row comes back
    once its hold ends, and the next process grants once.

    A request that arrives while one of the worker's claims is in flight finds no room
    (the claim counts the free chains as its own) and its row goes to the next claim
    instead. That path must end the same way, and is checked as fully; the test then
    tries again with another event, up to three times, until a row was taken at accept."""
    for n in range(1, 4):
        event = invoice_paid(f"evt_{n}", f"in_{n}")
        env = {"FAULT": "kill_before_commit", "FAULT_MARKER": str(tmp_path / f"fired{n}")}
        first = await procs.serve(db.url, env=env)
        async with aiohttp.ClientSession() as http:
            with contextlib.suppress(TimeoutError, aiohttp.ClientError):
                await post(http, first.url, event)  # 2xx or not
            assert await first.wait_exit(20) == KILLED, first.tail()
            row = await db.inbox(f"evt_{n}")
            assert (row["status"], row["attempts"]) == ("pending", 1)
            assert (await db.state())["grants"] == n - 1

            second = await procs.serve(db.url, env=env)  # the marker exists: no fault
            # The sender retries if it got no 2xx: the row is stored already.
            assert await post_until_2xx(http, second.url, event) == "duplicate"
        await wait_until(
            functools.partial(db.settled, n), within=15, what="the row run again", procs=procs
        )
        assert await db.state() == granted(n)  # each try's invoice granted once
        assert (await db.inbox(f"evt_{n}"))["attempts"] == 2
        assert second.terminate() == 0
        if _taken_at_accept(db, row):
            return
    pytest.fail("in three tries, no row was taken at accept: each went to a claim")


async def test_one_process_killed_after_commit_of_a_row_taken_at_accept(
    db: Db, procs: Procs, tmp_path: Path
) -> None:
    """The same process SIGKILLs itself in after_commit: the grant is committed, and
    neither the sender's retry nor the next process runs the row again."""
    env = {"FAULT": "kill_after_commit", "FAULT_MARKER": str(tmp_path / "fired")}
    first = await procs.serve(db.url, env=env)
    async with aiohttp.ClientSession() as http:
        with contextlib.suppress(TimeoutError, aiohttp.ClientError):
            await post(http, first.url, invoice_paid("evt_1", "in_1"))
        assert await first.wait_exit(20) == KILLED, first.tail()
        assert await db.state() == GRANTED_ONCE
        second = await procs.serve(db.url, env=env)
        assert await post_until_2xx(http, second.url, invoice_paid("evt_1", "in_1")) == "duplicate"
        assert await post_until_2xx(http, second.url, invoice_paid("evt_2", "in_1")) == "accepted"
    await wait_until(lambda: db.settled(2), within=15, what="evt_2 processed", procs=procs)
    assert await db.state() == {**GRANTED_ONCE, "inbox": {"done": 2}}  # balance exactly +100
    assert (await db.inbox("evt_1"))["attempts"] == 1  # never run again
    assert second.terminate() == 0


# -- 5. the COMMIT's answer is lost -----------------------------------------------------


async def test_lost_commit_answer_is_resolved_from_persisted_state(db: Db) -> None:
    """In process: an after_commit hook raises as if the connection dropped while the
    COMMIT's answer was on its way. Nothing is applied again, whatever comes next."""
    clock = FrozenClock(time.time())
    box = credits.configure(
        Relaybox(
            settings=Settings(
                database_url=db.url, worker=WorkerSettings(backoff_jitter=0, claim_hold=5)
            ),
            clock=clock,
        ),
        {},
    )
    lost = [True]

    async def lose_the_answer(ids: list[int]) -> None:
        if lost:
            lost.clear()
            raise ConnectionResetError("connection lost while waiting for COMMIT's answer")

    box.hooks.after_commit.append(lose_the_answer)
    try:
        await post_asgi(box, invoice_paid("evt_1", "in_1"))
        with pytest.raises(ConnectionResetError):
            await box.worker().run_once()
        assert await db.state() == GRANTED_ONCE

        clock.advance(60)  # past any hold: the row is done, there is nothing to redo
        assert await box.worker().run_once() == 0
        # A re-delivery, another event for the invoice, and an operator's replay of the
        # first row all go through the same idempotent operation.
        assert (await post_asgi(box, invoice_paid("evt_1", "in_1")))[1]["status"] == "duplicate"
        assert (await post_asgi(box, invoice_paid("evt_2", "in_1")))[1]["status"] == "accepted"
        await db.execute(
            "UPDATE relaybox_inbox SET status = 'pending', next_attempt_at = :now"
            " WHERE event_id = 'evt_1'",
            now=clock.now(),
        )
        assert await box.worker().run_once() == 2
        assert await db.state() == {**GRANTED_ONCE, "inbox": {"done": 2}}
    finally:
        await box.close()


# -- 6. a poison event ------------------------------------------------------------------


async def supervise(
    procs: Procs,
    db: Db,
    settled: Callable[[], Awaitable[bool]],
    env: Mapping[str, str],
    *,
    within: float = 30.0,
    app: str = "tests.support.faultapp:box",
) -> int:
    """Run a worker (of ``app``), restarting it whenever it dies, until ``settled()``;
    return how many times it was killed."""
    deadline = time.monotonic() + within
    crashes = 0
    while True:
        worker = procs.worker(db.url, app=app, env=env, name=f"worker{crashes}")
        while worker.alive() and not await settled():
            if time.monotonic() > deadline:
                raise AssertionError(f"not settled after {within} s\n{procs.tails()}")
            await asyncio.sleep(0.05)
        if worker.alive():
            assert worker.terminate() == 0
            return crashes
        assert worker.returncode == KILLED, worker.tail()
        crashes += 1


async def no_pending(db: Db) -> bool:
    return not (await db.state())["inbox"].get("pending")


POISON_EVENTS = ["evt_ok_1", "evt_ok_2", "evt_poison", "evt_ok_3"]


async def test_poison_event_is_dead_exhausted_and_the_others_are_done(db: Db, procs: Procs) -> None:
    """In process delivery of ``in_poison`` in the middle of three good invoices,
    default worker settings. Each attempt of the poison SIGKILLs its worker and a
    supervisor restarts it: the attempt was counted before the handler ran, so after
    max_attempts (3) crashes the next claim dead-letters it as ``exhausted`` instead
    of running it a fourth time. The good events must end done, granted once each."""
    for event_id in POISON_EVENTS:
        invoice = POISON_INVOICE if event_id == "evt_poison" else event_id.replace("evt", "in")
        assert await db.deliver(invoice_paid(event_id, invoice)) == "accepted"

    crashes = await supervise(procs, db, lambda: no_pending(db), {"FAULT": "poison"})
    assert crashes == 3
    poison = await db.inbox("evt_poison")
    assert (poison["status"], poison["dead_reason"], poison["attempts"]) == (
        "dead",
        "exhausted",
        3,
    )
    assert "the worker process died" in poison["last_error"]

    statuses = {e: (await db.inbox(e))["status"] for e in POISON_EVENTS}
    assert statuses == {**dict.fromkeys(POISON_EVENTS, "done"), "evt_poison": "dead"}, (
        "a crash must charge an attempt only to the row that crashed its process: a row"
        " whose attempt never finished comes back as a suspect and runs alone"
        f" (relaybox/inbound/worker/loop.py): {statuses}"
    )
    state = await db.state()
    assert (state["inbox"], state["grants"], state["credits"]) == (
        {"done": 3, "dead": 1},
        3,
        300,
    )


# -- concurrency on PostgreSQL: lock order -------------------------------------------


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_concurrent_batches_with_the_same_events_do_not_deadlock(db: Db) -> None:
    """Two group-commit batches (two receivers, or two committers of one) holding the
    same 1,000 deliveries in opposite orders, committed at the same moment."""
    box = db.box
    # Two connections open first, so that both batches really start together.
    warm = [new_delivery(box, invoice_paid(f"evt_warm_{n}", "in_warm")) for n in (1, 2, 3)]
    await box.store.inbox.accept(warm[:1])
    await asyncio.gather(*(box.store.inbox.accept([d]) for d in warm[1:]))
    batch = [new_delivery(box, invoice_paid(f"evt_{n}", f"in_{n}")) for n in range(1000)]
    results = await asyncio.gather(
        box.store.inbox.accept(batch),
        box.store.inbox.accept(batch[::-1]),
        return_exceptions=True,
    )
    failed = [r for r in results if isinstance(r, BaseException)]
    # a batch is inserted in key order (relaybox/store/postgres.py), so overlapping
    # batches cannot deadlock: no 503 for a whole batch
    assert not failed, failed
    assert await db.scalar("SELECT count(*) FROM relaybox_inbox") == 1003
    statuses = sorted(o.status for r in results for o in r)  # type: ignore[union-attr]
    assert statuses == ["accepted"] * 1000 + ["duplicate"] * 1000


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_worker_batches_touching_the_same_rows_do_not_deadlock(db: Db) -> None:
    """Two workers, each claiming a batch of two grants for workspaces ws_0 and ws_1
    in opposite orders: A = [ws_0, ws_1], B = [ws_1, ws_0]. A barrier makes both hold
    their first balance row before they go on. With the batch in one transaction
    this deadlocked (and cost the victim an attempt); a group now waits at most 50 ms
    for a row lock and runs that event again alone, so neither loses an attempt."""
    tenants = {"CREDITS_TENANTS": "acct_0=ws_0,acct_1=ws_1"}
    clock = FrozenClock(time.time())
    box = Relaybox(
        settings=Settings(
            database_url=db.url,
            worker=WorkerSettings(batch=2, backoff_jitter=0, backoff_base=0.1, max_attempts=5),
        ),
        clock=clock,
    )
    barrier = asyncio.Barrier(2)

    async def grant_then_meet(ctx: Context) -> None:
        await credits.grant_initial_credits(ctx)
        if ctx.event.event_id in ("evt_1", "evt_3"):  # the first event of each batch
            await asyncio.wait_for(barrier.wait(), 10)

    box.handler("stripe", "invoice.paid")(grant_then_meet)
    credits.configure(box, tenants)
    try:
        for n, account in ((1, "acct_0"), (2, "acct_1"), (3, "acct_1"), (4, "acct_0")):
            status, _ = await post_asgi(box, invoice_paid(f"evt_{n}", f"in_{n}", account=account))
            assert status == 200
            clock.advance(1)  # claimed in this order
        a, b = box.worker(name="A"), box.worker(name="B")
        assert await asyncio.gather(a.run_once(), b.run_once()) == [2, 2]

        retried = await db.rows(
            "SELECT worker, error FROM relaybox_inbox_attempts WHERE outcome = 'retry'"
        )
        clock.advance(1)
        while await a.run_once():  # whatever was retried finishes
            clock.advance(1)
        balances = await db.rows("SELECT workspace, credits FROM workspace_balances")
        assert {r["workspace"]: r["credits"] for r in balances} == {"ws_0": 200, "ws_1": 200}
        # a group waits at most 50 ms for a row lock another group holds and runs that
        # event again alone (relaybox/inbound/worker/__init__.py): no deadlock, no attempt spent
        assert retried == []
    finally:
        await box.close()


# -- 7. many workers, many events -------------------------------------------------------


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_four_workers_two_thousand_events_grant_each_invoice_once(
    database_url: str, procs: Procs
) -> None:
    """PostgreSQL, 4 ``relaybox worker`` processes running while 2,000 deliveries for
    500 invoices arrive, shuffled: per invoice one event sent twice (an exact
    duplicate) and two more event ids. 400 go over HTTP to a ``serve --roles
    receiver`` process, 1,600 in process through the receiver (group-committed in
    batches by the acceptor), both at the same time. Senders retry a 503 as Stripe
    does (accept batches can deadlock on shared event keys, see above): a 503 means
    nothing was committed, so retrying it is always safe."""
    accounts = 8
    tenants = ",".join(f"acct_{a}=ws_{a}" for a in range(accounts))
    env = {"CREDITS_TENANTS": tenants}
    db = Db(database_url, env)
    await credits.setup(db.box)
    try:
        invoices = 500
        deliveries = []
        for i in range(invoices):
            account = f"acct_{i % accounts}"
            for suffix in ("a", "a", "b", "c"):
                deliveries.append(invoice_paid(f"evt_{i}_{suffix}", f"in_{i}", account=account))
        random.Random(0).shuffle(deliveries)
        over_http, in_process = deliveries[:400], deliveries[400:]

        workers = [procs.worker(database_url, env=env, name=f"worker{n}") for n in range(4)]
        receiver = await procs.serve(database_url, roles="receiver", env=env)

        async def send_http() -> list[str]:
            limit = asyncio.Semaphore(16)

            async def one(http: aiohttp.ClientSession, event: dict[str, Any]) -> str:
                async with limit:
                    return await post_until_2xx(http, receiver.url, event)

            async with aiohttp.ClientSession() as http:
                return await asyncio.gather(*(one(http, e) for e in over_http))

        async def send_in_process() -> list[str]:
            limit = asyncio.Semaphore(32)

            async def one(event: dict[str, Any]) -> str:
                async with limit:
                    return await like_a_sender(lambda: post_asgi(db.box, event))

            return await asyncio.gather(*(one(e) for e in in_process))

        http_answers, asgi_answers = await asyncio.gather(send_http(), send_in_process())
        answers = [*http_answers, *asgi_answers]
        assert (answers.count("accepted"), answers.count("duplicate")) == (1500, 500)

        await wait_until(
            lambda: db.settled(1500), within=45, what="1,500 events processed", procs=procs
        )
        assert all(w.alive() for w in workers)
        assert await db.state() == {
            "inbox": {"done": 1500},
            "grants": invoices,
            "credits": invoices * 100,
            "operations": invoices,
            "outbox": invoices,
        }
        assert await db.scalar("SELECT count(DISTINCT invoice_id) FROM credit_grants") == invoices
        balances = await db.rows("SELECT workspace, credits FROM workspace_balances")
        assert {r["workspace"]: r["credits"] for r in balances} == {
            f"ws_{a}": 100 * len(range(a, invoices, accounts)) for a in range(accounts)
        }
        assert await db.scalar("SELECT count(*) FROM relaybox_quarantine") == 0
        assert procs.stop(*workers) == [0] * 4
        busy = [w.name for w in workers if '"event_done"' in w.output()]
        assert len(busy) >= 2, busy  # the work really was shared
    finally:
        await db.box.close()
