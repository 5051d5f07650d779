"""Square: ``x-square-hmacsha256-signature``, an HMAC over the notification URL + body.

What is signed: the notification URL exactly as configured on the webhook
subscription, then the raw body; HMAC-SHA256 keyed with the subscription's signature
key, base64; as the ``squareup`` package's ``verify_signature`` computes it. Set
``url`` to that notification URL (without it, the URL the request was made to is
used). No timestamp: no tolerance.

Identity: ``event_id`` (the same on Square's retries), ``type``
(``payment.updated``), and ``merchant_id`` as the account.
"""

from __future__ import annotations

from typing import ClassVar

from relaybox.sources.scheme import Hmac, Scheme, UrlSchemeSource, factory

__all__ = ["SquareSource", "square"]


class SquareSource(UrlSchemeSource):
    """Square webhook subscriptions."""

    provider = "square"
    append_query: ClassVar[bool] = False  # the notification URL exactly as configured
    scheme = Scheme(
        Hmac("x-square-hmacsha256-signature", "{url}{body}", encoding="base64"),
        event_id="event_id",
        event_type="type",
        account="merchant_id",
        default_type="payment.updated",
        default_account="MLRELAYBOXTEST",
        example=lambda event: {
            "merchant_id": event.account,
            "type": event.type,
            "event_id": event.id,
            "created_at": event.iso,
            "data": {"type": "payment", "id": "relaybox-test", "object": {"payment": {}}},
        },
    )


square = factory(
    SquareSource, "A Square source; ``secrets`` are signature keys; ``url`` the notification URL."
)
