"""Shopify: ``X-Shopify-Hmac-Sha256: <base64 HMAC-SHA256 of the raw body>``.

Only the body is signed, keyed with the app's client secret (UTF-8). Nothing else
is covered by the HMAC, which shapes three choices:

* No timestamp check: ``X-Shopify-Triggered-At`` is not signed, so enforcing it
  would only reject honest late retries while an attacker could rewrite it.
  Replay protection is the event key (below).
* The event id is ``X-Shopify-Event-Id`` (Shopify's documented duplicate key; with
  two subscriptions to one topic both deliveries carry it, and the second is
  rightly a duplicate), falling back to ``X-Shopify-Webhook-Id`` for senders
  that lack it. The type is ``X-Shopify-Topic`` (``orders/create``).
* ``account`` is the ``X-Shopify-Shop-Domain`` header, which is **not** signed.
  The secret is per app, not per shop, so any shop that installed the app can
  produce a valid signature and claim another shop's domain in that header:
  mapping tenants by shop domain is only as strong as the app's install list.
  When that matters, configure one secret per shop with ``Secret.account`` (the
  matched secret wins over the header).

``X-Shopify-API-Version`` becomes the delivery's ``version``.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from relaybox.sources.base import Headers, Identity
from relaybox.sources.scheme import Example, Hmac, Sample, Scheme, SchemeSource, factory

__all__ = ["ShopifySource", "shopify"]


def _example(event: Example) -> dict[str, Any]:
    return {
        "id": 820982911946154508,
        "admin_graphql_api_id": "gid://shopify/Order/820982911946154508",
        "email": "jon@example.com",
        "created_at": datetime.fromtimestamp(event.now, UTC).isoformat(timespec="seconds"),
        "currency": "USD",
        "total_price": "10.00",
        "financial_status": "paid",
        "line_items": [{"id": 866550311766439020, "quantity": 1, "price": "10.00"}],
    }


class ShopifySource(SchemeSource):
    """Shopify app webhooks (HTTPS deliveries)."""

    provider = "shopify"
    scheme = Scheme(
        Hmac("X-Shopify-Hmac-Sha256", encoding="base64"),
        event_id=("header:X-Shopify-Event-Id", "header:X-Shopify-Webhook-Id"),
        event_type="header:X-Shopify-Topic",
        account="header:X-Shopify-Shop-Domain",
        version="header:X-Shopify-API-Version",
        sample=Sample(
            type="orders/create",
            account="relaybox-test.myshopify.com",
            body=_example,
            headers=lambda event: {
                "X-Shopify-Webhook-Id": event.id,
                "X-Shopify-API-Version": "2024-10",
                "X-Shopify-Triggered-At": event.iso,
            },
            content_type=None,
        ),
    )

    def identify(self, headers: Headers, payload: Any) -> Identity:
        identity = super().identify(headers, payload)
        # Shop domains are case-insensitive: one shop, one account.
        return replace(identity, account=identity.account.lower() if identity.account else None)


shopify = factory(
    ShopifySource,
    """A Shopify source; ``secrets`` are app client secrets (or per-shop secrets with
    ``Secret.account`` set to the shop domain). ``options`` are :class:`Source`
    arguments; ``tolerance``/``verify_timestamp`` are unused (nothing time is signed).""",
)
