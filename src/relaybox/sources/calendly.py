"""Calendly: ``Calendly-Webhook-Signature: t=<unix>,v1=<hex>``.

What is signed: ``f"{t}.".encode() + body``, HMAC-SHA256 in hex keyed with the
webhook subscription's signing key. The timestamp is checked against ``tolerance``
in both directions; Calendly's example allows 3 minutes, the default here.

Calendly sends no event id. relaybox derives ``{event}:{payload.uri}``: the
invitee (or routing form submission) URI with what happened to it
(``invitee.created``, ``invitee.canceled``) happens once, and a retry repeats both.
The type is ``event``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable
from typing import Any

from relaybox.errors import BadSignature, MalformedPayload
from relaybox.sources.base import (
    Headers,
    Identity,
    Secret,
    Source,
    check_timestamp,
    parse_int_timestamp,
    shared_key,
)
from relaybox.sources.kit import json_object, path, require_header, text

__all__ = ["CalendlySource", "calendly"]

_SIGNATURE = "calendly-webhook-signature"
DEFAULT_TOLERANCE = 180.0


def _compute(key: bytes, timestamp: str, body: bytes) -> str:
    mac = hmac.new(key, f"{timestamp}.".encode(), hashlib.sha256)
    mac.update(body)
    return mac.hexdigest()


class CalendlySource(Source):
    """Calendly webhook subscriptions (API v2)."""

    provider = "calendly"

    def __init__(
        self, *, secrets: Iterable[Secret | str] | Secret | str = (), **options: Any
    ) -> None:
        options.setdefault("tolerance", DEFAULT_TOLERANCE)
        super().__init__(secrets=secrets, **options)

    def authenticate(
        self, headers: Headers, body: bytes, now: float, check_time: bool
    ) -> tuple[Secret, float | None]:
        header = require_header(headers, _SIGNATURE, "Calendly-Webhook-Signature")
        fields = dict(item.strip().partition("=")[::2] for item in header.split(","))
        timestamp, given = fields.get("t", ""), fields.get("v1", "")
        seconds = parse_int_timestamp(timestamp, "Calendly-Webhook-Signature t")
        if not given:
            raise BadSignature("no v1 signature in Calendly-Webhook-Signature")

        def matches(secret: Secret) -> bool:
            expected = _compute(shared_key("calendly", secret), timestamp, body)
            return hmac.compare_digest(expected.encode(), given.lower().encode())

        secret = self.try_secrets(matches)
        if check_time:
            check_timestamp(seconds, now, self.tolerance)
        return secret, float(seconds)

    def identify(self, headers: Headers, payload: Any) -> Identity:
        document = json_object(payload, "Calendly")
        event, uri = text(document.get("event")), text(path(document, "payload", "uri"))
        if event is None or uri is None:
            raise MalformedPayload('Calendly payload has no "event" or payload.uri')
        return Identity(event_id=f"{event}:{uri}", event_type=event)

    def sign(
        self,
        body: bytes,
        *,
        event_id: str,
        event_type: str,
        now: float,
        secret: Secret | None = None,
    ) -> dict[str, str]:
        timestamp = str(int(now))
        signature = _compute(shared_key("calendly", secret or self.secrets[0]), timestamp, body)
        return {_SIGNATURE: f"t={timestamp},v1={signature}", "content-type": "application/json"}

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        document = {
            "created_at": "2023-11-14T22:13:20.000000Z",
            "created_by": "https://api.calendly.com/users/RELAYBOX",
            "event": event_type or "invitee.created",
            "payload": {
                "uri": f"https://api.calendly.com/scheduled_events/RELAYBOX/invitees/{event_id}",
                "email": "alice@example.com",
                "status": "active",
            },
        }
        return json.dumps(document, separators=(",", ":")).encode()


def calendly(*, secrets: Iterable[Secret | str] | Secret | str, **options: Any) -> CalendlySource:
    """A Calendly source; ``secrets`` are webhook signing keys."""
    return CalendlySource(secrets=secrets, **options)
