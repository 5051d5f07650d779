"""relaybox's pages in the Django admin render on both backends, and their actions go
through relaybox's operator use cases: a dead letter retried with a reason goes back
to the worker (and its handler grants), one discarded leaves the dead letters, a
quarantined delivery is resolved."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db import transaction
from django.test import Client
from examples.django_credits.credits.models import Grant

from relaybox.contrib.django import publish
from tests.django.conftest import BOTH, drain_worker, rows
from tests.django.test_handlers import deliver
from tests.support.faultapp import invoice_paid

pytestmark = pytest.mark.django_db(transaction=True, databases=BOTH)

PAGES = ["inboxevent", "deadletter", "quarantined", "message", "delivery"]


def dead_letter(url: str, alias: str, event_id: str, invoice: str) -> int:
    """An invoice the handler refuses (not paid): dead, reason ``invalid``."""
    event = invoice_paid(event_id, invoice, account="acct_django", status="open")
    assert deliver(url, event) == "accepted"
    drain_worker()
    query = "SELECT id, status FROM relaybox_inbox WHERE event_id = %s"
    [row] = rows(alias, query, event_id)
    assert row["status"] == "dead"
    return int(row["id"])


@pytest.fixture
def staff(alias: str, admin_client: Client) -> Client:
    return admin_client


def test_the_pages_render(alias: str, staff: Client, live_server: Any) -> None:
    dead_letter(live_server.url, alias, "evt_a1", "in_a1")
    with transaction.atomic(using=alias):
        publish("order.completed", {"n": 1}, tenant="ws_django", idempotency_key="a-1")
    index = staff.get("/admin/relaybox/")
    assert index.status_code == 200
    for page in PAGES:
        listing = staff.get(f"/admin/relaybox/{page}/")
        assert listing.status_code == 200, page
    assert b"evt_a1" in staff.get("/admin/relaybox/deadletter/").content
    assert b"order.completed" in staff.get("/admin/relaybox/message/").content
    [row] = rows(alias, "SELECT id FROM relaybox_inbox")
    detail = staff.get(f"/admin/relaybox/inboxevent/{row['id']}/change/")
    assert detail.status_code == 200 and b"evt_a1" in detail.content


def test_retry_asks_for_a_reason_then_sends_it_back_to_the_worker(
    alias: str, staff: Client, live_server: Any
) -> None:
    inbox_id = dead_letter(live_server.url, alias, "evt_a2", "in_a2")
    chosen = {"action": "retry", ACTION_CHECKBOX_NAME: [str(inbox_id)]}
    asked = staff.post("/admin/relaybox/deadletter/", chosen)
    assert asked.status_code == 200 and b"reason" in asked.content
    assert rows(alias, "SELECT status FROM relaybox_inbox") == [{"status": "dead"}]

    done = staff.post(
        "/admin/relaybox/deadletter/", {**chosen, "apply": "1", "reason": "fixed the handler"}
    )
    assert done.status_code == 302
    [row] = rows(alias, "SELECT status FROM relaybox_inbox")
    assert row["status"] == "pending"
    [replay] = rows(alias, "SELECT actor, reason FROM relaybox_replays")
    assert replay == {"actor": "django:admin", "reason": "fixed the handler"}
    assert b"evt_a2" not in staff.get("/admin/relaybox/deadletter/").content


def test_discard_keeps_who_and_why(alias: str, staff: Client, live_server: Any) -> None:
    inbox_id = dead_letter(live_server.url, alias, "evt_a3", "in_a3")
    staff.post(
        "/admin/relaybox/deadletter/",
        {
            "action": "discard",
            ACTION_CHECKBOX_NAME: [str(inbox_id)],
            "apply": "1",
            "reason": "a test invoice",
        },
    )
    [row] = rows(alias, "SELECT status, discarded_by, discard_reason FROM relaybox_inbox")
    assert row == {
        "status": "dead",
        "discarded_by": "django:admin",
        "discard_reason": "a test invoice",
    }
    assert b"evt_a3" not in staff.get("/admin/relaybox/deadletter/").content
    assert Grant.objects.count() == 0


def test_a_user_without_the_permission_cannot_act(
    alias: str, live_server: Any, django_user_model: Any
) -> None:
    inbox_id = dead_letter(live_server.url, alias, "evt_a4", "in_a4")
    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    from django.contrib.auth.models import Permission

    user.user_permissions.add(Permission.objects.get(codename="view_deadletter"))
    client = Client()
    client.force_login(user)
    assert client.get("/admin/relaybox/deadletter/").status_code == 200
    client.post(
        "/admin/relaybox/deadletter/",
        {"action": "retry", ACTION_CHECKBOX_NAME: [str(inbox_id)], "apply": "1", "reason": "x"},
    )
    assert rows(alias, "SELECT status FROM relaybox_inbox") == [{"status": "dead"}]


def test_resolve_a_quarantined_delivery(alias: str, staff: Client, live_server: Any) -> None:
    assert deliver(live_server.url, invoice_paid("evt_q", "in_q", account="acct_django")) == (
        "accepted"
    )
    changed = invoice_paid("evt_q", "in_q", account="acct_django", amount_paid=1)
    assert deliver(live_server.url, changed) == "quarantined"
    [entry] = rows(alias, "SELECT id FROM relaybox_quarantine")
    assert b"evt_q" in staff.get("/admin/relaybox/quarantined/").content
    staff.post(
        "/admin/relaybox/quarantined/",
        {
            "action": "keep_original",
            ACTION_CHECKBOX_NAME: [str(entry["id"])],
            "apply": "1",
            "reason": "a resend with a changed amount",
        },
    )
    [resolved] = rows(
        alias, "SELECT resolution, resolved_by, resolution_reason FROM relaybox_quarantine"
    )
    assert resolved == {
        "resolution": "kept_original",
        "resolved_by": "django:admin",
        "resolution_reason": "a resend with a changed amount",
    }
