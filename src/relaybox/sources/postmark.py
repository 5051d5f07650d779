"""Postmark: HTTP Basic credentials in the webhook URL, no signature.

Postmark signs nothing; its documented protection is HTTP Basic authentication
(``https://user:password@example.com/webhooks/postmark``) over HTTPS, plus its IP
ranges. The secret is ``"user:password"``; the ``Authorization: Basic`` header must
match one of them (constant-time). The credentials are not kept with the delivery.

Postmark sends no event id. relaybox derives ``{RecordType}:{ID or MessageID}:{time}``
where time is the record's own ``DeliveredAt``, ``BouncedAt``, ``ReceivedAt`` or
``ChangedAt`` (a resend repeats them; a second open or click of the same message
has its own time, so it is its own event); inbound messages (no ``RecordType``) are
``Inbound:{MessageID}``. The type is ``RecordType`` (``Delivery``, ``Bounce``,
``Open``, ``Click``, ``SpamComplaint``, ``SubscriptionChange``) or ``Inbound``. No
timestamp: no tolerance.
"""

from __future__ import annotations

from typing import Any

from relaybox.errors import MalformedPayload
from relaybox.sources.base import Headers, Identity
from relaybox.sources.kit import json_object, text
from relaybox.sources.scheme import BasicAuth, Sample, Scheme, SchemeSource, factory

__all__ = ["PostmarkSource", "postmark"]

_TIMES = ("DeliveredAt", "BouncedAt", "ReceivedAt", "ChangedAt")


class PostmarkSource(SchemeSource):
    """Postmark webhooks (delivery, bounce, open, click, inbound...)."""

    provider = "postmark"
    scheme = Scheme(
        BasicAuth(),
        event_id="MessageID",
        event_type="RecordType",
        sample=Sample(
            type="Delivery",
            body=lambda event: {
                "RecordType": event.type,
                "ServerID": 23,
                "MessageStream": "outbound",
                "MessageID": event.id,
                "Recipient": "alice@example.com",
                "Tag": "relaybox-test",
                "DeliveredAt": "2023-11-14T22:13:20Z",
                "Details": "Test delivery webhook details",
                "Metadata": {},
            },
        ),
    )

    def identify(self, headers: Headers, payload: Any) -> Identity:
        record = json_object(payload, "Postmark")
        kind = text(record.get("RecordType")) or "Inbound"
        ident = text(record.get("ID")) if kind == "Bounce" else None
        ident = ident or text(record.get("MessageID"))
        if ident is None:
            raise MalformedPayload('Postmark record has no "MessageID"', code="missing_event_id")
        at = next((text(record.get(name)) for name in _TIMES if text(record.get(name))), None)
        event_id = ":".join(part for part in (kind, ident, at) if part)
        return Identity(event_id=event_id, event_type=kind)


postmark = factory(
    PostmarkSource, 'A Postmark source; ``secrets`` are ``"user:password"`` Basic credentials.'
)
