"""The application the simulation runs in every ``relaybox`` process
(``--app tests.sim.app:box``): the credits example, whose ``invoice.paid`` handler
also publishes an outbound webhook and behaves as the delivery asks.

An invoice may carry ``"sim": {...}`` (written by the schedule, signed with the rest):

``fail: "transient", times: N``  raise a transient error on the first N attempts;
``fail: "permanent"``            grant, publish, *then* raise ``PermanentError``: the
                                 whole transaction (grant, e-mail, webhook) rolls back;
``slow: S``                      sleep S seconds inside the transaction first.

Every granted invoice publishes ``credits.granted`` to tenant ``t1`` with the
invoice's ``customer`` as its ordering key and its subject (the inbox event is indexed
under the same subject: ``data.object.customer``), and the credits e-mail goes to a file
(``SIM_MAILBOX``, one JSON line per send): the broker the simulation reads back.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from examples.credits import app as credits

from relaybox import Context, PermanentError, Relaybox, sources
from relaybox.outbound import Outbound
from relaybox.outbound.channels.base import Channel, Result
from relaybox.store.outbox_rows import Delivery
from tests.support.outbound_app import local

__all__ = ["OUTBOUND", "MailboxChannel", "SimTransientError", "box", "make_box"]

OUTBOUND: dict[str, Any] = {
    "timeout": 1.0,
    "min_timeout": 0.05,
    "max_timeout": 2.0,
    "lease_ttl": 7.0,  # at least max_timeout + 5
    "poll_interval": 0.1,
    "retry_after_cap": 2.0,
}
"""Short budgets so that a timeout, an expired lease and a retry take about a second."""


class SimTransientError(Exception):
    """The handler's planned transient failure (retried with backoff)."""


class MailboxChannel(Channel):
    """The credits e-mails, appended to a file: one JSON line ``{"key", "payload"}`` per
    send. ``O_APPEND`` writes of one line are atomic, so processes share the file."""

    kind = "custom"

    def __init__(self, path: str) -> None:
        super().__init__(schedule=[0.1, 0.2])
        self.path = path

    async def deliver(self, delivery: Delivery) -> Result:
        line = json.dumps({"key": delivery.key, "payload": delivery.payload}) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
        return Result("sent")


def _plan(ctx: Context) -> dict[str, Any]:
    obj = ctx.payload.get("data", {}).get("object", {}) if isinstance(ctx.payload, dict) else {}
    plan = obj.get("sim") if isinstance(obj, dict) else None
    return plan if isinstance(plan, dict) else {}


async def grant_and_publish(ctx: Context) -> None:
    plan = _plan(ctx)
    slow = plan.get("slow")
    if isinstance(slow, (int, float)) and 0 < slow <= 5:
        await asyncio.sleep(slow)
    if plan.get("fail") == "transient" and ctx.event.attempts < int(plan.get("times", 1)):
        raise SimTransientError(f"planned transient failure, attempt {ctx.event.attempts}")
    before = len(ctx.outbox_rows)
    await credits.grant_initial_credits(ctx)
    invoice = ctx.payload["data"]["object"]
    if len(ctx.outbox_rows) > before:  # this event made the grant
        await ctx.box.publish(  # type: ignore[attr-defined]
            ctx.conn,
            "credits.granted",
            {
                "invoice": invoice["id"],
                "event": ctx.event.event_id,
                "seq": invoice.get("seq"),
                "customer": invoice.get("customer"),
            },
            tenant="t1",
            ordering_key=str(invoice.get("customer") or "none"),
            subject=invoice.get("customer"),
        )
    if plan.get("fail") == "permanent":
        raise PermanentError("planned permanent failure after the effect")


def make_box() -> Relaybox:
    b = Relaybox(settings=credits.default_settings())
    b.handler(
        "stripe",
        "invoice.paid",
        business_key=credits.initial_grant_key,
        fingerprint=f"credits={credits.CREDITS_PER_INVOICE}",
    )(grant_and_publish)
    # credits.configure(b), with the customer as the subject an erasure names.
    env = os.environ
    b.source(
        "stripe",
        sources.stripe(
            secrets=[env.get("CREDITS_STRIPE_SECRET") or credits.DEV_SECRET],
            account=env.get("CREDITS_ACCOUNT") or credits.DEV_ACCOUNT,
            tenants=credits.tenants_from_env(env),
            subject="data.object.customer",
        ),
    )
    b.handler("stripe", "charge.refunded")(credits.reverse_credits)
    b.handler("stripe", "*")(credits.record_only)
    outbound: Outbound = local(b, **OUTBOUND)
    outbound.channel(credits.EMAIL, MailboxChannel(os.environ.get("SIM_MAILBOX", "mailbox.jsonl")))
    return b


box = make_box()
