"""WooCommerce: ``X-WC-Webhook-Signature: <base64 HMAC-SHA256 of the body>``.

What is signed: the raw body, HMAC-SHA256 in base64 keyed with the webhook's
secret. No timestamp: no tolerance.

When a webhook is saved, WooCommerce first posts ``webhook_id=<n>`` form-encoded to
check the URL: that ping is answered 200 before any signature check and nothing is
stored (it carries no order data and grants nothing).

WooCommerce sends no event id (``X-WC-Webhook-Delivery-ID`` is new on every
delivery). relaybox derives ``{topic}:{id}:{date_modified_gmt}`` from the
``X-WC-Webhook-Topic`` header and the resource in the body: a resend carries the
same resource at the same modification time, a later change has a new one. A body
without ``id`` (a custom topic) is stored under ``"sha256:" + hex`` of its canonical
JSON. The type is the topic (``order.created``), the account the
``X-WC-Webhook-Source`` header (the shop's URL).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from relaybox.errors import MalformedHeaders
from relaybox.sources.base import Headers, Identity, Secret, Source, shared_key
from relaybox.sources.hooks import Answer, Request
from relaybox.sources.kit import b64, derived_id, require_header, text, unb64

__all__ = ["WooCommerceSource", "woocommerce"]

_SIGNATURE = "x-wc-webhook-signature"
_PING = re.compile(rb"webhook_id=\d{1,20}")


def _compute(key: bytes, body: bytes) -> bytes:
    return hmac.new(key, body, hashlib.sha256).digest()


class WooCommerceSource(Source):
    """WooCommerce webhooks."""

    provider = "woocommerce"

    def handshake(self, request: Request) -> Answer | None:
        if request.method == "POST" and _PING.fullmatch(request.body.strip()):
            return Answer(200, b"", "text/plain")
        return None

    def authenticate(
        self, headers: Headers, body: bytes, now: float, check_time: bool
    ) -> tuple[Secret, float | None]:
        given = unb64(require_header(headers, _SIGNATURE, "X-WC-Webhook-Signature"), "signature")
        return self.try_secrets(
            lambda s: hmac.compare_digest(_compute(shared_key("woocommerce", s), body), given)
        ), None

    def identify(self, headers: Headers, payload: Any) -> Identity:
        topic = (headers.get("x-wc-webhook-topic") or "").strip()
        if not topic:
            raise MalformedHeaders("missing X-WC-Webhook-Topic header")
        resource = text(payload.get("id")) if isinstance(payload, Mapping) else None
        if resource is None:
            event_id = derived_id(payload)
        else:
            modified = text(payload.get("date_modified_gmt")) or ""
            event_id = f"{topic}:{resource}:{modified}"
        shop = (headers.get("x-wc-webhook-source") or "").strip() or None
        return Identity(event_id=event_id, event_type=topic, account=shop)

    def sign(
        self,
        body: bytes,
        *,
        event_id: str,
        event_type: str,
        now: float,
        secret: Secret | None = None,
    ) -> dict[str, str]:
        key = shared_key("woocommerce", secret or self.secrets[0])
        topic = event_type or "order.created"
        resource, _, event = topic.partition(".")
        return {
            _SIGNATURE: b64(_compute(key, body)),
            "x-wc-webhook-topic": topic,
            "x-wc-webhook-resource": resource,
            "x-wc-webhook-event": event,
            "x-wc-webhook-source": self.account or "https://shop.example.com/",
            "x-wc-webhook-delivery-id": event_id,
            "content-type": "application/json",
        }

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        order = {
            "id": event_id,
            "status": "processing",
            "currency": "EUR",
            "total": "29.35",
            "date_modified_gmt": "2023-11-14T22:13:20",
        }
        return json.dumps(order, separators=(",", ":")).encode()


def woocommerce(
    *, secrets: Iterable[Secret | str] | Secret | str, **options: Any
) -> WooCommerceSource:
    """A WooCommerce source; ``secrets`` are webhook secrets."""
    return WooCommerceSource(secrets=secrets, **options)
