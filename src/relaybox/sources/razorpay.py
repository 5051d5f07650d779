"""Razorpay: ``X-Razorpay-Signature: <hex HMAC-SHA256 of the body>``.

What is signed: the raw body, HMAC-SHA256 in hex keyed with the webhook secret, as
the ``razorpay`` package's ``Utility.verify_webhook_signature`` computes it. No
timestamp: no tolerance.

Identity: the ``X-Razorpay-Event-Id`` header (the same on Razorpay's retries), the
body's ``event`` as the type (``payment.captured``) and ``account_id`` as the
account.
"""

from __future__ import annotations

from relaybox.sources.scheme import Hmac, Scheme, SchemeSource, factory

__all__ = ["RazorpaySource", "razorpay"]


class RazorpaySource(SchemeSource):
    """Razorpay webhooks."""

    provider = "razorpay"
    scheme = Scheme(
        Hmac("X-Razorpay-Signature"),
        event_id="header:X-Razorpay-Event-Id",
        event_type="event",
        account="account_id",
        default_type="payment.captured",
        default_account="acc_RelayboxTest01",
        example=lambda event: {
            "entity": "event",
            "account_id": event.account,
            "event": event.type,
            "contains": ["payment"],
            "payload": {"payment": {"entity": {"id": "pay_relaybox", "amount": 2000}}},
            "created_at": int(event.now),
        },
    )


razorpay = factory(RazorpaySource, "A Razorpay source; ``secrets`` are webhook secrets.")
