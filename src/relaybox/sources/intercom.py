"""Intercom: ``X-Hub-Signature: sha1=<hex HMAC-SHA1 of the body>``.

What is signed: the raw body, HMAC-SHA1 in hex keyed with the app's client secret.
No timestamp: no tolerance.

Identity: the notification's ``id`` (``notif_...``, the same on Intercom's retries),
its ``topic`` as the type (``conversation.user.created``) and ``app_id`` as the
account. A retry raises ``delivery_attempts``, so only ``data`` counts for the
fingerprint (``fingerprint_path = "data"`` by default).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable
from typing import Any

from relaybox.errors import BadSignature, MalformedPayload
from relaybox.sources.base import Headers, Identity, Secret, Source, shared_key
from relaybox.sources.kit import json_object, require_header, text, unhex

__all__ = ["IntercomSource", "intercom"]

_SIGNATURE = "x-hub-signature"


def _compute(key: bytes, body: bytes) -> bytes:
    return hmac.new(key, body, hashlib.sha1).digest()


class IntercomSource(Source):
    """Intercom webhook notifications."""

    provider = "intercom"

    def __init__(
        self, *, secrets: Iterable[Secret | str] | Secret | str = (), **options: Any
    ) -> None:
        options.setdefault("fingerprint_path", "data")
        super().__init__(secrets=secrets, **options)

    def authenticate(
        self, headers: Headers, body: bytes, now: float, check_time: bool
    ) -> tuple[Secret, float | None]:
        header = require_header(headers, _SIGNATURE, "X-Hub-Signature")
        if not header.startswith("sha1="):
            raise BadSignature("X-Hub-Signature must start with sha1=")
        given = unhex(header[5:], "X-Hub-Signature")
        return self.try_secrets(
            lambda s: hmac.compare_digest(_compute(shared_key("intercom", s), body), given)
        ), None

    def identify(self, headers: Headers, payload: Any) -> Identity:
        note = json_object(payload, "Intercom")
        event_id, topic = text(note.get("id")), text(note.get("topic"))
        if event_id is None or topic is None:
            raise MalformedPayload('Intercom notification has no "id" or "topic"')
        return Identity(event_id=event_id, event_type=topic, account=text(note.get("app_id")))

    def sign(
        self,
        body: bytes,
        *,
        event_id: str,
        event_type: str,
        now: float,
        secret: Secret | None = None,
    ) -> dict[str, str]:
        key = shared_key("intercom", secret or self.secrets[0])
        return {_SIGNATURE: "sha1=" + _compute(key, body).hex(), "content-type": "application/json"}

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        note = {
            "type": "notification_event",
            "app_id": self.account or "relaybox-test-app",
            "id": event_id,
            "topic": event_type or "conversation.user.created",
            "delivery_attempts": 1,
            "first_sent_at": int(now),
            "created_at": int(now),
            "data": {"type": "notification_event_data", "item": {"type": "conversation"}},
        }
        return json.dumps(note, separators=(",", ":")).encode()


def intercom(*, secrets: Iterable[Secret | str] | Secret | str, **options: Any) -> IntercomSource:
    """An Intercom source; ``secrets`` are the app's client secrets."""
    return IntercomSource(secrets=secrets, **options)
