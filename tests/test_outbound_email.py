"""Seed 000's confirmation e-mail: the credits example's handler records it in the
outbox with the grant, and the dispatcher sends it through SMTP once per grant,
whatever event ids name the invoice. SMTP is a real local server (aiosmtpd)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from email.message import EmailMessage
from typing import Any

import pytest
from examples.credits import app as credits

from relaybox import FrozenClock, Relaybox
from relaybox.config import Settings
from relaybox.outbound import EmailChannel
from relaybox.outbound.channels import render_message
from tests.support.faultapp import invoice_paid, post_asgi
from tests.support.outbound_app import local, outbox_rows
from tests.support.receivers import SmtpSink


def confirmation(payload: Mapping[str, Any]) -> EmailMessage:
    """The example records a template and its facts; the application renders them."""
    return render_message(
        {
            "to": f"billing@{payload['workspace']}.example",
            "subject": f"{payload['credits']} credits added",
            "text": f"Invoice {payload['invoice']} added {payload['credits']} credits.",
        }
    )


@pytest.fixture
async def sink() -> AsyncIterator[SmtpSink]:
    async with SmtpSink() as s:
        yield s


@pytest.fixture
async def credits_box(database_url: str, clock: FrozenClock) -> AsyncIterator[Relaybox]:
    box = credits.configure(Relaybox(settings=Settings(database_url=database_url), clock=clock))
    await credits.setup(box)
    yield box
    await box.close()


async def test_the_confirmation_email_is_sent_once_per_grant(
    credits_box: Relaybox, sink: SmtpSink
) -> None:
    box = credits_box
    email = EmailChannel(host="127.0.0.1", port=sink.port, sender="credits@relaybox.test")
    email.render = confirmation
    local(box).channel("email", email)
    for event in (
        invoice_paid("evt_1", "in_1"),
        invoice_paid("evt_2", "in_1"),  # another event for the same invoice: no new grant
        invoice_paid("evt_1", "in_1"),  # the provider's re-delivery: a duplicate
        invoice_paid("evt_3", "in_2"),
    ):
        status, _ = await post_asgi(box, event)
        assert status == 200
    worker, dispatcher = box.worker(), box.dispatcher()
    try:
        while await worker.run_once():
            pass
        assert await dispatcher.run_once() == 2
        assert await dispatcher.run_once() == 0
    finally:
        await dispatcher.close()

    assert sorted(m["Subject"] for m in sink.messages) == ["100 credits added"] * 2
    assert sorted(m.get_payload().strip() for m in sink.messages) == [  # type: ignore[union-attr]
        "Invoice in_1 added 100 credits.",
        "Invoice in_2 added 100 credits.",
    ]
    assert {m["From"] for m in sink.messages} == {"credits@relaybox.test"}
    assert sink.envelopes[0][1] == ["billing@ws_dev.example"]
    assert len({m["Message-ID"] for m in sink.messages}) == 2
    rows = await outbox_rows(box)
    assert [(r["channel"], r["status"]) for r in rows] == [("email", "sent")] * 2
    assert all(r["key"].endswith(":confirmation") for r in rows)


async def test_an_email_that_cannot_be_rendered_is_dead_without_connecting(
    box: Relaybox, sink: SmtpSink
) -> None:
    local(box).channel(
        "email", EmailChannel(host="127.0.0.1", port=sink.port, sender="x@relaybox.test")
    )
    async with box.store.transaction() as conn:
        await box.store.outbox_insert(
            conn,
            channel="email",
            key="k1",
            payload='{"subject": "no recipient"}',
            tenant=None,
            inbox_id=None,
            now=box.clock.now(),
        )
    dispatcher = box.dispatcher()
    try:
        assert await dispatcher.run_once() == 1
    finally:
        await dispatcher.close()
    [row] = await outbox_rows(box)
    assert (row["status"], row["dead_reason"]) == ("dead", "rejected")
    assert "lacks to, text" in row["last_error"]
    assert sink.messages == []
