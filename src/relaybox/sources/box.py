"""Box: ``BOX-SIGNATURE-PRIMARY`` and ``BOX-SIGNATURE-SECONDARY``, base64 HMAC-SHA256.

What is signed: the raw body, then the ``BOX-DELIVERY-TIMESTAMP`` header's text
(RFC 3339); HMAC-SHA256 in base64, one signature per header, keyed with the app's
primary and secondary signature keys (configure both as secrets: either matching is
enough, so a key can be rotated), as the ``box-sdk-gen`` package's
``WebhooksManager.validate_message`` checks it. The timestamp is checked against
``tolerance``; Box's SDK allows 10 minutes, the default.

Identity: the body's ``id`` (kept by Box's retries, whose ``BOX-DELIVERY-ID``
changes), ``trigger`` (``FILE.UPLOADED``) as the type, and ``webhook.id`` as the
account.
"""

from __future__ import annotations

from relaybox.sources.scheme import Hmac, Scheme, SchemeSource, factory

__all__ = ["BoxSource", "box"]


class BoxSource(SchemeSource):
    """Box webhooks (V2)."""

    provider = "box"
    scheme = Scheme(
        Hmac(
            ("BOX-SIGNATURE-PRIMARY", "BOX-SIGNATURE-SECONDARY"),
            "{body}{timestamp}",
            encoding="base64",
            timestamp="header:BOX-DELIVERY-TIMESTAMP",
            unit="iso",
        ),
        event_id="id",
        event_type="trigger",
        account="webhook.id",
        tolerance=600.0,
        default_type="FILE.UPLOADED",
        default_account="1234567890",
        example=lambda event: {
            "type": "webhook_event",
            "id": event.id,
            "created_at": event.iso,
            "trigger": event.type,
            "webhook": {"id": event.account, "type": "webhook"},
            "source": {"id": "12345", "type": "file", "name": "relaybox.txt"},
        },
        headers=lambda event: {
            "BOX-DELIVERY-ID": event.id,
            "BOX-SIGNATURE-ALGORITHM": "HmacSHA256",
            "BOX-SIGNATURE-VERSION": "1",
        },
    )


box = factory(BoxSource, "A Box source; ``secrets`` are the primary and secondary signature keys.")
