"""The credits example's handlers, on Django's ORM: ``invoice.paid`` grants 100
credits to the account's workspace, once per invoice, however many events name it.

Imported at start by ``relaybox.contrib.django`` (the ``webhooks`` module of every
installed app). Each handler runs inside ``transaction.atomic()`` on Django's
connection, with ``ctx.once()`` and the inbox row's completion in that transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db.models import F

from relaybox import Context, PermanentError
from relaybox.contrib.django import box

from .models import Balance, Grant

CREDITS_PER_INVOICE = 100


def grant_key(ctx: Context, invoice_id: str) -> str:
    return f"{ctx.event.source}:{ctx.event.account}:{invoice_id}:initial-credit-grant"


@box.handler("stripe", "invoice.paid")
def grant_initial_credits(ctx: Context) -> None:
    invoice: Mapping[str, Any] = (ctx.payload.get("data") or {}).get("object") or {}
    invoice_id = invoice.get("id")
    if not ctx.tenant:  # from the verified account (settings), never from the payload
        raise PermanentError(f"account {ctx.event.account!r} is not mapped to a workspace")
    if not isinstance(invoice_id, str) or invoice.get("status") != "paid":
        raise PermanentError("not a paid invoice")
    if ctx.once(grant_key(ctx, invoice_id), fingerprint=f"credits={CREDITS_PER_INVOICE}"):
        Grant.objects.create(
            business_key=grant_key(ctx, invoice_id),
            workspace=ctx.tenant,
            invoice_id=invoice_id,
            credits=CREDITS_PER_INVOICE,
            event_id=ctx.event.event_id,
        )
        Balance.objects.get_or_create(workspace=ctx.tenant)
        Balance.objects.filter(workspace=ctx.tenant).update(
            credits=F("credits") + CREDITS_PER_INVOICE
        )
