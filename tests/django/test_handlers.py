"""Handlers on Django's ORM: ``credits.webhooks.grant_initial_credits`` (the example's
plain ``def`` handler using Django models) runs inside ``transaction.atomic()`` on
Django's connection, with ``ctx.once()``, ``ctx.outbox.add()`` and the inbox row's
completion in that transaction. Deliveries come through the Django view, served for
real; the worker runs in relaybox's loop of this process."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from examples.django_credits.credits.models import Balance, Grant

from relaybox.contrib.django import get_box
from relaybox.sync import SyncContext
from relaybox.testing import signed_delivery
from tests.django.conftest import BOTH, drain_when_due, drain_worker, rows
from tests.django.servers import post
from tests.support.faultapp import invoice_paid

pytestmark = pytest.mark.django_db(transaction=True, databases=BOTH)

WS = "ws_django"
FAILURES: list[int] = []


def fails_first(ctx: SyncContext) -> None:
    """Writes everything a handler can (a model row, a business key, an outbox row),
    then raises on its first attempt."""
    key = f"flaky:{ctx.event.event_id}"
    assert ctx.once(key)
    Grant.objects.create(
        business_key=key, kind="grant", workspace=WS, invoice_id="in_flaky", credits=1, event_id="e"
    )
    ctx.outbox.add("email", key, {"to": "ops"})
    if not FAILURES:
        FAILURES.append(ctx.event.attempts)
        raise RuntimeError("the handler failed after writing")


get_box().handler("stripe", "test.flaky")(fails_first)

PROJECTION_FAILURES: list[int] = []


def projects_then_fails_first(ctx: SyncContext) -> None:
    """``ctx.project()`` and a model row in the handler's transaction, then raises on
    its first attempt."""
    assert ctx.project("customer:cus_1", 7, {"plan": "pro"})
    Grant.objects.create(
        business_key=f"projected:{ctx.event.event_id}",
        kind="grant",
        workspace=WS,
        invoice_id="in_projected",
        credits=1,
        event_id=ctx.event.event_id,
    )
    if not PROJECTION_FAILURES:
        PROJECTION_FAILURES.append(ctx.event.attempts)
        raise RuntimeError("the handler failed after projecting")


get_box().handler("stripe", "test.projected")(projects_then_fails_first)


def deliver(url: str, event: dict[str, Any]) -> str:
    delivery = signed_delivery(
        get_box().sources["stripe"], event_id=event["id"], event_type=event["type"], payload=event
    )
    answer = post(f"{url}/webhooks/stripe", delivery.body, delivery.headers)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["status"])


def test_the_orm_handler_grants_once(alias: str, live_server: Any) -> None:
    assert deliver(live_server.url, invoice_paid("evt_h1", "in_h1", account="acct_django")) == (
        "accepted"
    )
    assert drain_worker() == 1
    [grant] = Grant.objects.all()
    assert (grant.workspace, grant.invoice_id, grant.credits) == (WS, "in_h1", 100)
    assert Balance.objects.get(workspace=WS).credits == 100
    assert rows(alias, "SELECT status, attempts FROM relaybox_inbox") == [
        {"status": "done", "attempts": 1}
    ]
    assert [
        r["business_key"] for r in rows(alias, "SELECT business_key FROM relaybox_operations")
    ] == ["stripe:acct_django:in_h1:initial-credit-grant"]


def test_fifty_copies_and_two_event_ids_for_one_invoice_grant_once(
    alias: str, live_server: Any
) -> None:
    event = invoice_paid("evt_h2", "in_h2", account="acct_django")
    with ThreadPoolExecutor(16) as pool:
        outcomes = sorted(pool.map(lambda _: deliver(live_server.url, event), range(50)))
    assert outcomes == ["accepted"] + ["duplicate"] * 49
    other = invoice_paid("evt_h2_again", "in_h2", account="acct_django")  # same invoice
    assert deliver(live_server.url, other) == "accepted"
    assert drain_worker() == 2
    assert Grant.objects.count() == 1
    assert Balance.objects.get(workspace=WS).credits == 100
    statuses = rows(alias, "SELECT event_id, status FROM relaybox_inbox ORDER BY event_id")
    assert statuses == [
        {"event_id": "evt_h2", "status": "done"},
        {"event_id": "evt_h2_again", "status": "done"},
    ]


def test_a_handler_that_raises_leaves_nothing_and_retries(alias: str, live_server: Any) -> None:
    FAILURES.clear()
    event = {
        "id": "evt_flaky",
        "object": "event",
        "type": "test.flaky",
        "account": "acct_django",
        "created": 1_700_000_000,
        "data": {"object": {}},
    }
    assert deliver(live_server.url, event) == "accepted"
    assert drain_worker() == 1
    assert FAILURES == [1]
    # Rolled back: no model row, no business key, no outbox row; the event waits.
    assert Grant.objects.count() == 0
    assert rows(alias, "SELECT business_key FROM relaybox_operations") == []
    assert rows(alias, "SELECT id FROM relaybox_outbox") == []
    [row] = rows(alias, "SELECT status, attempts, last_error FROM relaybox_inbox")
    assert (row["status"], row["attempts"]) == ("pending", 1)
    assert "the handler failed after writing" in row["last_error"]

    assert drain_when_due() == 1  # the retry, after its backoff (0.2 s)
    assert Grant.objects.count() == 1
    assert len(rows(alias, "SELECT business_key FROM relaybox_operations")) == 1
    assert len(rows(alias, "SELECT id FROM relaybox_outbox")) == 1
    [row] = rows(alias, "SELECT status, attempts FROM relaybox_inbox")
    assert row == {"status": "done", "attempts": 2}


def test_a_projection_rolls_back_with_the_model_row_and_is_written_once_on_retry(
    alias: str, live_server: Any
) -> None:
    PROJECTION_FAILURES.clear()
    event = {
        "id": "evt_projected",
        "object": "event",
        "type": "test.projected",
        "account": "acct_django",
        "created": 1_700_000_000,
        "data": {"object": {}},
    }
    projection = "SELECT resource_key, version, state FROM relaybox_projections"
    assert deliver(live_server.url, event) == "accepted"
    assert drain_worker() == 1
    assert PROJECTION_FAILURES == [1]
    # Rolled back together: no projection, no model row; the event waits.
    assert rows(alias, projection) == []
    assert Grant.objects.count() == 0
    [row] = rows(alias, "SELECT status, attempts, last_error FROM relaybox_inbox")
    assert (row["status"], row["attempts"]) == ("pending", 1)
    assert "the handler failed after projecting" in row["last_error"]

    assert drain_when_due() == 1  # the retry, after its backoff (0.2 s)
    [stored] = rows(alias, projection)
    assert (stored["resource_key"], stored["version"]) == ("customer:cus_1", "7")
    assert json.loads(stored["state"]) == {"plan": "pro"}
    assert [g.invoice_id for g in Grant.objects.all()] == ["in_projected"]
    assert rows(alias, "SELECT status, attempts FROM relaybox_inbox") == [
        {"status": "done", "attempts": 2}
    ]
