"""Lemon Squeezy: ``X-Signature: <hex HMAC-SHA256 of the body>``.

What is signed: the raw body, HMAC-SHA256 in hex keyed with the webhook's signing
secret. ``X-Event-Name`` repeats ``meta.event_name``. No timestamp: no tolerance.

Lemon Squeezy sends no event id. relaybox derives
``{meta.event_name}:{data.type}:{data.id}:{data.attributes.updated_at}``: a resend
carries the same object at the same ``updated_at``; a later change of the object
has a new ``updated_at`` and is its own event. The type is ``meta.event_name``
(``order_created``, ``subscription_updated``), the account
``data.attributes.store_id``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable
from typing import Any

from relaybox.errors import MalformedPayload
from relaybox.sources.base import Headers, Identity, Secret, Source, shared_key
from relaybox.sources.kit import json_object, path, require_header, text, unhex

__all__ = ["LemonSqueezySource", "lemonsqueezy"]

_HEADER = "x-signature"


def _compute(key: bytes, body: bytes) -> bytes:
    return hmac.new(key, body, hashlib.sha256).digest()


class LemonSqueezySource(Source):
    """Lemon Squeezy webhooks."""

    provider = "lemonsqueezy"

    def authenticate(
        self, headers: Headers, body: bytes, now: float, check_time: bool
    ) -> tuple[Secret, float | None]:
        given = unhex(require_header(headers, _HEADER, "X-Signature"), "X-Signature")
        return self.try_secrets(
            lambda s: hmac.compare_digest(_compute(shared_key("lemonsqueezy", s), body), given)
        ), None

    def identify(self, headers: Headers, payload: Any) -> Identity:
        document = json_object(payload, "Lemon Squeezy")
        name = text(path(document, "meta", "event_name"))
        kind, ident = text(path(document, "data", "type")), text(path(document, "data", "id"))
        if name is None or kind is None or ident is None:
            raise MalformedPayload("Lemon Squeezy payload has no meta.event_name or data.id")
        updated = text(path(document, "data", "attributes", "updated_at")) or ""
        return Identity(
            event_id=f"{name}:{kind}:{ident}:{updated}",
            event_type=name,
            account=text(path(document, "data", "attributes", "store_id")),
        )

    def sign(
        self,
        body: bytes,
        *,
        event_id: str,
        event_type: str,
        now: float,
        secret: Secret | None = None,
    ) -> dict[str, str]:
        key = shared_key("lemonsqueezy", secret or self.secrets[0])
        return {
            _HEADER: _compute(key, body).hex(),
            "x-event-name": event_type or "order_created",
            "content-type": "application/json",
        }

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        document = {
            "meta": {"event_name": event_type or "order_created", "test_mode": True},
            "data": {
                "type": "orders",
                "id": event_id,
                "attributes": {"store_id": 1, "status": "paid", "updated_at": int(now)},
            },
        }
        return json.dumps(document, separators=(",", ":")).encode()


def lemonsqueezy(
    *, secrets: Iterable[Secret | str] | Secret | str, **options: Any
) -> LemonSqueezySource:
    """A Lemon Squeezy source; ``secrets`` are webhook signing secrets."""
    return LemonSqueezySource(secrets=secrets, **options)
