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

import base64
import binascii
import json
from collections.abc import Iterable
from typing import Any

from relaybox.errors import BadSignature, ConfigurationError, MalformedPayload
from relaybox.sources.base import Headers, Identity, Secret, Source, constant_time_equal
from relaybox.sources.kit import json_object, require_header, text

__all__ = ["PostmarkSource", "postmark"]

_TIMES = ("DeliveredAt", "BouncedAt", "ReceivedAt", "ChangedAt")


class PostmarkSource(Source):
    """Postmark webhooks (delivery, bounce, open, click, inbound...)."""

    provider = "postmark"

    def check_secret(self, secret: Secret) -> None:
        user, sep, password = secret.value.partition(":")
        if not sep or not user or not password:
            raise ConfigurationError("postmark source: a secret is 'user:password'")

    def authenticate(
        self, headers: Headers, body: bytes, now: float, check_time: bool
    ) -> tuple[Secret, float | None]:
        header = require_header(headers, "authorization", "Authorization")
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            raise BadSignature("Authorization is not HTTP Basic")
        try:
            given = base64.b64decode(encoded.strip(), validate=True)
        except (ValueError, binascii.Error):
            raise BadSignature("Authorization credentials are not base64") from None
        return self.try_secrets(lambda s: constant_time_equal(s.value.encode(), given)), None

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

    def sign(
        self,
        body: bytes,
        *,
        event_id: str,
        event_type: str,
        now: float,
        secret: Secret | None = None,
    ) -> dict[str, str]:
        credentials = (secret or self.secrets[0]).value.encode()
        return {
            "authorization": "Basic " + base64.b64encode(credentials).decode(),
            "content-type": "application/json",
        }

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        record = {
            "RecordType": event_type or "Delivery",
            "ServerID": 23,
            "MessageStream": "outbound",
            "MessageID": event_id,
            "Recipient": "alice@example.com",
            "Tag": "relaybox-test",
            "DeliveredAt": "2023-11-14T22:13:20Z",
            "Details": "Test delivery webhook details",
            "Metadata": {},
        }
        return json.dumps(record, separators=(",", ":")).encode()


def postmark(*, secrets: Iterable[Secret | str] | Secret | str, **options: Any) -> PostmarkSource:
    """A Postmark source; ``secrets`` are ``"user:password"`` Basic credentials."""
    return PostmarkSource(secrets=secrets, **options)
