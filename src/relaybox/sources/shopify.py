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

import base64
import hashlib
import hmac
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from relaybox.errors import BadSignature, MalformedHeaders
from relaybox.sources.base import Headers, Identity, Secret, Source, shared_key

__all__ = ["ShopifySource", "shopify"]

_SIGNATURE = "x-shopify-hmac-sha256"
_EVENT_ID = "x-shopify-event-id"
_WEBHOOK_ID = "x-shopify-webhook-id"
_TOPIC = "x-shopify-topic"
_SHOP = "x-shopify-shop-domain"
_API_VERSION = "x-shopify-api-version"
_TRIGGERED_AT = "x-shopify-triggered-at"

_IN_HEADERS = frozenset({"event_id", "event_type", "account", "version"})
_EXAMPLE_API_VERSION = "2024-10"
_DEFAULT_TOPIC = "orders/create"  # example() builds an order when no topic is given


def _key(secret: Secret) -> bytes:
    return shared_key("shopify", secret)


def _compute(key: bytes, body: bytes) -> str:
    return base64.b64encode(hmac.new(key, body, hashlib.sha256).digest()).decode()


class ShopifySource(Source):
    """Shopify app webhooks (HTTPS deliveries)."""

    provider = "shopify"

    def authenticate(
        self, headers: Headers, body: bytes, now: float, check_time: bool
    ) -> tuple[Secret, float | None]:
        given = self.signature_header(headers, _SIGNATURE, "X-Shopify-Hmac-Sha256").encode()
        if not given:
            raise BadSignature("missing X-Shopify-Hmac-Sha256 header", code="missing_signature")

        def matches(secret: Secret) -> bool:
            # Compare the canonical base64 text: stricter than decoding the sender's.
            return hmac.compare_digest(_compute(_key(secret), body).encode(), given)

        return self.try_secrets(matches), None

    def identify(self, headers: Headers, payload: Any) -> Identity:
        event_id = (headers.get(_EVENT_ID) or headers.get(_WEBHOOK_ID) or "").strip()
        if not event_id:
            raise MalformedHeaders("missing X-Shopify-Event-Id header")
        topic = (headers.get(_TOPIC) or "").strip()
        if not topic:
            raise MalformedHeaders("missing X-Shopify-Topic header")
        shop = (headers.get(_SHOP) or "").strip().lower()
        version = (headers.get(_API_VERSION) or "").strip()
        return Identity(
            event_id=event_id,
            event_type=topic,
            account=shop or None,
            version=version or None,
            from_headers=_IN_HEADERS,
        )

    def sign(
        self,
        body: bytes,
        *,
        event_id: str,
        event_type: str,
        now: float,
        secret: Secret | None = None,
    ) -> dict[str, str]:
        secret = secret or self.secrets[0]
        shop = secret.account or self.account or "relaybox-test.myshopify.com"
        triggered = datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds")
        return {
            _SIGNATURE: _compute(_key(secret), body),
            _EVENT_ID: event_id,
            _WEBHOOK_ID: event_id,
            _TOPIC: event_type or _DEFAULT_TOPIC,
            _SHOP: shop,
            _API_VERSION: _EXAMPLE_API_VERSION,
            _TRIGGERED_AT: triggered.replace("+00:00", "Z"),
        }

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        created = datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds")
        order = {
            "id": 820982911946154508,
            "admin_graphql_api_id": "gid://shopify/Order/820982911946154508",
            "email": "jon@example.com",
            "created_at": created,
            "currency": "USD",
            "total_price": "10.00",
            "financial_status": "paid",
            "line_items": [{"id": 866550311766439020, "quantity": 1, "price": "10.00"}],
        }
        return json.dumps(order, separators=(",", ":")).encode()


def shopify(*, secrets: Iterable[Secret | str] | Secret | str, **options: Any) -> ShopifySource:
    """A Shopify source; ``secrets`` are app client secrets (or per-shop secrets with
    ``Secret.account`` set to the shop domain). ``options`` are :class:`Source`
    arguments; ``tolerance``/``verify_timestamp`` are unused (nothing time is signed)."""
    return ShopifySource(secrets=secrets, **options)
