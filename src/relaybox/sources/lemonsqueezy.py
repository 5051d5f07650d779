"""Lemon Squeezy: ``X-Signature: <hex HMAC-SHA256 of the body>``.

What is signed: the raw body, HMAC-SHA256 in hex keyed with the webhook's signing
secret. ``X-Event-Name`` repeats ``meta.event_name``. No timestamp: no tolerance.

Lemon Squeezy sends no event id. relaybox derives
``{meta.event_name}:{data.type}:{data.id}:{data.attributes.updated_at}``: a resend
carries the same object at the same ``updated_at``; a later change of the object
has a new ``updated_at`` and is its own event. The type is ``meta.event_name``
(``order_created``, ``subscription_updated``), the account
``data.attributes.store_id``.
"""

from __future__ import annotations

from relaybox.sources.scheme import Hmac, Scheme, SchemeSource, factory

__all__ = ["LemonSqueezySource", "lemonsqueezy"]


class LemonSqueezySource(SchemeSource):
    """Lemon Squeezy webhooks."""

    provider = "lemonsqueezy"
    scheme = Scheme(
        Hmac("X-Signature"),
        event_id="{meta.event_name}:{data.type}:{data.id}:{data.attributes.updated_at?}",
        event_type="meta.event_name",
        account="data.attributes.store_id",
        default_type="order_created",
        example=lambda event: {
            "meta": {"event_name": event.type, "test_mode": True},
            "data": {
                "type": "orders",
                "id": event.id,
                "attributes": {"store_id": 1, "status": "paid", "updated_at": int(event.now)},
            },
        },
        headers=lambda event: {"X-Event-Name": event.type},
    )


lemonsqueezy = factory(
    LemonSqueezySource, "A Lemon Squeezy source; ``secrets`` are webhook signing secrets."
)
