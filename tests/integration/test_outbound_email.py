"""The confirmation e-mail: the credits example's handler records it in the
outbox with the grant, and the dispatcher sends it through SMTP once per grant,
whatever event ids name the invoice. SMTP is a real local server (aiosmtpd)."""

from __future__ import annotations

import asyncio
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
from tests.support.procs import free_port
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


async def _send_one(
    box: Relaybox,
    channel: EmailChannel,
    payload: str = '{"to": "ops@example.test", "subject": "s", "text": "t"}',
) -> dict[str, Any]:
    """One e-mail through the dispatcher and ``channel``; its outbox row after."""
    local(box).channel("email", channel)
    async with box.store.transaction() as conn:
        await box.store.inbox.outbox_insert(
            conn,
            channel="email",
            key="k-smtp",
            payload=payload,
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
    return row


async def test_an_email_that_cannot_be_rendered_is_dead_without_connecting(
    box: Relaybox, sink: SmtpSink
) -> None:
    row = await _send_one(
        box,
        EmailChannel(host="127.0.0.1", port=sink.port, sender="x@relaybox.test"),
        payload='{"subject": "no recipient"}',
    )
    assert (row["status"], row["dead_reason"]) == ("dead", "rejected")
    assert "lacks to, text" in row["last_error"]
    assert sink.messages == []


@pytest.mark.parametrize(
    ("sink_kwargs", "dead", "error"),
    [
        ({"data_reply": "554 5.7.1 message refused"}, True, "SMTP 554 5.7.1 message refused"),
        ({"data_reply": "451 4.3.0 try again later"}, False, "SMTP 451 4.3.0 try again later"),
        ({"rcpt_reply": "550 5.1.1 no such user"}, True, "recipients refused [550]"),
        ({"rcpt_reply": "450 4.2.1 mailbox busy"}, False, "recipients refused [450]"),
    ],
    ids=["data-5xx", "data-4xx", "rcpt-5xx", "rcpt-4xx"],
)
async def test_an_smtp_refusal_is_dead_when_permanent_and_retried_when_not(
    box: Relaybox, sink_kwargs: dict[str, str], dead: bool, error: str
) -> None:
    """A real server's 5xx is the receiver's final word (dead letter, no retry); a 4xx
    asks to come back later (retried on the channel's schedule)."""
    async with SmtpSink(**sink_kwargs) as refusing:
        row = await _send_one(
            box, EmailChannel(host="127.0.0.1", port=refusing.port, sender="x@relaybox.test")
        )
        assert refusing.messages == []
    assert error in row["last_error"]
    if dead:
        assert (row["status"], row["dead_reason"]) == ("dead", "rejected")
    else:
        assert row["status"] == "pending" and row["dead_reason"] is None
        assert row["next_attempt_at"] > box.clock.now()


async def test_an_smtp_server_that_is_down_or_silent_is_retried(box: Relaybox) -> None:
    """Nothing listening (connection refused), then a server that takes the connection
    and never greets: both are retried, the second after the channel's timeout."""
    row = await _send_one(
        box, EmailChannel(host="127.0.0.1", port=free_port(), sender="x@relaybox.test")
    )
    assert row["status"] == "pending" and "ConnectionRefusedError" in row["last_error"]

    silent = await asyncio.get_running_loop().create_server(asyncio.Protocol, "127.0.0.1", 0)
    try:
        port = silent.sockets[0].getsockname()[1]
        async with box.store.transaction() as conn:
            # The row and its key (PostgreSQL decides an outbox key by its keys table,
            # migration 0034): the same key goes in again as new.
            await conn.exec_driver_sql("DELETE FROM relaybox_outbox")
            if box.store.backend == "postgres":
                await conn.exec_driver_sql("DELETE FROM relaybox_outbox_keys")
        row = await _send_one(
            box,
            EmailChannel(host="127.0.0.1", port=port, sender="x@relaybox.test", timeout=0.3),
        )
    finally:
        silent.close()
    assert row["status"] == "pending"
    assert row["last_error"] == "SMTP timed out after 0.3 s"
