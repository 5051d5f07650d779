"""The credits example in process, on SQLite and PostgreSQL.

Deliveries go through the real receiver (signed, verified, mapped to a tenant,
group-committed) without a socket; the worker is driven one batch at a time with a
frozen clock, so every retry schedule is asserted without sleeping.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from examples.credits import app as credits
from sqlalchemy import text

from relaybox import Context, FrozenClock, Relaybox
from relaybox.config import Settings, WorkerSettings
from relaybox.testing import Harness
from tests.support.faultapp import charge_refunded, invoice_paid

WS = "ws_dev"  # the workspace the dev account maps to
ACCT = credits.DEV_ACCOUNT
GRANT_1 = credits.grant_key("stripe", ACCT, "in_1")


def worker_settings(**overrides: Any) -> WorkerSettings:
    options: dict[str, Any] = {
        "backoff_base": 1.0,
        "backoff_factor": 2.0,
        "backoff_cap": 600.0,
        "backoff_jitter": 0.0,
        "max_attempts": 5,
        "max_age": 3600.0,
        "claim_hold": 30.0,
        **overrides,
    }
    return WorkerSettings(**options)


async def make_box(
    database_url: str,
    clock: FrozenClock,
    *,
    first: Callable[[Context], Awaitable[None]] | None = None,
    **worker: Any,
) -> Relaybox:
    """The example on ``database_url``; ``first`` replaces its ``invoice.paid``
    handler (registered first, it wins over the example's own)."""
    box = Relaybox(
        settings=Settings(database_url=database_url, worker=worker_settings(**worker)),
        clock=clock,
    )
    if first is not None:
        box.handler("stripe", "invoice.paid")(first)
    credits.configure(box)
    await credits.setup(box)
    return box


@pytest.fixture
async def box(database_url: str, clock: FrozenClock) -> AsyncIterator[Relaybox]:
    b = await make_box(database_url, clock)
    yield b
    await b.close()


async def deliver(box: Relaybox, event: dict[str, Any]) -> str:
    """Through the box's receiver with relaybox.testing, signed as Stripe signs."""
    kit = Harness.of(box)
    delivery = kit.signed("stripe", event_id=event["id"], event_type=event["type"], payload=event)
    response = await kit.deliver(delivery)
    assert response.status == 200, response.body
    return str(response.outcome)


async def rows(box: Relaybox, sql: str, **params: Any) -> list[dict[str, Any]]:
    async with box.store.transaction() as conn:
        return [dict(r._mapping) for r in await conn.execute(text(sql), params)]


async def scalar(box: Relaybox, sql: str, **params: Any) -> Any:
    async with box.store.transaction() as conn:
        return (await conn.execute(text(sql), params)).scalar()


async def balance(box: Relaybox, workspace: str = WS) -> int | None:
    return await scalar(
        box, "SELECT credits FROM workspace_balances WHERE workspace = :w", w=workspace
    )


async def inbox(box: Relaybox, event_id: str) -> dict[str, Any]:
    [row] = await rows(
        box,
        "SELECT status, dead_reason, attempts, next_attempt_at, last_error"
        " FROM relaybox_inbox WHERE event_id = :e",
        e=event_id,
    )
    return row


async def outcomes(box: Relaybox, event_id: str) -> list[str]:
    return [
        r["outcome"]
        for r in await rows(
            box,
            "SELECT a.outcome FROM relaybox_inbox_attempts a"
            " JOIN relaybox_inbox i ON i.id = a.inbox_id WHERE i.event_id = :e"
            " ORDER BY a.attempt",
            e=event_id,
        )
    ]


async def counts(box: Relaybox) -> dict[str, int]:
    return {
        "grants": await scalar(box, "SELECT count(*) FROM credit_grants WHERE kind = 'grant'"),
        "operations": await scalar(box, "SELECT count(*) FROM relaybox_operations"),
        "outbox": await scalar(box, "SELECT count(*) FROM relaybox_outbox"),
    }


# -- the grant ------------------------------------------------------------------------


async def test_paid_invoice_grants_100_credits_once(box: Relaybox) -> None:
    assert await deliver(box, invoice_paid("evt_1", "in_1")) == "accepted"
    assert await box.worker().run_once() == 1

    row = await inbox(box, "evt_1")
    assert (row["status"], row["attempts"], row["last_error"]) == ("done", 1, None)
    assert await balance(box) == 100
    [grant] = await rows(box, "SELECT * FROM credit_grants")
    assert (grant["business_key"], grant["workspace"], grant["credits"]) == (GRANT_1, WS, 100)
    [op] = await rows(box, "SELECT business_key, fingerprint, tenant FROM relaybox_operations")
    assert op == {"business_key": GRANT_1, "fingerprint": "credits=100", "tenant": WS}
    [mail] = await rows(box, "SELECT channel, key, tenant, status FROM relaybox_outbox")
    assert mail == {
        "channel": "email",
        "key": GRANT_1 + ":confirmation",
        "tenant": WS,
        "status": "pending",
    }

    # The sender's re-delivery is a duplicate: nothing new to process.
    assert await deliver(box, invoice_paid("evt_1", "in_1")) == "duplicate"
    assert await box.worker().run_once() == 0
    assert await balance(box) == 100


async def test_two_event_ids_for_one_invoice_make_two_receipts_and_one_grant(
    box: Relaybox, clock: FrozenClock
) -> None:
    # Both in one batch (one transaction) ...
    assert await deliver(box, invoice_paid("evt_a", "in_1")) == "accepted"
    assert await deliver(box, invoice_paid("evt_b", "in_1")) == "accepted"
    assert await box.worker().run_once() == 2
    # ... and a third one later, in a batch of its own (a repair routine, say).
    clock.advance(60)
    assert await deliver(box, invoice_paid("evt_c", "in_1")) == "accepted"
    assert await box.worker().run_once() == 1

    statuses = await rows(box, "SELECT event_id, status FROM relaybox_inbox ORDER BY event_id")
    assert [(r["event_id"], r["status"]) for r in statuses] == [
        ("evt_a", "done"),
        ("evt_b", "done"),
        ("evt_c", "done"),
    ]
    assert await counts(box) == {"grants": 1, "operations": 1, "outbox": 1}
    assert await balance(box) == 100
    # The grant names the event that caused it (either of the first two: on
    # PostgreSQL they run in concurrent transactions); the others changed nothing.
    assert await scalar(box, "SELECT event_id FROM credit_grants") in ("evt_a", "evt_b")


async def test_invoices_are_separate_grants(box: Relaybox) -> None:
    for n in (1, 2, 3):
        await deliver(box, invoice_paid(f"evt_{n}", f"in_{n}"))
    assert await box.worker().run_once() == 3
    assert await counts(box) == {"grants": 3, "operations": 3, "outbox": 3}
    assert await balance(box) == 300


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (invoice_paid("evt_x", "in_x", status="open"), "is 'open', not 'paid'"),
        (invoice_paid("evt_x", "in_x", amount_paid=0), "no positive amount_paid"),
        (invoice_paid("evt_x", ""), "invoice without an id"),
        (invoice_paid("evt_x", "in_x", object="credit_note"), "not an invoice"),
        (invoice_paid("evt_x", "in_x", account="acct_unknown"), "not mapped to a workspace"),
    ],
    ids=["not-paid", "zero-amount", "no-id", "not-an-invoice", "unmapped-account"],
)
async def test_ineligible_invoice_is_dead_invalid(
    box: Relaybox, event: dict[str, Any], reason: str
) -> None:
    assert await deliver(box, event) == "accepted"
    assert await box.worker().run_once() == 1
    row = await inbox(box, "evt_x")
    assert (row["status"], row["dead_reason"], row["attempts"]) == ("dead", "invalid", 1)
    assert reason in row["last_error"]
    # The handler's savepoint rolled back: no key, no grant, no e-mail.
    assert await counts(box) == {"grants": 0, "operations": 0, "outbox": 0}
    assert await scalar(box, "SELECT count(*) FROM workspace_balances") == 0


# -- the reversal ---------------------------------------------------------------------


async def test_refund_is_its_own_operation(box: Relaybox, clock: FrozenClock) -> None:
    await deliver(box, invoice_paid("evt_paid", "in_1"))
    await box.worker().run_once()
    assert await balance(box) == 100

    await deliver(box, charge_refunded("evt_refund", "in_1"))
    assert await box.worker().run_once() == 1
    assert await balance(box) == 0
    ledger = await rows(
        box, "SELECT business_key, kind, credits FROM credit_grants ORDER BY credits"
    )
    assert ledger == [
        {
            "business_key": credits.reversal_key("stripe", ACCT, "in_1"),
            "kind": "reversal",
            "credits": -100,
        },
        {"business_key": GRANT_1, "kind": "grant", "credits": 100},
    ]
    keys = await rows(box, "SELECT key FROM relaybox_outbox ORDER BY id")
    assert [k["key"] for k in keys] == [
        GRANT_1 + ":confirmation",
        credits.reversal_key("stripe", ACCT, "in_1") + ":notice",
    ]

    # Another refund event for the invoice, a late invoice.paid, a partial refund and
    # a charge without an invoice: all recorded, none changes the balance.
    clock.advance(60)
    await deliver(box, charge_refunded("evt_refund_2", "in_1"))
    await deliver(box, invoice_paid("evt_paid_late", "in_1"))
    await deliver(box, charge_refunded("evt_partial", "in_1", refunded=False))
    await deliver(box, charge_refunded("evt_no_invoice", None))
    assert await box.worker().run_once() == 4
    assert await balance(box) == 0
    assert await scalar(box, "SELECT count(*) FROM credit_grants") == 2
    assert await scalar(box, "SELECT count(*) FROM relaybox_inbox WHERE status = 'done'") == 6


async def test_refund_seen_before_its_grant_waits_for_it(box: Relaybox, clock: FrozenClock) -> None:
    """Stripe does not order events: a refund first is retried, not dropped, and
    never turns into a grant of its own."""
    t0 = clock.now()
    await deliver(box, charge_refunded("evt_refund", "in_1"))
    assert await box.worker().run_once() == 1
    row = await inbox(box, "evt_refund")
    assert (row["status"], row["next_attempt_at"]) == ("pending", t0 + 1.0)
    assert "GrantNotRecordedYet" in row["last_error"]
    assert await counts(box) == {"grants": 0, "operations": 0, "outbox": 0}

    await deliver(box, invoice_paid("evt_paid", "in_1"))
    assert await box.worker().run_once() == 1  # the refund is not due yet
    assert await balance(box) == 100
    clock.advance(1.0)
    assert await box.worker().run_once() == 1
    assert (await inbox(box, "evt_refund"))["status"] == "done"
    assert await balance(box) == 0


# -- retries --------------------------------------------------------------------------


async def test_transient_failures_retry_on_the_backoff_schedule_then_succeed(
    database_url: str, clock: FrozenClock
) -> None:
    failures = 3

    async def flaky(ctx: Context) -> None:
        nonlocal failures
        if failures:
            failures -= 1
            raise ConnectionError("the credits service's database blinked")
        await credits.grant_initial_credits(ctx)

    box = await make_box(database_url, clock, first=flaky, max_attempts=5)
    try:
        await deliver(box, invoice_paid("evt_1", "in_1"))
        worker = box.worker()
        delays = []
        for attempt in (1, 2, 3):
            started = clock.now()
            assert await worker.run_once() == 1
            row = await inbox(box, "evt_1")
            assert (row["status"], row["attempts"]) == ("pending", attempt)
            assert row["last_error"].startswith("ConnectionError: the credits service's")
            assert await counts(box) == {"grants": 0, "operations": 0, "outbox": 0}
            delays.append(row["next_attempt_at"] - started)
            clock.set(row["next_attempt_at"] - 0.001)
            assert await worker.run_once() == 0  # not due a millisecond early
            clock.set(row["next_attempt_at"])
        assert delays == [1.0, 2.0, 4.0]  # base 1 s, factor 2, no jitter

        assert await worker.run_once() == 1
        row = await inbox(box, "evt_1")
        assert (row["status"], row["attempts"]) == ("done", 4)
        assert await outcomes(box, "evt_1") == ["retry", "retry", "retry", "done"]
        assert await counts(box) == {"grants": 1, "operations": 1, "outbox": 1}
        assert await balance(box) == 100
    finally:
        await box.close()


async def test_backoff_is_capped(database_url: str, clock: FrozenClock) -> None:
    async def failing(ctx: Context) -> None:
        raise TimeoutError("upstream")

    box = await make_box(
        database_url, clock, first=failing, max_attempts=6, backoff_base=2.0, backoff_cap=10.0
    )
    try:
        await deliver(box, invoice_paid("evt_1", "in_1"))
        delays = []
        for _ in range(5):
            started = clock.now()
            assert await box.worker().run_once() == 1
            at = (await inbox(box, "evt_1"))["next_attempt_at"]
            delays.append(at - started)
            clock.set(at)
        assert delays == [2.0, 4.0, 8.0, 10.0, 10.0]
    finally:
        await box.close()


async def test_always_failing_is_dead_exhausted_after_max_attempts(
    database_url: str, clock: FrozenClock
) -> None:
    async def failing(ctx: Context) -> None:
        raise ConnectionError("never works")

    box = await make_box(database_url, clock, first=failing, max_attempts=4)
    try:
        await deliver(box, invoice_paid("evt_1", "in_1"))
        worker = box.worker()
        for _ in range(4):
            assert await worker.run_once() == 1
            row = await inbox(box, "evt_1")
            if row["status"] != "pending":
                break
            clock.set(row["next_attempt_at"])
        assert (row["status"], row["dead_reason"], row["attempts"]) == ("dead", "exhausted", 4)
        assert "never works" in row["last_error"]
        assert await outcomes(box, "evt_1") == ["retry", "retry", "retry", "exhausted"]
        clock.advance(3600)
        assert await worker.run_once() == 0  # dead letters are not picked up again
        assert await counts(box) == {"grants": 0, "operations": 0, "outbox": 0}
    finally:
        await box.close()


async def test_time_budget_exhausts_before_the_attempt_budget(
    database_url: str, clock: FrozenClock
) -> None:
    async def failing(ctx: Context) -> None:
        raise ConnectionError("still down")

    # max_age 10 s: attempt 1 at t0 → retry at t0+4 (age 4); attempt 2 at t0+4 would
    # retry at t0+12, past the budget → dead after 2 of 10 allowed attempts.
    box = await make_box(
        database_url, clock, first=failing, max_attempts=10, max_age=10.0, backoff_base=4.0
    )
    try:
        t0 = clock.now()
        await deliver(box, invoice_paid("evt_1", "in_1"))
        assert await box.worker().run_once() == 1
        assert (await inbox(box, "evt_1"))["next_attempt_at"] == t0 + 4.0
        clock.set(t0 + 4.0)
        assert await box.worker().run_once() == 1
        row = await inbox(box, "evt_1")
        assert (row["status"], row["dead_reason"], row["attempts"]) == ("dead", "exhausted", 2)
        assert await outcomes(box, "evt_1") == ["retry", "exhausted"]
    finally:
        await box.close()


async def test_unrelated_stripe_events_are_recorded_without_effect(box: Relaybox) -> None:
    event = invoice_paid("evt_cust", "cus_1")
    event["type"] = "customer.updated"
    await deliver(box, event)
    assert await box.worker().run_once() == 1
    assert (await inbox(box, "evt_cust"))["status"] == "done"
    assert await counts(box) == {"grants": 0, "operations": 0, "outbox": 0}
