"""Mailgun: the signature travels in the body, ``timestamp`` + ``token`` → HMAC.

What is signed: ``timestamp + token`` (their text, concatenated), HMAC-SHA256 in hex
keyed with the domain's HTTP webhook signing key; this is Mailgun's documented
check. The three values come from:

* webhooks (JSON): ``{"signature": {"timestamp", "token", "signature"},
  "event-data": {...}}``;
* routes and legacy webhooks (``application/x-www-form-urlencoded`` or
  ``multipart/form-data`` with attachments): the form fields ``timestamp``,
  ``token`` and ``signature``.

The timestamp is checked against ``tolerance`` in both directions. The signature
covers the timestamp and token only, not the rest of the body: keep ``tolerance``
short, and the inbox's unique key stops a replayed event within it.

Identity: webhooks use ``event-data.id`` (the same on Mailgun's retries) and
``event-data.event`` as the type. Form requests carry no event id: relaybox uses the
forwarded message's ``Message-Id`` field (stable across resends of the same
message), else the ``token``; the type is the ``event`` field, else ``inbound``.
Each retry is signed anew, so the fingerprint leaves the signature fields out.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from typing import Any

from relaybox.errors import BadSignature, MalformedPayload
from relaybox.sources.base import (
    Headers,
    Identity,
    Secret,
    Signing,
    Source,
    canonical_json,
    check_timestamp,
    parse_int_timestamp,
    shared_key,
)
from relaybox.sources.bodies import content_type, decode
from relaybox.sources.kit import digest, text

__all__ = ["MailgunSource", "mailgun"]

_SIGNATURE_FIELDS = ("timestamp", "token", "signature")


def _compute(key: bytes, timestamp: str, token: str) -> str:
    return digest(key, timestamp.encode(), token.encode()).hex()


def _signature(payload: Any) -> tuple[str, str, str]:
    if not isinstance(payload, Mapping):
        raise MalformedPayload("Mailgun payload must be a JSON object or form fields")
    block = payload.get("signature")
    fields = block if isinstance(block, Mapping) else payload
    values = [fields.get(name) for name in _SIGNATURE_FIELDS]
    if not all(isinstance(v, str | int) and not isinstance(v, bool) and v != "" for v in values):
        raise BadSignature(
            "missing Mailgun timestamp, token or signature", code="missing_signature"
        )
    timestamp, token, signature = (str(v) for v in values)
    return timestamp, token, signature


def _plain(value: Any) -> Any:
    """Fields as JSON can hold them (file contents by their digest)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return "sha256:" + hashlib.sha256(value).hexdigest()
    return value


class MailgunSource(Source):
    """Mailgun webhooks (JSON) and routes (form or multipart)."""

    provider = "mailgun"

    def decode(self, headers: Headers, body: bytes) -> Any:
        media = content_type(headers)[0]
        fmt = "json" if media in ("", "application/json") else "auto"
        return decode(fmt, headers, body, self.body_limits, parse_json=self.parse)

    def authenticate(
        self, headers: Headers, body: bytes, now: float, check_time: bool
    ) -> tuple[Secret, float | None]:
        timestamp, token, given = _signature(self.decode(headers, body))
        seconds = parse_int_timestamp(timestamp, "Mailgun signature timestamp")

        def matches(secret: Secret) -> bool:
            expected = _compute(shared_key("mailgun", secret), timestamp, token)
            return hmac.compare_digest(expected.encode(), given.lower().encode())

        secret = self.try_secrets(matches)
        if check_time:
            check_timestamp(seconds, now, self.tolerance)
        return secret, float(seconds)

    def identify(self, headers: Headers, payload: Any) -> Identity:
        if not isinstance(payload, Mapping):
            raise MalformedPayload("Mailgun payload must be a JSON object or form fields")
        data = payload.get("event-data")
        if isinstance(data, Mapping):
            event_id = text(data.get("id"))
            event_type = text(data.get("event"))
            if event_id is None or event_type is None:
                raise MalformedPayload('Mailgun event-data has no "id" or "event"')
            return Identity(event_id=event_id, event_type=event_type)
        message_id = text(payload.get("Message-Id")) or text(payload.get("message-id"))
        event_id = message_id or text(payload.get("token"))
        if event_id is None:
            raise MalformedPayload("Mailgun request has no Message-Id or token")
        return Identity(event_id=event_id, event_type=text(payload.get("event")) or "inbound")

    def fingerprint(self, body: bytes, headers: Headers, payload: Any) -> bytes:
        if isinstance(payload, Mapping):
            data = payload.get("event-data")
            if data is None:
                data = {k: v for k, v in payload.items() if k not in _SIGNATURE_FIELDS}
            return hashlib.sha256(canonical_json(_plain(data))).digest()
        return super().fingerprint(body, headers, payload)

    def signed_headers(self, body: bytes, signing: Signing) -> dict[str, str]:
        return {"content-type": "application/json"}

    def embed(self, body: bytes, *, now: float, secret: Secret | None = None) -> bytes:
        """``body`` (webhook JSON) with a fresh ``signature`` block, as Mailgun sends it."""
        document = json.loads(body)
        timestamp = str(int(now))
        token = hashlib.sha256(body + timestamp.encode()).hexdigest()[:50]
        key = shared_key("mailgun", secret or self.secrets[0])
        document["signature"] = {
            "timestamp": timestamp,
            "token": token,
            "signature": _compute(key, timestamp, token),
        }
        return json.dumps(document, separators=(",", ":")).encode()

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        document = {
            "event-data": {
                "id": event_id,
                "event": event_type or "delivered",
                "timestamp": now,
                "recipient": "alice@example.com",
                "message": {"headers": {"message-id": f"{event_id}@example.com"}},
            },
        }
        return self.embed(json.dumps(document).encode(), now=now)


def mailgun(*, secrets: Iterable[Secret | str] | Secret | str, **options: Any) -> MailgunSource:
    """A Mailgun source; ``secrets`` are HTTP webhook signing keys."""
    return MailgunSource(secrets=secrets, **options)
