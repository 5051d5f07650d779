"""The credits example's handlers on Django's ORM: ``invoice.paid`` grants 100
credits to the account's workspace once per invoice, however many events name it;
``charge.refunded`` (a full refund of an invoice's charge) reverses them, once.

relaybox imports this module at start (the ``webhooks`` module of every installed
app). Each handler runs inside ``transaction.atomic()`` on Django's connection, with
``ctx.once()``, ``ctx.outbox.add()`` and the inbox row's completion in that
transaction: all of it commits, or none of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db.models import F

from relaybox import Context, PermanentError
from relaybox.contrib.django import box

from .models import Balance, Grant

CREDITS_PER_INVOICE = 100
EMAIL = "email"  # outbox channel of the confirmation e-mails


class GrantNotRecordedYet(Exception):
    """A refund arrived before the grant it reverses (Stripe does not order events):
    retried with backoff until the grant exists."""


def grant_key(ctx: Context, invoice_id: str) -> str:
    return f"{ctx.event.source}:{ctx.event.account}:{invoice_id}:initial-credit-grant"


def reversal_key(ctx: Context, invoice_id: str) -> str:
    return f"{ctx.event.source}:{ctx.event.account}:{invoice_id}:credit-reversal"


def _object(ctx: Context) -> Mapping[str, Any]:
    data = ctx.payload.get("data") if isinstance(ctx.payload, Mapping) else None
    obj = data.get("object") if isinstance(data, Mapping) else None
    if not isinstance(obj, Mapping):
        raise PermanentError(f"{ctx.event.event_type} without data.object")
    return obj


def _workspace(ctx: Context) -> str:
    if not ctx.tenant:  # from the verified account (settings), never from the payload
        raise PermanentError(f"account {ctx.event.account!r} is not mapped to a workspace")
    return ctx.tenant


def _add(workspace: str, credits: int) -> None:
    Balance.objects.get_or_create(workspace=workspace)
    Balance.objects.filter(workspace=workspace).update(credits=F("credits") + credits)


@box.handler("stripe", "invoice.paid")
def grant_initial_credits(ctx: Context) -> None:
    invoice = _object(ctx)
    workspace = _workspace(ctx)
    invoice_id = invoice.get("id")
    amount = invoice.get("amount_paid")
    if not isinstance(invoice_id, str) or invoice.get("status") != "paid":
        raise PermanentError("not a paid invoice")
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        raise PermanentError(f"invoice {invoice_id} has no positive amount_paid")
    key = grant_key(ctx, invoice_id)
    if ctx.once(key, fingerprint=f"credits={CREDITS_PER_INVOICE}"):
        Grant.objects.create(
            business_key=key,
            kind="grant",
            workspace=workspace,
            invoice_id=invoice_id,
            credits=CREDITS_PER_INVOICE,
            event_id=ctx.event.event_id,
        )
        _add(workspace, CREDITS_PER_INVOICE)
        ctx.outbox.add(
            EMAIL,
            f"{key}:confirmation",
            {"template": "credits-granted", "workspace": workspace, "invoice": invoice_id},
        )
        return
    # Already granted (another event, a re-delivery, a replay): check it is this grant.
    recorded = Grant.objects.filter(business_key=key).first()
    if recorded is None or (recorded.workspace, recorded.credits) != (
        workspace,
        CREDITS_PER_INVOICE,
    ):
        raise PermanentError(f"{key} is recorded, but not as +{CREDITS_PER_INVOICE}")


@box.handler("stripe", "charge.refunded")
def reverse_credits(ctx: Context) -> None:
    charge = _object(ctx)
    invoice_id = charge.get("invoice")
    if not isinstance(invoice_id, str) or charge.get("refunded") is not True:
        return  # a partial refund, or a charge without an invoice: nothing to reverse
    workspace = _workspace(ctx)
    granted = Grant.objects.filter(business_key=grant_key(ctx, invoice_id)).first()
    if granted is None:
        raise GrantNotRecordedYet(f"no initial grant recorded for invoice {invoice_id} yet")
    key = reversal_key(ctx, invoice_id)
    if ctx.once(key, fingerprint=f"credits={-granted.credits}"):
        Grant.objects.create(
            business_key=key,
            kind="reversal",
            workspace=workspace,
            invoice_id=invoice_id,
            credits=-granted.credits,
            event_id=ctx.event.event_id,
        )
        _add(workspace, -granted.credits)
        ctx.outbox.add(
            EMAIL,
            f"{key}:notice",
            {"template": "credits-reversed", "workspace": workspace, "invoice": invoice_id},
        )
