"""Linear: ``Linear-Signature: <hex HMAC-SHA256 of the body>``.

What is signed: the raw body, HMAC-SHA256 in hex keyed with the webhook's signing
secret. The body's ``webhookTimestamp`` (milliseconds, when the request was sent) is
checked against ``tolerance``; Linear suggests one minute, the default here.

Identity: Linear's ``Linear-Delivery`` header is documented as identifying the
delivery, not the event, and whether a retry repeats it is not documented, so
relaybox derives ``{webhookId}:{type}:{action}:{data.id}:{createdAt}`` (the entity,
what happened to it and when; a retry repeats all of them). The type is
``{type}.{action}`` (``Issue.create``), the account ``organizationId``. Each retry
is sent with a new ``webhookTimestamp``, so the fingerprint leaves it out.
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
    canonical_json,
    check_timestamp,
    shared_key,
)
from relaybox.sources.kit import json_object, path, require_header, text, unhex

__all__ = ["LinearSource", "linear"]

_SIGNATURE = "linear-signature"
DEFAULT_TOLERANCE = 60.0


def _compute(key: bytes, body: bytes) -> bytes:
    return hmac.new(key, body, hashlib.sha256).digest()


class LinearSource(Source):
    """Linear data-change webhooks."""

    provider = "linear"

    def __init__(
        self, *, secrets: Iterable[Secret | str] | Secret | str = (), **options: Any
    ) -> None:
        options.setdefault("tolerance", DEFAULT_TOLERANCE)
        super().__init__(secrets=secrets, **options)

    def authenticate(
        self, headers: Headers, body: bytes, now: float, check_time: bool
    ) -> tuple[Secret, float | None]:
        given = unhex(require_header(headers, _SIGNATURE, "Linear-Signature"), "signature")
        secret = self.try_secrets(
            lambda s: hmac.compare_digest(_compute(shared_key("linear", s), body), given)
        )
        sent = path(self.parse(body), "webhookTimestamp")
        if isinstance(sent, bool) or not isinstance(sent, int) or not 0 <= sent < 10**16:
            raise BadSignature("Linear payload has no integer webhookTimestamp")
        if check_time:
            check_timestamp(sent / 1000, now, self.tolerance)
        return secret, sent / 1000

    def identify(self, headers: Headers, payload: Any) -> Identity:
        document = json_object(payload, "Linear")
        kind, action = text(document.get("type")), text(document.get("action"))
        if kind is None or action is None:
            raise MalformedPayload('Linear payload has no "type" or "action"')
        parts = (
            text(document.get("webhookId")) or "",
            kind,
            action,
            text(path(document, "data", "id")) or "",
            text(document.get("createdAt")) or "",
        )
        return Identity(
            event_id=":".join(parts),
            event_type=f"{kind}.{action}",
            account=text(document.get("organizationId")),
        )

    def fingerprint(self, body: bytes, headers: Headers, payload: Any) -> bytes:
        if isinstance(payload, Mapping):
            stable = {k: v for k, v in payload.items() if k != "webhookTimestamp"}
            return hashlib.sha256(canonical_json(stable)).digest()
        return super().fingerprint(body, headers, payload)

    def embed(self, body: bytes, *, now: float, secret: Secret | None = None) -> bytes:
        """``body`` with ``webhookTimestamp`` set to ``now`` (Linear sets it per send)."""
        document = json.loads(body)
        document["webhookTimestamp"] = int(now * 1000)
        return json.dumps(document, separators=(",", ":")).encode()

    def sign(
        self,
        body: bytes,
        *,
        event_id: str,
        event_type: str,
        now: float,
        secret: Secret | None = None,
    ) -> dict[str, str]:
        key = shared_key("linear", secret or self.secrets[0])
        return {
            _SIGNATURE: _compute(key, body).hex(),
            "linear-delivery": event_id,
            "linear-event": (event_type or "Issue.create").partition(".")[0],
            "content-type": "application/json",
        }

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        kind, _, action = (event_type or "Issue.create").partition(".")
        document = {
            "action": action or "create",
            "type": kind,
            "createdAt": "2023-11-14T22:13:20.000Z",
            "data": {"id": event_id, "title": "relaybox test"},
            "url": "https://linear.app/relaybox/issue/TEST-1",
            "organizationId": self.account or "relaybox-test-org",
            "webhookId": "relaybox-test-webhook",
            "webhookTimestamp": int(now * 1000),
        }
        return json.dumps(document, separators=(",", ":")).encode()


def linear(*, secrets: Iterable[Secret | str] | Secret | str, **options: Any) -> LinearSource:
    """A Linear source; ``secrets`` are webhook signing secrets."""
    return LinearSource(secrets=secrets, **options)
