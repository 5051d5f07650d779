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
from collections.abc import Mapping
from typing import Any

from relaybox.errors import MalformedPayload
from relaybox.sources.base import Headers, Identity, canonical_json
from relaybox.sources.kit import batch_identity, derived_id, event_keys, text
from relaybox.sources.scheme import Example, Hmac, Sample, Scheme, UrlSchemeSource, factory

__all__ = ["HubSpotSource", "hubspot"]

_DECODED = {
    "%3A": ":", "%2F": "/", "%3F": "?", "%40": "@", "%21": "!", "%24": "$",
    "%27": "'", "%28": "(", "%29": ")", "%2A": "*", "%2C": ",", "%3B": ";",
}  # fmt: skip


def _decode_uri(uri: str) -> str:
    for escape, char in _DECODED.items():
        uri = uri.replace(escape, char).replace(escape.lower(), char)
    return uri


def _example(event: Example) -> list[dict[str, Any]]:
    account = event.account
    return [
        {
            "eventId": int(hashlib.sha256(event.id.encode()).hexdigest()[:12], 16),
            "subscriptionId": 12345,
            "portalId": int(account) if account.isdigit() else 62515,
            "appId": 54321,
            "occurredAt": event.ms,
            "subscriptionType": event.type,
            "attemptNumber": 0,
            "objectId": 123,
            "changeSource": "CRM",
        }
    ]


class HubSpotSource(UrlSchemeSource):
    """HubSpot app webhooks (signature v3)."""

    provider = "hubspot"
    scheme = Scheme(
        Hmac(
            "X-HubSpot-Signature-v3",
            "POST{url}{body}{timestamp}",
            encoding="base64",
            timestamp="header:X-HubSpot-Request-Timestamp",
            unit="ms",
        ),
        event_id="eventId",
        event_type="subscriptionType",
        sample=Sample(type="contact.creation", body=_example),
    )

    def signed_urls(self, headers: Headers) -> tuple[str, ...]:
        uri = super().signed_urls(headers)[0]
        return tuple(dict.fromkeys((uri, _decode_uri(uri))))

    def identify(self, headers: Headers, payload: Any) -> Identity:
        if isinstance(payload, Mapping):
            return Identity(event_id=derived_id(payload), event_type="webhook")
        if not isinstance(payload, list) or not payload:
            raise MalformedPayload("HubSpot payload must be a JSON array of events")
        ids = event_keys(payload, "eventId", "HubSpot")
        types = (text(event.get("subscriptionType")) or "" for event in payload)
        portals = (text(event.get("portalId")) or "" for event in payload)
        return batch_identity(ids, types, portals)

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


hubspot = factory(
    HubSpotSource, "A HubSpot source; ``secrets`` are app client secrets; ``url`` the public URL."
)
