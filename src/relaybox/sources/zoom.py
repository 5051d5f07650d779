"""Zoom: ``x-zm-signature: v0=<hex>`` and ``x-zm-request-timestamp``.

What is signed: ``f"v0:{timestamp}:".encode() + body`` (the timestamp header's text),
HMAC-SHA256 in hex keyed with the app's webhook secret token. The timestamp (Unix
seconds; a value above 10**12 is read as milliseconds) is checked against
``tolerance`` in both directions.

``endpoint.url_validation`` (the endpoint check Zoom runs when the URL is saved and
every 72 hours) is answered, once its signature matched, with ``{"plainToken",
"encryptedToken"}`` where ``encryptedToken`` is the hex HMAC-SHA256 of
``plainToken`` keyed with the secret token (the one configured for the verified
account, else the first); nothing is stored.

Zoom sends no event id. relaybox derives ``"sha256:" + hex`` of the canonical JSON
of ``{event, event_ts, payload}``: Zoom's retries repeat the event with its
``event_ts`` (milliseconds of the event), so a retry has the same key and a new
event does not. The type is ``event`` (``meeting.started``), the account
``payload.account_id``.
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
    Verified,
    check_timestamp,
    parse_int_timestamp,
    shared_key,
)
from relaybox.sources.hooks import Answer
from relaybox.sources.kit import derived_id, json_object, path, require_header, text

__all__ = ["ZoomSource", "zoom"]

_SIGNATURE = "x-zm-signature"
_TIMESTAMP = "x-zm-request-timestamp"
_VALIDATION = "endpoint.url_validation"


def _compute(key: bytes, timestamp: str, body: bytes) -> str:
    mac = hmac.new(key, f"v0:{timestamp}:".encode(), hashlib.sha256)
    mac.update(body)
    return mac.hexdigest()


class ZoomSource(Source):
    """Zoom webhooks (event subscriptions)."""

    provider = "zoom"

    def authenticate(
        self, headers: Headers, body: bytes, now: float, check_time: bool
    ) -> tuple[Secret, float | None]:
        header = require_header(headers, _SIGNATURE, "x-zm-signature")
        raw_timestamp = (headers.get(_TIMESTAMP) or "").strip()
        timestamp = parse_int_timestamp(raw_timestamp, "x-zm-request-timestamp")
        if not header.startswith("v0="):
            raise BadSignature("x-zm-signature must start with v0=")
        given = header[3:].lower().encode()

        def matches(secret: Secret) -> bool:
            expected = _compute(shared_key("zoom", secret), raw_timestamp, body).encode()
            return hmac.compare_digest(expected, given)

        secret = self.try_secrets(matches)
        seconds = timestamp / 1000 if timestamp > 10**12 else float(timestamp)
        if check_time:
            check_timestamp(seconds, now, self.tolerance)
        return secret, seconds

    def identify(self, headers: Headers, payload: Any) -> Identity:
        document = json_object(payload, "Zoom")
        event = text(document.get("event"))
        if event is None:
            raise MalformedPayload('Zoom payload has no "event"', code="missing_event_type")
        key = {k: document.get(k) for k in ("event", "event_ts", "payload")}
        return Identity(
            event_id=derived_id(key),
            event_type=event,
            account=text(path(document, "payload", "account_id")),
        )

    def challenge(self, verified: Verified) -> Answer | None:
        if verified.event_type != _VALIDATION:
            return None
        plain = text(path(verified.payload, "payload", "plainToken"))
        if plain is None:
            raise MalformedPayload("endpoint.url_validation has no payload.plainToken")
        secret = next((s for s in self.secrets if s.account == verified.account), self.secrets[0])
        encrypted = hmac.new(shared_key("zoom", secret), plain.encode(), hashlib.sha256)
        return Answer.json({"plainToken": plain, "encryptedToken": encrypted.hexdigest()})

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
        signature = _compute(shared_key("zoom", secret or self.secrets[0]), timestamp, body)
        return {
            _SIGNATURE: "v0=" + signature,
            _TIMESTAMP: timestamp,
            "content-type": "application/json",
        }

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        document: dict[str, Any]
        if event_type == _VALIDATION:
            document = {
                "payload": {"plainToken": event_id},
                "event_ts": int(now * 1000),
                "event": _VALIDATION,
            }
        else:
            document = {
                "event": event_type or "meeting.started",
                "event_ts": int(now * 1000),
                "payload": {
                    "account_id": self.account or "relaybox-test-account",
                    "object": {"id": event_id, "uuid": event_id, "topic": "relaybox test"},
                },
            }
        return json.dumps(document, separators=(",", ":")).encode()


def zoom(*, secrets: Iterable[Secret | str] | Secret | str, **options: Any) -> ZoomSource:
    """A Zoom source; ``secrets`` are the app's webhook secret tokens."""
    return ZoomSource(secrets=secrets, **options)
