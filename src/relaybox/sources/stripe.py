"""Stripe: ``Stripe-Signature: t=<unix>,v1=<hex>[,v1=<hex>][,v0=...]``.

What is signed: ``f"{t}.".encode() + body``, HMAC-SHA256 in lower-case hex, keyed
with the endpoint secret's UTF-8 bytes (``whsec_...`` is used as is, not base64
decoded: that is what Stripe does). Behaviour follows the official library
(``stripe._webhook.WebhookSignature``): the first ``t`` counts and is re-formatted
as an integer before signing, any ``v1`` entry may match (Stripe sends two while
an endpoint secret is being rolled), other schemes (``v0`` test signatures) are
ignored.

One deliberate difference: Stripe's library only refuses timestamps that are too
old; we also refuse ones too far in the future, so a leaked signed request cannot
be post-dated to outlive the tolerance window.

The event id is ``payload["id"]`` (``evt_...``, the same on every retry), the type
``payload["type"]``, and the account ``payload["account"]`` on Connect events, so
one platform secret can serve many connected accounts.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
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

__all__ = ["StripeSource", "stripe"]

_HEADER = "stripe-signature"


def _key(secret: Secret) -> bytes:
    return shared_key("stripe", secret)


def _parse_header(items: list[str]) -> tuple[int, list[str]]:
    raw_timestamp: str | None = None
    signatures: list[str] = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            continue
        name = name.strip()
        if name == "t" and raw_timestamp is None:
            raw_timestamp = value.strip()
        elif name == "v1":
            signatures.append(value.strip())
    if raw_timestamp is None:
        raise MalformedHeaders("Stripe-Signature header has no t= timestamp")
    return parse_int_timestamp(raw_timestamp, "Stripe-Signature t="), signatures


def _compute(key: bytes, timestamp: int, body: bytes) -> str:
    mac = hmac.new(key, b"%d." % timestamp, hashlib.sha256)
    mac.update(body)
    return mac.hexdigest()


class StripeSource(Source):
    """Stripe webhook endpoints (snapshot events, including Connect)."""

    provider = "stripe"

    def authenticate(
        self, headers: Headers, body: bytes, now: float, check_time: bool
    ) -> tuple[Secret, float | None]:
        header = self.signature_header(headers, _HEADER, "Stripe-Signature")
        if not header:
            raise BadSignature("missing Stripe-Signature header", code="missing_signature")
        items = header.split(",")
        self.check_signature_count(len(items), "Stripe-Signature")
        timestamp, signatures = _parse_header(items)
        if not signatures:
            raise BadSignature("no v1 signature in Stripe-Signature header")

        def matches(secret: Secret) -> bool:
            expected = _compute(_key(secret), timestamp, body).encode()
            return any(hmac.compare_digest(expected, sig.encode()) for sig in signatures)

        secret = self.try_secrets(matches)
        if check_time:
            check_timestamp(timestamp, now, self.tolerance)
        return secret, float(timestamp)

    def identify(self, headers: Headers, payload: Any) -> Identity:
        if not isinstance(payload, Mapping):
            raise MalformedPayload("Stripe payload must be a JSON object")
        event_id = payload.get("id")
        if not isinstance(event_id, str) or not event_id:
            raise MalformedPayload('Stripe event has no "id"', code="missing_event_id")
        event_type = payload.get("type")
        if not isinstance(event_type, str) or not event_type:
            raise MalformedPayload('Stripe event has no "type"', code="missing_event_type")
        account = payload.get("account")
        version = payload.get("api_version")
        return Identity(
            event_id=event_id,
            event_type=event_type,
            account=account if isinstance(account, str) and account else None,
            version=version if isinstance(version, str) else None,
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
        timestamp = int(now)
        signature = _compute(_key(secret or self.secrets[0]), timestamp, body)
        return {_HEADER: f"t={timestamp},v1={signature}"}

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        event = {
            "id": event_id,
            "object": "event",
            "api_version": "2024-06-20",
            "created": int(now),
            "type": event_type or "payment_intent.succeeded",
            "livemode": False,
            "pending_webhooks": 1,
            "request": {"id": None, "idempotency_key": None},
            "data": {"object": _example_object(event_type or "payment_intent.succeeded", now)},
        }
        return json.dumps(event, separators=(",", ":")).encode()


def _example_object(event_type: str, now: float) -> dict[str, Any]:
    """The object a Stripe event of ``event_type`` carries, with the fields handlers
    read (an ``invoice.*`` event carries an invoice with ``amount_paid``)."""
    kind = event_type.rsplit(".", 1)[0]
    if kind == "invoice":
        return {
            "id": "in_relaybox_test",
            "object": "invoice",
            "customer": "cus_relaybox_test",
            "subscription": "sub_relaybox_test",
            "amount_due": 2000,
            "amount_paid": 2000 if event_type == "invoice.paid" else 0,
            "amount_remaining": 0 if event_type == "invoice.paid" else 2000,
            "currency": "usd",
            "status": "paid" if event_type == "invoice.paid" else "open",
            "paid": event_type == "invoice.paid",
            "created": int(now),
        }
    if kind in ("customer.subscription", "subscription"):
        return {
            "id": "sub_relaybox_test",
            "object": "subscription",
            "customer": "cus_relaybox_test",
            "status": "active",
            "created": int(now),
        }
    if kind == "checkout.session":
        return {
            "id": "cs_relaybox_test",
            "object": "checkout.session",
            "customer": "cus_relaybox_test",
            "amount_total": 2000,
            "currency": "usd",
            "payment_status": "paid",
            "status": "complete",
        }
    return {
        "id": "pi_relaybox_test",
        "object": "payment_intent",
        "amount": 2000,
        "amount_received": 2000,
        "currency": "usd",
        "status": "succeeded",
    }


def stripe(*, secrets: Iterable[Secret | str] | Secret | str, **options: Any) -> StripeSource:
    """A Stripe source; ``secrets`` are endpoint secrets (``whsec_...``). ``options``
    are :class:`Source` arguments (``tolerance``, ``tenants``, ...)."""
    return StripeSource(secrets=secrets, **options)
