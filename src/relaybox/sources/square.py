"""Square: ``x-square-hmacsha256-signature``, an HMAC over the notification URL + body.

What is signed: the notification URL exactly as configured on the webhook
subscription, then the raw body; HMAC-SHA256 keyed with the subscription's signature
key, base64; as the ``squareup`` package's ``verify_signature`` computes it. Set
``url`` to that notification URL (without it, the URL the request was made to is
used). No timestamp: no tolerance.

Identity: ``event_id`` (the same on Square's retries), ``type``
(``payment.updated``), and ``merchant_id`` as the account.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from relaybox.errors import MalformedPayload
from relaybox.sources.base import Headers, Identity, Secret, Source, shared_key
from relaybox.sources.kit import (
    DEFAULT_URL,
    b64,
    check_url,
    digest,
    json_object,
    require_header,
    signed_url,
    text,
    unb64,
)

__all__ = ["SquareSource", "square"]

_SIGNATURE = "x-square-hmacsha256-signature"


class SquareSource(Source):
    """Square webhook subscriptions."""

    provider = "square"
    signs_url = True

    def __init__(
        self,
        *,
        url: str | None = None,
        secrets: Iterable[Secret | str] | Secret | str = (),
        **options: Any,
    ) -> None:
        super().__init__(secrets=secrets, **options)
        self.url = check_url(url, "square")

    def authenticate(
        self, headers: Headers, body: bytes, now: float, check_time: bool
    ) -> tuple[Secret, float | None]:
        given = unb64(
            require_header(headers, _SIGNATURE, "x-square-hmacsha256-signature"), "signature"
        )
        url = (self.url or signed_url(headers, None)).encode()
        return self.try_secrets(
            lambda s: hmac.compare_digest(digest(shared_key("square", s), url, body), given)
        ), None

    def identify(self, headers: Headers, payload: Any) -> Identity:
        event = json_object(payload, "Square")
        event_id, event_type = text(event.get("event_id")), text(event.get("type"))
        if event_id is None or event_type is None:
            raise MalformedPayload('Square event has no "event_id" or "type"')
        return Identity(
            event_id=event_id, event_type=event_type, account=text(event.get("merchant_id"))
        )

    def sign(
        self,
        body: bytes,
        *,
        event_id: str,
        event_type: str,
        now: float,
        secret: Secret | None = None,
        url: str | None = None,
    ) -> dict[str, str]:
        key = shared_key("square", secret or self.secrets[0])
        target = self.url or url or DEFAULT_URL.format(name=self.name)
        return {
            _SIGNATURE: b64(digest(key, target.encode(), body)),
            "content-type": "application/json",
        }

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        stamp = datetime.fromtimestamp(now, UTC).isoformat().replace("+00:00", "Z")
        event = {
            "merchant_id": self.account or "MLRELAYBOXTEST",
            "type": event_type or "payment.updated",
            "event_id": event_id,
            "created_at": stamp,
            "data": {"type": "payment", "id": "relaybox-test", "object": {"payment": {}}},
        }
        return json.dumps(event, separators=(",", ":")).encode()


def square(*, secrets: Iterable[Secret | str] | Secret | str, **options: Any) -> SquareSource:
    """A Square source; ``secrets`` are signature keys; ``url`` the notification URL."""
    return SquareSource(secrets=secrets, **options)
