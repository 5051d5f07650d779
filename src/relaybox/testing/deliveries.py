"""Signed deliveries for every provider: a test source with a known secret per
provider, and a request signed the way that provider signs it."""

from __future__ import annotations

import base64
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from relaybox.sources import PROVIDERS, from_config
from relaybox.sources.base import Secret, Source
from relaybox.sources.kit import DEFAULT_URL, PRIVATE_PREFIX

__all__ = ["TEST_SECRETS", "Delivery", "signed_delivery", "test_source"]


def _sendgrid_test_key() -> str:
    # A fixed P-256 key, so test configurations can be written down.
    private = ec.derive_private_key(0x5E1D6A1D_7E57_0001, ec.SECP256R1())
    der = private.private_bytes(
        serialization.Encoding.DER,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return PRIVATE_PREFIX + base64.b64encode(der).decode()


TEST_SECRETS: dict[str, str] = {
    "adyen": "44782DEF547AAA06C910C43932B1EB0C71FC68D9D0C057550C48EC2ACF6BA056",
    "asana": "relaybox-test-asana",
    "bitbucket": "relaybox-test-bitbucket",
    "box": "relaybox-test-box",
    "calendly": "relaybox-test-calendly",
    "chargebee": "relaybox:test-chargebee",
    "clerk": "whsec_" + base64.b64encode(b"relaybox-test-clerk-signing-key!").decode(),
    "coinbase_commerce": "relaybox-test-coinbase-commerce",
    "discord": PRIVATE_PREFIX + "11" * 32,
    "docusign": "relaybox-test-docusign",
    "dropbox": "relaybox-test-dropbox",
    "github": "relaybox-test-github",
    "gitlab": "relaybox-test-gitlab",
    "hubspot": "relaybox-test-hubspot",
    "intercom": "relaybox-test-intercom",
    "lemonsqueezy": "relaybox-test-lemonsqueezy",
    "linear": "relaybox-test-linear",
    "mailgun": "relaybox-test-mailgun",
    "msgraph": "relaybox-test-client-state",
    "notion": "secret_relaybox_test_notion",
    "okta": "relaybox-test-okta",
    "paddle": "pdl_ntfset_relaybox_test",
    "pagerduty": "relaybox-test-pagerduty",
    "pipedrive": "relaybox:test-pipedrive",
    "postmark": "relaybox:test-password",
    "razorpay": "relaybox-test-razorpay",
    "recurly": "relaybox-test-recurly",
    "resend": "whsec_" + base64.b64encode(b"relaybox-test-resend-signing-key").decode(),
    "sendgrid": _sendgrid_test_key(),
    "sentry": "relaybox-test-sentry",
    "shopify": "relaybox-test-shopify",
    "slack": "relaybox-test-slack",
    "square": "relaybox-test-square",
    "standard": "whsec_" + base64.b64encode(b"relaybox-test-standard-webhooks!").decode(),
    "stripe": "whsec_relaybox_test",
    "twilio": "relaybox-test-twilio",
    "twitch": "relaybox-test-twitch",
    "twitter": "relaybox-test-twitter",
    "typeform": "relaybox-test-typeform",
    "vercel": "relaybox-test-vercel",
    "woocommerce": "relaybox-test-woocommerce",
    "workos": "relaybox-test-workos",
    "zendesk": "relaybox-test-zendesk",
    "zoom": "relaybox-test-zoom",
}
"""The secret :func:`test_source` configures for each provider (public-key providers
get a private key, so that the kit can sign)."""


def test_source(provider: str, **options: Any) -> Source:
    """A source of ``provider`` with its :data:`TEST_SECRETS` secret (``secrets=`` to
    use others) and any other option (``hmac`` needs its own: ``header``, ``id_path``)."""
    if provider not in PROVIDERS:
        raise ValueError(f"unknown provider {provider!r}; expected one of: {', '.join(PROVIDERS)}")
    if "secrets" not in options and "secret" not in options:
        if provider not in TEST_SECRETS:
            raise ValueError(f"{provider}: give secrets= (no test secret for it)")
        options["secrets"] = [TEST_SECRETS[provider]]
    source = from_config(provider, options)
    source.name = provider
    return source


test_source.__test__ = False  # type: ignore[attr-defined]  # not a test for pytest


@dataclass(frozen=True)
class Delivery:
    """A signed request: what a provider would POST to ``/webhooks/{source}``."""

    source: str
    headers: dict[str, str]
    body: bytes
    event_id: str
    event_type: str
    url: str

    def tampered(self) -> Delivery:
        """The same request with the body's last byte changed (the signature no longer
        matches, for providers that sign the body)."""
        last = self.body[-1:]
        changed = b" " if last != b" " else b"\n"
        return Delivery(
            self.source,
            self.headers,
            self.body[:-1] + changed,
            self.event_id,
            self.event_type,
            self.url,
        )


def _encode(source: Source, payload: Any) -> bytes:
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, str):
        return payload.encode("utf-8")
    if getattr(source, "content_type", "") == "application/x-www-form-urlencoded":
        return urlencode(payload, doseq=True).encode()
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def signed_delivery(
    source: str | Source,
    *,
    event_type: str | None = None,
    payload: Any = None,
    event_id: str | None = None,
    now: float | None = None,
    secret: Secret | str | None = None,
    url: str | None = None,
) -> Delivery:
    """A delivery signed the way the provider signs it.

    ``source`` is a configured :class:`Source` (a box's, to be accepted by it) or a
    provider name (then :func:`test_source` makes one). ``payload`` is the body: a
    dict or list (JSON, or form fields for form-encoded providers), ``bytes`` as
    they are, or ``None`` for the provider's example event of ``event_type``.
    ``now`` is the signing time (default: the real clock; pass the box's
    ``clock.now()`` for a frozen one). ``url`` is where it is sent (for providers
    that sign the URL; default ``http://127.0.0.1:8000/webhooks/{name}``).
    """
    if isinstance(source, str):
        source = test_source(source)
    if isinstance(secret, str):
        secret = Secret(secret)
    now = time.time() if now is None else now
    event_id = event_id or f"evt_test_{uuid.uuid4().hex[:16]}"
    body = (
        source.example(event_type, event_id, now) if payload is None else _encode(source, payload)
    )
    embed = getattr(source, "embed", None)
    if embed is not None:  # signature or send time inside the body (Mailgun, Linear, Adyen)
        body = embed(body, now=now, secret=secret)
    target = url or DEFAULT_URL.format(name=source.name)
    options: dict[str, Any] = {"event_id": event_id, "event_type": event_type or "", "now": now}
    if secret is not None:
        options["secret"] = secret
    if source.signs_url:
        options["url"] = target
    headers = {k.lower(): v for k, v in source.sign(body, **options).items()}
    headers.setdefault("content-type", getattr(source, "content_type", "application/json"))
    return Delivery(source.name, headers, body, event_id, event_type or "", target)
