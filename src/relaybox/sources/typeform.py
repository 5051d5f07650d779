"""Typeform: ``Typeform-Signature: sha256=<base64 HMAC-SHA256 of the body>``.

What is signed: the raw body, HMAC-SHA256 in base64 keyed with the webhook's
secret. No timestamp: no tolerance.

Identity: ``event_id`` (the same on Typeform's retries), ``event_type``
(``form_response``) and ``form_response.form_id`` as the account.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable
from typing import Any

from relaybox.errors import BadSignature, MalformedPayload
from relaybox.sources.base import Headers, Identity, Secret, Source, shared_key
from relaybox.sources.kit import b64, json_object, path, require_header, text, unb64

__all__ = ["TypeformSource", "typeform"]

_SIGNATURE = "typeform-signature"


def _compute(key: bytes, body: bytes) -> bytes:
    return hmac.new(key, body, hashlib.sha256).digest()


class TypeformSource(Source):
    """Typeform webhooks."""

    provider = "typeform"

    def authenticate(
        self, headers: Headers, body: bytes, now: float, check_time: bool
    ) -> tuple[Secret, float | None]:
        header = require_header(headers, _SIGNATURE, "Typeform-Signature")
        if not header.startswith("sha256="):
            raise BadSignature("Typeform-Signature must start with sha256=")
        given = unb64(header[7:], "Typeform-Signature")
        return self.try_secrets(
            lambda s: hmac.compare_digest(_compute(shared_key("typeform", s), body), given)
        ), None

    def identify(self, headers: Headers, payload: Any) -> Identity:
        event = json_object(payload, "Typeform")
        event_id, event_type = text(event.get("event_id")), text(event.get("event_type"))
        if event_id is None or event_type is None:
            raise MalformedPayload('Typeform event has no "event_id" or "event_type"')
        account = text(path(event, "form_response", "form_id"))
        return Identity(event_id=event_id, event_type=event_type, account=account)

    def sign(
        self,
        body: bytes,
        *,
        event_id: str,
        event_type: str,
        now: float,
        secret: Secret | None = None,
    ) -> dict[str, str]:
        key = shared_key("typeform", secret or self.secrets[0])
        return {
            _SIGNATURE: "sha256=" + b64(_compute(key, body)),
            "content-type": "application/json",
        }

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        event = {
            "event_id": event_id,
            "event_type": event_type or "form_response",
            "form_response": {
                "form_id": self.account or "relaybox",
                "token": event_id,
                "answers": [],
            },
        }
        return json.dumps(event, separators=(",", ":")).encode()


def typeform(*, secrets: Iterable[Secret | str] | Secret | str, **options: Any) -> TypeformSource:
    """A Typeform source; ``secrets`` are webhook secrets."""
    return TypeformSource(secrets=secrets, **options)
