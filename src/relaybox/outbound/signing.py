"""Signing outbound webhooks: Standard Webhooks (v1 HMAC, v1a Ed25519) and the
``X-Webhook-Signature: sha256=<hex>`` header.

The key parsing and the signed content are the inbound verifier's own
(:mod:`relaybox.sources.standard`), so what relaybox sends is exactly what relaybox
(and the official ``standardwebhooks`` libraries) accept. During a rotation every
active secret signs: ``webhook-signature`` carries one space-separated entry per
secret, and a receiver holding either secret verifies.

Secrets never leave this module in logs: callers log endpoint ids, not secrets.
"""

from __future__ import annotations

import base64
import functools
import hmac
import secrets as _random
from collections.abc import Sequence
from typing import Any, Literal

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from relaybox.sources.base import Secret
from relaybox.sources.standard import parse_key, signed_content

__all__ = ["SecretKind", "new_secret", "public_form", "sign"]

SecretKind = Literal["hmac", "ed25519"]


def new_secret(kind: SecretKind = "hmac") -> str:
    """A fresh secret: ``whsec_`` + 24 random bytes (HMAC, as Svix issues them), or
    ``whsk_`` + a raw Ed25519 private key (the receiver gets :func:`public_form`)."""
    if kind == "hmac":
        return "whsec_" + base64.b64encode(_random.token_bytes(24)).decode()
    raw = Ed25519PrivateKey.generate().private_bytes_raw()
    return "whsk_" + base64.b64encode(raw).decode()


def public_form(secret: str) -> str:
    """What the endpoint's owner needs to verify: the ``whsec_`` secret itself, or the
    ``whpk_`` public key of a ``whsk_`` private key (which never leaves relaybox)."""
    if secret.startswith("whsk_"):
        key = parse_key(Secret(secret))
        assert key.public is not None
        return "whpk_" + base64.b64encode(key.public.public_bytes_raw()).decode()
    return secret


@functools.lru_cache(maxsize=1024)
def _key(secret: str) -> Any:
    """A secret decoded once, not on every attempt (base64, Ed25519 key setup)."""
    return parse_key(Secret(secret))


@functools.lru_cache(maxsize=1024)
def _keyed(key: bytes) -> hmac.HMAC:
    """An HMAC-SHA256 state keyed once; each signature copies it. (``hmac.digest``
    looks the digest up in OpenSSL on every call: it was ~4 % of the dispatcher's CPU
    per delivery, bench/README.md.)"""
    return hmac.new(key, digestmod="sha256")


def sign(
    *,
    msg_id: str,
    timestamp: int,
    body: bytes,
    secrets: Sequence[str],
    scheme: Literal["standard", "sha256"] = "standard",
) -> dict[str, str]:
    """Headers for one attempt. ``webhook-id`` and ``webhook-timestamp`` always go
    (receivers deduplicate on the id); the signature header depends on ``scheme``."""
    headers = {"webhook-id": msg_id, "webhook-timestamp": str(timestamp)}
    if scheme == "sha256":
        # Receivers of this header compute HMAC-SHA256(secret, raw body) with the secret
        # string as they were given it. One value per active secret, newest first.
        headers["X-Webhook-Signature"] = ", ".join(
            "sha256=" + hmac.digest(s.encode(), body, "sha256").hex()
            for s in secrets
            if not s.startswith("whsk_")
        )
        return headers
    content = signed_content(msg_id, timestamp, body)
    entries = []
    for secret in secrets:
        key = _key(secret)
        if key.hmac_key is not None:
            mac = _keyed(key.hmac_key).copy()
            mac.update(content)
            entries.append("v1," + base64.b64encode(mac.digest()).decode())
        elif key.private is not None:
            entries.append("v1a," + base64.b64encode(key.private.sign(content)).decode())
    headers["webhook-signature"] = " ".join(entries)
    return headers
