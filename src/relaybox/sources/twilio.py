"""Twilio: ``X-Twilio-Signature``, an HMAC over the URL and the sorted form parameters.

What is signed (as the ``twilio`` package's ``RequestValidator`` computes it): the
full URL Twilio requested (scheme, host, path, query string), then for each form
parameter name in sorted order, each of its distinct values in sorted order, name
and value appended. HMAC-SHA1 keyed with the account's Auth Token, base64. A request
carrying ``X-Twilio-Webhooks-Signature-Settings: key=...,algorithm=HMAC_SHA256`` is
signed with HMAC-SHA256 (and the shared key configured as the secret). The URL is
tried with and without its default port, as the validator does.

JSON requests (some Twilio products) sign the URL alone, which carries
``bodySHA256=<hex SHA-256 of the body>`` in its query string; that hash must match.

The URL is the one the request was made to; behind a proxy or TLS terminator set
``url`` to the public URL configured at Twilio (the query string of each request is
appended to it).

Twilio sends no event id. relaybox uses the ``I-Twilio-Idempotency-Token`` header
(the same on Twilio's retries) when present, else ``"sha256:" + hex`` of the
canonical JSON of the form parameters: a resend carries the same parameters, so the
same key; a new state of the same message (``MessageStatus=delivered`` after
``sent``) has other parameters and is its own event. The type is
``message.<MessageStatus or SmsStatus>``, ``call.<CallStatus>``, else ``request``;
the account is ``AccountSid``. No timestamp: no tolerance.

Form requests are answered with an empty TwiML document (``<Response/>``, text/xml):
Twilio does nothing more for them; reply from a handler through the API.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlencode, urlsplit

from relaybox.errors import BadSignature, MalformedPayload
from relaybox.sources.base import Headers, Identity, Secret, Signing, Verified, shared_key
from relaybox.sources.bodies import content_type, decode_form
from relaybox.sources.hooks import Answer
from relaybox.sources.kit import (
    DEFAULT_URL,
    PublicUrl,
    b64,
    derived_id,
    digest,
    require_header,
    signed_url,
    text,
    unb64,
)

__all__ = ["TwilioSource", "twilio"]

_SIGNATURE = "x-twilio-signature"
_SETTINGS = "x-twilio-webhooks-signature-settings"
_IDEMPOTENCY = "i-twilio-idempotency-token"
_ALGORITHMS = {"HMAC_SHA1": hashlib.sha1, "HMAC_SHA256": hashlib.sha256}
_TWIML = b'<?xml version="1.0" encoding="UTF-8"?><Response></Response>'


def _algorithm(settings: str | None) -> str:
    for part in (settings or "").split(","):
        name, sep, value = part.partition("=")
        if sep and name.strip() == "algorithm" and value.strip():
            return value.strip().upper()
    return "HMAC_SHA1"


def _ports(url: str) -> list[str]:
    """The URL without and with its default port (Twilio signs either)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        return [parts._replace(netloc=host).geturl(), url]
    port = 443 if parts.scheme == "https" else 80
    return [url, parts._replace(netloc=f"{parts.netloc}:{port}").geturl()]


def signing_string(url: str, params: Mapping[str, Any]) -> bytes:
    out = url
    for name in sorted(params):
        value = params[name]
        values = value if isinstance(value, list) else [value]
        for item in sorted(set(values)):
            out += name + item
    return out.encode("utf-8")


def _is_json(headers: Headers) -> bool:
    return content_type(headers)[0] == "application/json"


class TwilioSource(PublicUrl):
    """Twilio webhooks (Messaging, Voice, status callbacks)."""

    provider = "twilio"
    signs_url = True
    content_type: ClassVar[str] = "application/x-www-form-urlencoded"

    def decode(self, headers: Headers, body: bytes) -> Any:
        if _is_json(headers):
            return self.parse(body)
        return decode_form(body, self.body_limits)

    def authenticate(
        self, headers: Headers, body: bytes, now: float, check_time: bool
    ) -> tuple[Secret, float | None]:
        given = unb64(require_header(headers, _SIGNATURE, "X-Twilio-Signature"), "signature")
        algorithm = _ALGORITHMS.get(_algorithm(headers.get(_SETTINGS)))
        if algorithm is None:
            raise BadSignature("unsupported X-Twilio-Webhooks-Signature-Settings algorithm")
        url = signed_url(headers, self.url)
        params: Mapping[str, Any] = {}
        if _is_json(headers):
            claimed = parse_qs(urlsplit(url).query).get("bodySHA256", [""])[0]
            actual = hashlib.sha256(body).hexdigest()
            if not hmac.compare_digest(claimed.lower().encode(), actual.encode()):
                raise BadSignature("bodySHA256 does not match the body")
        else:
            params = decode_form(body, self.body_limits)
        candidates = [signing_string(u, params) for u in _ports(url)]

        def matches(secret: Secret) -> bool:
            key = shared_key("twilio", secret)
            return any(
                hmac.compare_digest(digest(key, c, algorithm=algorithm), given) for c in candidates
            )

        return self.try_secrets(matches), None

    def identify(self, headers: Headers, payload: Any) -> Identity:
        if not isinstance(payload, Mapping):
            raise MalformedPayload("Twilio payload must be form fields or a JSON object")
        token = (headers.get(_IDEMPOTENCY) or "").strip()
        status = text(payload.get("MessageStatus")) or text(payload.get("SmsStatus"))
        call = text(payload.get("CallStatus"))
        if status:
            event_type = f"message.{status}"
        elif call:
            event_type = f"call.{call}"
        else:
            event_type = "request"
        return Identity(
            event_id=token or derived_id(payload),
            event_type=event_type,
            account=text(payload.get("AccountSid")),
        )

    def acknowledge(self, verified: Verified, status: str) -> Answer | None:
        if isinstance(verified.payload, Mapping) and "AccountSid" in verified.payload:
            return Answer(200, _TWIML, "text/xml")
        return None

    def signed_headers(self, body: bytes, signing: Signing) -> dict[str, str]:
        key = shared_key("twilio", signing.secret)
        target = signing.url or self.url or DEFAULT_URL.format(name=self.name)
        params = decode_form(body, self.body_limits)
        signature = b64(digest(key, signing_string(target, params), algorithm=hashlib.sha1))
        return {
            _SIGNATURE: signature,
            _IDEMPOTENCY: signing.event_id,
            "content-type": self.content_type,
        }

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        kind, _, state = (event_type or "message.delivered").partition(".")
        fields = {
            "AccountSid": self.account or "AC00000000000000000000000000000000",
            "From": "+15005550006",
            "To": "+15005550001",
            "ApiVersion": "2010-04-01",
        }
        if kind == "call":
            fields.update(CallSid=f"CA{event_id}", CallStatus=state or "completed")
        else:
            fields.update(MessageSid=f"SM{event_id}", MessageStatus=state or "delivered")
        return urlencode(fields).encode()


def twilio(*, secrets: Iterable[Secret | str] | Secret | str, **options: Any) -> TwilioSource:
    """A Twilio source; ``secrets`` are Auth Tokens (or webhook shared keys);
    ``url`` the public URL configured at Twilio when a proxy changes it."""
    return TwilioSource(secrets=secrets, **options)
