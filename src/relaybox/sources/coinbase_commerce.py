"""Coinbase Commerce: ``X-CC-Webhook-Signature: <hex HMAC-SHA256 of the body>``.

What is signed: the raw body, HMAC-SHA256 in hex keyed with the endpoint's shared
secret, as the ``coinbase-commerce`` package's ``WebhookSignature`` computes it. No
timestamp: no tolerance.

Identity: the event inside the delivery, ``event.id`` (the delivery's own ``id`` and
``attempt_number`` change with each attempt, so only ``event`` counts for the
fingerprint), ``event.type`` (``charge:confirmed``) as the type.
"""

from __future__ import annotations

from relaybox.sources.scheme import Hmac, Scheme, SchemeSource, factory

__all__ = ["CoinbaseCommerceSource", "coinbase_commerce"]


class CoinbaseCommerceSource(SchemeSource):
    """Coinbase Commerce webhook subscriptions."""

    provider = "coinbase_commerce"
    scheme = Scheme(
        Hmac("X-CC-Webhook-Signature"),
        event_id="event.id",
        event_type="event.type",
        fingerprint_path="event",
        default_type="charge:confirmed",
        example=lambda event: {
            "id": 1,
            "scheduled_for": event.iso,
            "attempt_number": 1,
            "event": {
                "id": event.id,
                "resource": "event",
                "type": event.type,
                "api_version": "2018-03-22",
                "created_at": event.iso,
                "data": {"code": "RELAYBOX", "pricing_type": "fixed_price"},
            },
        },
    )


coinbase_commerce = factory(
    CoinbaseCommerceSource, "A Coinbase Commerce source; ``secrets`` are webhook shared secrets."
)
