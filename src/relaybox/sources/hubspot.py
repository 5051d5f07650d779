"""HubSpot signature v3: ``X-HubSpot-Signature-v3`` over method, URI, body and timestamp.

What is signed: ``method + uri + body + timestamp`` (``POST``, the full request URL,
the raw body, then the ``X-HubSpot-Request-Timestamp`` header's text), HMAC-SHA256
keyed with the app's client secret, base64; as the ``hubspot-api-client`` package's
``Signature.get_signature(..., signature_version="v3")`` computes it. HubSpot's
documentation also asks to decode a few percent-escapes of the URI (``%3A``,
``%2F``, ``%3F``, ``%40``, ``%21``, ``%24``, ``%27``, ``%28``, ``%29``, ``%2A``,
``%2C``, ``%3B``) before signing; the SDK does not, so both forms are accepted.

The timestamp is in milliseconds; HubSpot asks to refuse requests older than 5
minutes (``tolerance``, both directions here). The URL is the one the request was
made to, or the configured public ``url``.

The body is a JSON array of events (``eventId``, ``subscriptionType``,
``portalId``, ``attemptNumber``...). One event is stored under its ``eventId``; a
batch under ``"batch:" + sha256`` of its sorted ``eventId`` values. Each retry
raises ``attemptNumber``, so the fingerprint leaves it out. The type is the
events' ``subscriptionType`` when they share one, else ``batch``; the account
``portalId``. A JSON object body (workflow webhooks) is stored under
``"sha256:" + hex`` of its canonical JSON, type ``webhook``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from typing import Any

from relaybox.errors import MalformedPayload
from relaybox.sources.base import (
    Headers,
    Identity,
    Secret,
    Source,
    canonical_json,
    check_timestamp,
    parse_int_timestamp,
    shared_key,
)
from relaybox.sources.kit import (
    DEFAULT_URL,
    b64,
    check_url,
    derived_id,
    digest,
    require_header,
    signed_url,
    text,
    unb64,
)

__all__ = ["HubSpotSource", "hubspot"]

_SIGNATURE = "x-hubspot-signature-v3"
_TIMESTAMP = "x-hubspot-request-timestamp"
_DECODED = {
    "%3A": ":", "%2F": "/", "%3F": "?", "%40": "@", "%21": "!", "%24": "$",
    "%27": "'", "%28": "(", "%29": ")", "%2A": "*", "%2C": ",", "%3B": ";",
}  # fmt: skip


def _decode_uri(uri: str) -> str:
    for escape, char in _DECODED.items():
        uri = uri.replace(escape, char).replace(escape.lower(), char)
    return uri


def _content(method: str, uri: str, body: bytes, timestamp: str) -> bytes:
    return f"{method}{uri}".encode() + body + timestamp.encode()


class HubSpotSource(Source):
    """HubSpot app webhooks (signature v3)."""

    provider = "hubspot"
    signs_url = True

    def __init__(
        self,
        *,
        url: str | None = None,
        secrets: Iterable[Secret | str] | Secret | str = (),
        **options: Any,
    ) -> None:
        super().__init__(secrets=secrets, **options)
        self.url = check_url(url, "hubspot")

    def authenticate(
        self, headers: Headers, body: bytes, now: float, check_time: bool
    ) -> tuple[Secret, float | None]:
        given = unb64(require_header(headers, _SIGNATURE, "X-HubSpot-Signature-v3"), "signature")
        raw_timestamp = (headers.get(_TIMESTAMP) or "").strip()
        millis = parse_int_timestamp(raw_timestamp, "X-HubSpot-Request-Timestamp")
        uri = signed_url(headers, self.url)
        contents = {_content("POST", u, body, raw_timestamp) for u in (uri, _decode_uri(uri))}

        def matches(secret: Secret) -> bool:
            key = shared_key("hubspot", secret)
            return any(hmac.compare_digest(digest(key, c), given) for c in contents)

        secret = self.try_secrets(matches)
        if check_time:
            check_timestamp(millis / 1000, now, self.tolerance)
        return secret, millis / 1000

    def identify(self, headers: Headers, payload: Any) -> Identity:
        if isinstance(payload, Mapping):
            return Identity(event_id=derived_id(payload), event_type="webhook")
        if not isinstance(payload, list) or not payload:
            raise MalformedPayload("HubSpot payload must be a JSON array of events")
        ids: list[str] = []
        types: set[str] = set()
        portals: set[str] = set()
        for event in payload:
            event_id = text(event.get("eventId")) if isinstance(event, Mapping) else None
            if event_id is None:
                raise MalformedPayload('a HubSpot event has no "eventId"')
            ids.append(event_id)
            types.add(text(event.get("subscriptionType")) or "")
            portals.add(text(event.get("portalId")) or "")
        event_type = (types.pop() if len(types) == 1 else "") or "batch"
        account = (portals.pop() if len(portals) == 1 else "") or None
        if len(ids) == 1:
            return Identity(event_id=ids[0], event_type=event_type, account=account)
        joined = ",".join(sorted(ids)).encode()
        return Identity(
            event_id="batch:" + hashlib.sha256(joined).hexdigest(),
            event_type=event_type,
            account=account,
        )

    def fingerprint(self, body: bytes, headers: Headers, payload: Any) -> bytes:
        if isinstance(payload, list):
            stable = [
                {k: v for k, v in e.items() if k != "attemptNumber"}
                if isinstance(e, Mapping)
                else e
                for e in payload
            ]
            return hashlib.sha256(canonical_json(stable)).digest()
        return super().fingerprint(body, headers, payload)

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
        key = shared_key("hubspot", secret or self.secrets[0])
        target = url or self.url or DEFAULT_URL.format(name=self.name)
        timestamp = str(int(now * 1000))
        return {
            _SIGNATURE: b64(digest(key, _content("POST", target, body, timestamp))),
            _TIMESTAMP: timestamp,
            "content-type": "application/json",
        }

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        account = self.account or ""
        events = [
            {
                "eventId": int(hashlib.sha256(event_id.encode()).hexdigest()[:12], 16),
                "subscriptionId": 12345,
                "portalId": int(account) if account.isdigit() else 62515,
                "appId": 54321,
                "occurredAt": int(now * 1000),
                "subscriptionType": event_type or "contact.creation",
                "attemptNumber": 0,
                "objectId": 123,
                "changeSource": "CRM",
            }
        ]
        return json.dumps(events, separators=(",", ":")).encode()


def hubspot(*, secrets: Iterable[Secret | str] | Secret | str, **options: Any) -> HubSpotSource:
    """A HubSpot source; ``secrets`` are app client secrets; ``url`` the public URL."""
    return HubSpotSource(secrets=secrets, **options)
