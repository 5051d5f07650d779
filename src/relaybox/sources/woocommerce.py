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

import re

from relaybox.sources.hooks import Answer, Request
from relaybox.sources.scheme import Hmac, Sample, Scheme, SchemeSource, factory
from relaybox.sources.specs import Digest

__all__ = ["WooCommerceSource", "woocommerce"]

_PING = re.compile(rb"webhook_id=\d{1,20}")


class WooCommerceSource(SchemeSource):
    """WooCommerce webhooks."""

    provider = "woocommerce"
    scheme = Scheme(
        Hmac("X-WC-Webhook-Signature", encoding="base64"),
        event_id=("{header:X-WC-Webhook-Topic}:{id}:{date_modified_gmt?}", Digest()),
        event_type="header:X-WC-Webhook-Topic",
        account="header:X-WC-Webhook-Source",
        sample=Sample(
            type="order.created",
            account="https://shop.example.com/",
            body=lambda event: {
                "id": event.id,
                "status": "processing",
                "currency": "EUR",
                "total": "29.35",
                "date_modified_gmt": "2023-11-14T22:13:20",
            },
            headers=lambda event: {
                "X-WC-Webhook-Resource": event.resource,
                "X-WC-Webhook-Event": event.action,
                "X-WC-Webhook-Delivery-ID": event.id,
            },
        ),
    )

    def handshake(self, request: Request) -> Answer | None:
        if request.method == "POST" and _PING.fullmatch(request.body.strip()):
            return Answer(200, b"", "text/plain")
        return None


woocommerce = factory(WooCommerceSource, "A WooCommerce source; ``secrets`` are webhook secrets.")
