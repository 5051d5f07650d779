"""SendGrid (Twilio SendGrid) signed Event Webhook: ECDSA P-256 with a public key.

Headers: ``X-Twilio-Email-Event-Webhook-Signature`` (base64 of a DER ECDSA
signature) and ``X-Twilio-Email-Event-Webhook-Timestamp``. What is signed:
``timestamp + body`` (the header's text, then the raw body), SHA-256, as the
``sendgrid`` package's ``EventWebhook.verify_signature`` checks it. The secret is the
verification key shown in SendGrid's Mail Settings (base64 DER public key; a PEM
block works too). ``private:<base64 DER PKCS#8 key>`` signs (tests, ``send-test``)
and verifies with its public half.

The timestamp is checked against ``tolerance`` in both directions.

The body is a JSON array of events, each with its own ``sg_event_id``. A request
with one event is stored under that id; a batch under ``"batch:" + sha256`` of its
sorted ``sg_event_id`` values (a retried batch holds the same events, so the same
key). The type is the events' ``event`` when they share one, else ``batch``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from relaybox.errors import ConfigurationError, MalformedPayload
from relaybox.sources.base import (
    Headers,
    Identity,
    Secret,
)
from relaybox.sources.kit import PRIVATE_PREFIX, batch_identity, event_keys, text
from relaybox.sources.publickey import TimestampKeySource

__all__ = ["SendGridSource", "sendgrid"]


def _load(secret: Secret) -> tuple[ec.EllipticCurvePublicKey, ec.EllipticCurvePrivateKey | None]:
    value = secret.value.strip()
    try:
        if value.startswith(PRIVATE_PREFIX):
            raw = base64.b64decode(value[len(PRIVATE_PREFIX) :], validate=True)
            private = serialization.load_der_private_key(raw, password=None)
            if not isinstance(private, ec.EllipticCurvePrivateKey):
                raise ValueError("not an EC key")
            return private.public_key(), private
        if value.startswith("-----BEGIN"):
            public = serialization.load_pem_public_key(value.encode())
        else:
            public = serialization.load_der_public_key(base64.b64decode(value, validate=True))
    except (ValueError, TypeError):
        raise ConfigurationError(
            "sendgrid source: secret must be the base64 verification key (or private:<key>)"
        ) from None
    if not isinstance(public, ec.EllipticCurvePublicKey):
        raise ConfigurationError("sendgrid source: the verification key is not an EC key")
    return public, None


class SendGridSource(TimestampKeySource[ec.EllipticCurvePublicKey, ec.EllipticCurvePrivateKey]):
    """SendGrid's signed Event Webhook."""

    provider = "sendgrid"

    signature_name = "X-Twilio-Email-Event-Webhook-Signature"
    timestamp_name = "X-Twilio-Email-Event-Webhook-Timestamp"
    encoding = "base64"
    private_form = "private:<key>"

    def load_key(
        self, secret: Secret
    ) -> tuple[ec.EllipticCurvePublicKey, ec.EllipticCurvePrivateKey | None]:
        return _load(secret)

    def verify_signature(
        self, public: ec.EllipticCurvePublicKey, signature: bytes, content: bytes
    ) -> bool:
        try:
            public.verify(signature, content, ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            return False
        return True

    def make_signature(self, private: ec.EllipticCurvePrivateKey, content: bytes) -> bytes:
        return private.sign(content, ec.ECDSA(hashes.SHA256()))

    def identify(self, headers: Headers, payload: Any) -> Identity:
        if not isinstance(payload, list) or not payload:
            raise MalformedPayload("SendGrid payload must be a non-empty JSON array of events")
        ids = event_keys(payload, "sg_event_id", "SendGrid")
        return batch_identity(ids, (text(event.get("event")) or "" for event in payload))

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        events = [
            {
                "email": "alice@example.com",
                "timestamp": int(now),
                "event": event_type or "delivered",
                "sg_event_id": event_id,
                "sg_message_id": "relaybox-test.filter0001.1.0",
                "smtp-id": "<relaybox-test@example.com>",
            }
        ]
        return json.dumps(events, separators=(",", ":")).encode()


def sendgrid(*, secrets: Iterable[Secret | str] | Secret | str, **options: Any) -> SendGridSource:
    """A SendGrid Event Webhook source; ``secrets`` are verification (public) keys."""
    return SendGridSource(secrets=secrets, **options)
