"""Adyen standard webhooks (JSON): an HMAC inside every notification item.

Each ``NotificationRequestItem`` carries ``additionalData.hmacSignature``: base64 of
HMAC-SHA256, keyed with the hex-decoded HMAC key from the Customer Area, over
``pspReference:originalReference:merchantAccountCode:merchantReference:value:currency:eventCode:success``
(absent fields empty, ``value``/``currency`` from ``amount``), as the ``Adyen``
package's ``util.is_valid_hmac_notification`` computes it. Every item of a request
must match. No timestamp: no tolerance.

Adyen expects the body ``[accepted]`` in the answer; relaybox sends it once the
notification is committed.

Adyen sends no event id: it documents ``pspReference`` with ``eventCode`` as what
identifies an event. relaybox stores a one-item notification under
``{pspReference}:{eventCode}:{success}`` (the same on Adyen's retries; a later
``success`` of the same pair is its own event) and a batch under ``"batch:" +
sha256`` of its sorted item keys. The type is ``eventCode`` (``AUTHORISATION``; a
batch of several codes is ``batch``), the account ``merchantAccountCode``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from typing import Any

from relaybox.errors import BadSignature, ConfigurationError, MalformedPayload
from relaybox.sources.base import Headers, Identity, Secret, Signing, Source, Verified
from relaybox.sources.hooks import Answer
from relaybox.sources.kit import batch_identity, text

__all__ = ["AdyenSource", "adyen"]

_FIELDS = (
    "pspReference",
    "originalReference",
    "merchantAccountCode",
    "merchantReference",
    "value",
    "currency",
    "eventCode",
    "success",
)


def _key(secret: Secret) -> bytes:
    try:
        key = binascii.unhexlify(secret.value.strip())
    except (ValueError, binascii.Error):
        raise ConfigurationError("adyen source: the HMAC key must be hex") from None
    if not key:
        raise ConfigurationError("adyen source: empty HMAC key")
    return key


def _items(payload: Any) -> list[Mapping[str, Any]]:
    items = payload.get("notificationItems") if isinstance(payload, Mapping) else None
    if not isinstance(items, list) or not items:
        raise MalformedPayload("Adyen notification has no notificationItems")
    found = []
    for entry in items:
        item = entry.get("NotificationRequestItem") if isinstance(entry, Mapping) else None
        if not isinstance(item, Mapping):
            raise MalformedPayload("Adyen notification item has no NotificationRequestItem")
        found.append(item)
    return found


def signing_string(item: Mapping[str, Any]) -> bytes:
    raw = item.get("amount")
    amount: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    values = {**item, "value": amount.get("value", ""), "currency": amount.get("currency", "")}
    return ":".join(str(values.get(name, "")) for name in _FIELDS).encode()


def _sign(key: bytes, item: Mapping[str, Any]) -> str:
    return base64.b64encode(hmac.new(key, signing_string(item), hashlib.sha256).digest()).decode()


class AdyenSource(Source):
    """Adyen standard webhooks, JSON format, HMAC-signed items."""

    provider = "adyen"

    def check_secret(self, secret: Secret) -> None:
        _key(secret)

    def authenticate(
        self, headers: Headers, body: bytes, now: float, check_time: bool
    ) -> tuple[Secret, float | None]:
        items = _items(self.parse(body))
        given: list[str] = []
        for item in items:
            extra = item.get("additionalData")
            signature = extra.get("hmacSignature") if isinstance(extra, Mapping) else None
            if not isinstance(signature, str) or not signature:
                raise BadSignature("an Adyen item has no hmacSignature", code="missing_signature")
            given.append(signature)

        def matches(secret: Secret) -> bool:
            key = _key(secret)
            return all(
                hmac.compare_digest(_sign(key, item).encode(), sig.encode())
                for item, sig in zip(items, given, strict=True)
            )

        return self.try_secrets(matches), None

    def identify(self, headers: Headers, payload: Any) -> Identity:
        keys: list[str] = []
        codes: list[str] = []
        merchants: list[str] = []
        for item in _items(payload):
            psp, code = text(item.get("pspReference")), text(item.get("eventCode"))
            if psp is None or code is None:
                raise MalformedPayload("an Adyen item has no pspReference or eventCode")
            keys.append(f"{psp}:{code}:{text(item.get('success')) or ''}")
            codes.append(code)
            merchants.append(text(item.get("merchantAccountCode")) or "")
        return batch_identity(keys, codes, merchants)

    def acknowledge(self, verified: Verified, status: str) -> Answer | None:
        return Answer(200, b"[accepted]", "text/plain")

    def embed(self, body: bytes, *, now: float, secret: Secret | None = None) -> bytes:
        """``body`` with every item's ``hmacSignature`` computed, as Adyen sends it."""
        document = json.loads(body)
        key = _key(secret or self.secrets[0])
        for entry in document.get("notificationItems", []):
            item = entry["NotificationRequestItem"]
            extra = {
                k: v for k, v in item.get("additionalData", {}).items() if k != "hmacSignature"
            }
            unsigned = {k: v for k, v in item.items() if k != "additionalData"}
            item["additionalData"] = {**extra, "hmacSignature": _sign(key, unsigned)}
        return json.dumps(document, separators=(",", ":")).encode()

    def signed_headers(self, body: bytes, signing: Signing) -> dict[str, str]:
        return {"content-type": "application/json"}

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        item = {
            "amount": {"value": 1130, "currency": "EUR"},
            "eventCode": event_type or "AUTHORISATION",
            "eventDate": "2023-11-14T22:13:20+01:00",
            "merchantAccountCode": self.account or "RelayboxTestMerchant",
            "merchantReference": "relaybox-test",
            "pspReference": event_id,
            "success": "true",
        }
        document = {"live": "false", "notificationItems": [{"NotificationRequestItem": item}]}
        return self.embed(json.dumps(document).encode(), now=now)


def adyen(*, secrets: Iterable[Secret | str] | Secret | str, **options: Any) -> AdyenSource:
    """An Adyen source; ``secrets`` are HMAC keys (hex, from the Customer Area)."""
    return AdyenSource(secrets=secrets, **options)
