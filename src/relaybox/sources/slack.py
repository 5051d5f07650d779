"""Slack Events API: ``X-Slack-Signature: v0=<hex>`` and ``X-Slack-Request-Timestamp``.

What is signed: ``f"v0:{timestamp}:".encode() + body`` (the timestamp exactly as
sent in its header), HMAC-SHA256 hex keyed with the app's signing secret. The
timestamp is checked in both directions after the signature matched.

Identity, from the Events API JSON envelope
(``{"type": "event_callback", "event_id": "Ev..", "team_id": "T..", "event": {...}}``):
``event_id`` (kept by Slack's retries, which add ``X-Slack-Retry-Num``), the inner
``event.type`` (``message``, ``app_mention``) or else the envelope type, and
``team_id`` as the account (the signing secret is per app, so the team is what
tells installations apart).

Two envelopes carry no ``event_id``; they get a synthetic, stable one instead of
being refused:

* ``url_verification`` (the endpoint handshake): ``"url_verification:" + challenge``,
  type ``url_verification``. Answering the challenge is the receiver's job.
* ``app_rate_limited``: ``"app_rate_limited:{team_id}:{minute_rate_limited}"``.

Form-encoded payloads (interactivity, slash commands) are out of scope and
refused as malformed.
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
    Source,
    check_timestamp,
    parse_int_timestamp,
    shared_key,
)

__all__ = ["SlackSource", "slack"]

_SIGNATURE = "x-slack-signature"
_TIMESTAMP = "x-slack-request-timestamp"
_PREFIX = "v0="


def _key(secret: Secret) -> bytes:
    return shared_key("slack", secret)


def _compute(key: bytes, timestamp: str, body: bytes) -> str:
    mac = hmac.new(key, f"v0:{timestamp}:".encode(), hashlib.sha256)
    mac.update(body)
    return mac.hexdigest()


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


class SlackSource(Source):
    """Slack Events API requests (JSON)."""

    provider = "slack"

    def authenticate(
        self, headers: Headers, body: bytes, now: float, check_time: bool
    ) -> tuple[Secret, float | None]:
        header = self.signature_header(headers, _SIGNATURE, "X-Slack-Signature")
        if not header:
            raise BadSignature("missing X-Slack-Signature header", code="missing_signature")
        raw_timestamp = (headers.get(_TIMESTAMP) or "").strip()
        timestamp = parse_int_timestamp(raw_timestamp, "X-Slack-Request-Timestamp")
        if not header.startswith(_PREFIX):
            raise BadSignature("X-Slack-Signature header must start with v0=")
        given = header[len(_PREFIX) :].lower().encode()

        def matches(secret: Secret) -> bool:
            expected = _compute(_key(secret), raw_timestamp, body).encode()
            return hmac.compare_digest(expected, given)

        secret = self.try_secrets(matches)
        if check_time:
            check_timestamp(timestamp, now, self.tolerance)
        return secret, float(timestamp)

    def parse(self, body: bytes) -> Any:
        try:
            return super().parse(body)
        except MalformedPayload:
            if body.lstrip()[:1] not in (b"{", b"["):
                raise MalformedPayload(
                    "only Slack Events API JSON is supported, not form-encoded payloads "
                    "(interactivity, slash commands)",
                    code="unsupported_payload",
                ) from None
            raise

    def identify(self, headers: Headers, payload: Any) -> Identity:
        if not isinstance(payload, Mapping):
            raise MalformedPayload("Slack payload must be a JSON object")
        envelope_type = _text(payload.get("type"))
        team = _text(payload.get("team_id"))
        if envelope_type == "url_verification":
            challenge = _text(payload.get("challenge"))
            if challenge is None:
                raise MalformedPayload('url_verification has no "challenge"')
            return Identity(event_id=f"url_verification:{challenge}", event_type=envelope_type)
        if envelope_type == "app_rate_limited":
            minute = payload.get("minute_rate_limited")
            return Identity(
                event_id=f"app_rate_limited:{team or ''}:{minute}",
                event_type=envelope_type,
                account=team,
            )
        event_id = _text(payload.get("event_id"))
        if event_id is None:
            raise MalformedPayload('Slack payload has no "event_id"', code="missing_event_id")
        event = payload.get("event")
        event_type = _text(event.get("type")) if isinstance(event, Mapping) else None
        event_type = event_type or envelope_type
        if event_type is None:
            raise MalformedPayload('Slack payload has no "type"', code="missing_event_type")
        return Identity(event_id=event_id, event_type=event_type, account=team)

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
        signature = _compute(_key(secret or self.secrets[0]), timestamp, body)
        return {_SIGNATURE: _PREFIX + signature, _TIMESTAMP: timestamp}

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        payload: dict[str, Any]
        if event_type == "url_verification":
            payload = {"token": "relaybox-test", "challenge": event_id, "type": event_type}
        else:
            payload = {
                "token": "relaybox-test",
                "team_id": self.account or "T0000000000",
                "api_app_id": "A0000000000",
                "event": {
                    "type": event_type or "message",
                    "channel": "C0000000000",
                    "user": "U0000000000",
                    "text": "relaybox test event",
                    "ts": f"{now:.6f}",
                    "event_ts": f"{now:.6f}",
                },
                "type": "event_callback",
                "event_id": event_id,
                "event_time": int(now),
            }
        return json.dumps(payload, separators=(",", ":")).encode()


def slack(*, secrets: Iterable[Secret | str] | Secret | str, **options: Any) -> SlackSource:
    """A Slack Events API source; ``secrets`` are app signing secrets. ``options`` are
    :class:`Source` arguments (``tolerance``, ``tenants`` keyed by team id, ...)."""
    return SlackSource(secrets=secrets, **options)
