"""Stripe: ``Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>][,v0=...]``.

What is signed: ``f"{t}.".encode() + body``, HMAC-SHA256 in lower-case hex, keyed
with the endpoint secret's UTF-8 bytes (``whsec_...`` is used as is, not base64
decoded: that is what Stripe does). Behaviour follows the official library
(``stripe._webhook.WebhookSignature``): the first ``t`` counts and is re-formatted
as an integer before signing, any ``v1`` entry may match (Stripe sends two while
an endpoint secret is being rolled), other schemes (``v0`` test signatures) are
ignored.

One deliberate difference: Stripe's library only refuses timestamps that are too
old; we also refuse ones too far in the future, so a leaked signed request cannot
be post-dated to outlive the tolerance window.

The event id is ``payload["id"]`` (``evt_...``, the same on every retry), the type
``payload["type"]``, and the account ``payload["account"]`` on Connect events, so
one platform secret can serve many connected accounts.
"""

from __future__ import annotations

from typing import Any

from relaybox.sources.scheme import Entries, Example, Hmac, Sample, Scheme, SchemeSource, factory

__all__ = ["StripeSource", "stripe"]


def _example(event: Example) -> dict[str, Any]:
    return {
        "id": event.id,
        "object": "event",
        "api_version": "2024-06-20",
        "created": int(event.now),
        "type": event.type,
        "livemode": False,
        "pending_webhooks": 1,
        "request": {"id": None, "idempotency_key": None},
        "data": {"object": _example_object(event.type, event.now)},
    }


def _example_object(event_type: str, now: float) -> dict[str, Any]:
    """The object a Stripe event of ``event_type`` carries, with the fields handlers
    read (an ``invoice.*`` event carries an invoice with ``amount_paid``)."""
    kind = event_type.rsplit(".", 1)[0]
    if kind == "invoice":
        return {
            "id": "in_relaybox_test",
            "object": "invoice",
            "customer": "cus_relaybox_test",
            "subscription": "sub_relaybox_test",
            "amount_due": 2000,
            "amount_paid": 2000 if event_type == "invoice.paid" else 0,
            "amount_remaining": 0 if event_type == "invoice.paid" else 2000,
            "currency": "usd",
            "status": "paid" if event_type == "invoice.paid" else "open",
            "paid": event_type == "invoice.paid",
            "created": int(now),
        }
    if kind in ("customer.subscription", "subscription"):
        return {
            "id": "sub_relaybox_test",
            "object": "subscription",
            "customer": "cus_relaybox_test",
            "status": "active",
            "created": int(now),
        }
    if kind == "checkout.session":
        return {
            "id": "cs_relaybox_test",
            "object": "checkout.session",
            "customer": "cus_relaybox_test",
            "amount_total": 2000,
            "currency": "usd",
            "payment_status": "paid",
            "status": "complete",
        }
    return {
        "id": "pi_relaybox_test",
        "object": "payment_intent",
        "amount": 2000,
        "amount_received": 2000,
        "currency": "usd",
        "status": "succeeded",
    }


class StripeSource(SchemeSource):
    """Stripe webhook endpoints (snapshot events, including Connect)."""

    provider = "stripe"
    scheme = Scheme(
        Hmac("Stripe-Signature", "{timestamp}.{body}", entries=Entries(), canonical_timestamp=True),
        event_id="id",
        event_type="type",
        account="account",
        version="api_version",
        sample=Sample(type="payment_intent.succeeded", body=_example, content_type=None),
    )


stripe = factory(
    StripeSource,
    """A Stripe source; ``secrets`` are endpoint secrets (``whsec_...``). ``options``
    are :class:`Source` arguments (``tolerance``, ``tenants``, ...).""",
)
