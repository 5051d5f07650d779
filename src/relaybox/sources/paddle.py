"""Paddle Billing: ``Paddle-Signature: ts=<unix>;h1=<hex>``.

What is signed: ``f"{ts}:".encode() + body``, HMAC-SHA256 in hex keyed with the
notification destination's secret key (``pdl_ntfset_...``, its UTF-8 bytes), as the
``paddle-python-sdk``'s ``Verifier`` computes it. Any ``h1`` entry may match (Paddle
sends one per active secret while a secret is rotated); other keys are ignored.

The timestamp is checked against ``tolerance`` in both directions. Paddle's SDK
allows 5 seconds, and so does this source by default (``tolerance`` to widen it
when clocks drift).

Identity: ``event_id`` (``evt_...``, the same on Paddle's retries) and
``event_type`` (``transaction.completed``). Paddle Classic (``p_signature``, RSA) is
a different scheme and is not supported.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from relaybox.errors import BadSignature, MalformedHeaders, MalformedPayload
from relaybox.sources.base import (
    Headers,
    Identity,
    Secret,
    Source,
    check_timestamp,
    parse_int_timestamp,
    shared_key,
)
from relaybox.sources.kit import json_object, require_header, text

__all__ = ["PaddleSource", "paddle"]

_HEADER = "paddle-signature"
DEFAULT_TOLERANCE = 5.0


def _parse(header: str) -> tuple[str, list[str]]:
    timestamp: str | None = None
    hashes: list[str] = []
    for item in header.split(";"):
        name, sep, value = item.partition("=")
        if not sep:
            continue
        name = name.strip()
        if name == "ts" and timestamp is None:
            timestamp = value.strip()
        elif name == "h1":
            hashes.append(value.strip().lower())
    if not timestamp or not timestamp.isdigit():
        raise MalformedHeaders("Paddle-Signature has no integer ts=")
    return timestamp, hashes


def _compute(key: bytes, timestamp: str, body: bytes) -> str:
    mac = hmac.new(key, f"{timestamp}:".encode(), hashlib.sha256)
    mac.update(body)
    return mac.hexdigest()


class PaddleSource(Source):
    """Paddle Billing notifications."""

    provider = "paddle"

    def __init__(
        self, *, secrets: Iterable[Secret | str] | Secret | str = (), **options: Any
    ) -> None:
        options.setdefault("tolerance", DEFAULT_TOLERANCE)
        super().__init__(secrets=secrets, **options)

    def authenticate(
        self, headers: Headers, body: bytes, now: float, check_time: bool
    ) -> tuple[Secret, float | None]:
        timestamp, hashes = _parse(require_header(headers, _HEADER, "Paddle-Signature"))
        if not hashes:
            raise BadSignature("no h1 signature in Paddle-Signature")
        seconds = parse_int_timestamp(timestamp, "Paddle-Signature ts")

        def matches(secret: Secret) -> bool:
            expected = _compute(shared_key("paddle", secret), timestamp, body).encode()
            return any(hmac.compare_digest(expected, h.encode()) for h in hashes)

        secret = self.try_secrets(matches)
        if check_time:
            check_timestamp(seconds, now, self.tolerance)
        return secret, float(seconds)

    def identify(self, headers: Headers, payload: Any) -> Identity:
        event = json_object(payload, "Paddle")
        event_id, event_type = text(event.get("event_id")), text(event.get("event_type"))
        if event_id is None or event_type is None:
            raise MalformedPayload('Paddle event has no "event_id" or "event_type"')
        return Identity(event_id=event_id, event_type=event_type)

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
        signature = _compute(shared_key("paddle", secret or self.secrets[0]), timestamp, body)
        return {_HEADER: f"ts={timestamp};h1={signature}", "content-type": "application/json"}

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        stamp = datetime.fromtimestamp(now, UTC).isoformat().replace("+00:00", "Z")
        event = {
            "event_id": event_id,
            "event_type": event_type or "transaction.completed",
            "occurred_at": stamp,
            "notification_id": "ntf_" + event_id,
            "data": {"id": "txn_relaybox_test", "status": "completed"},
        }
        return json.dumps(event, separators=(",", ":")).encode()


def paddle(*, secrets: Iterable[Secret | str] | Secret | str, **options: Any) -> PaddleSource:
    """A Paddle Billing source; ``secrets`` are notification destination secret keys."""
    return PaddleSource(secrets=secrets, **options)
