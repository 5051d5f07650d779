"""Small pieces the provider modules share: reading headers, HMACs, derived ids, the
public URL of URL-signing schemes and key material for public-key schemes."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from relaybox.errors import BadSignature, ConfigurationError, MalformedHeaders, MalformedPayload
from relaybox.sources.base import Headers, canonical_json
from relaybox.sources.hooks import URL_HEADER

__all__ = [
    "DEFAULT_URL",
    "b64",
    "derived_id",
    "digest",
    "json_object",
    "require_header",
    "signed_url",
    "text",
    "unb64",
    "unhex",
]

DEFAULT_URL = "http://127.0.0.1:8000/webhooks/{name}"
"""Where ``sign()`` of a URL-signing source says it sends when no URL is given."""

PRIVATE_PREFIX = "private:"
"""Secret prefix of a private key given to a public-key source so that it can sign
(``send-test``, :mod:`relaybox.testing`); it verifies with the derived public key."""


def require_header(headers: Headers, name: str, display: str) -> str:
    value = (headers.get(name) or "").strip()
    if not value:
        raise BadSignature(f"missing {display} header", code="missing_signature")
    return value


def digest(key: bytes, *parts: bytes, algorithm: Callable[..., Any] = hashlib.sha256) -> bytes:
    mac = hmac.new(key, digestmod=algorithm)
    for part in parts:
        mac.update(part)
    return mac.digest()


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def unb64(value: str, what: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (ValueError, binascii.Error):
        raise BadSignature(f"{what} is not base64") from None


def unhex(value: str, what: str) -> bytes:
    try:
        return bytes.fromhex(value)
    except ValueError:
        raise BadSignature(f"{what} is not hex") from None


def text(value: Any) -> str | None:
    """A non-empty string, or a number as its decimal text; else ``None``."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    return value if isinstance(value, str) and value else None


def path(payload: Any, *keys: str) -> Any:
    node = payload
    for key in keys:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node


def json_object(payload: Any, provider: str) -> Mapping[str, Any]:
    if not isinstance(payload, Mapping):
        raise MalformedPayload(f"{provider} payload must be a JSON object")
    return payload


def derived_id(value: Any) -> str:
    """``"sha256:" + hex`` of ``value`` as canonical JSON (sorted keys, no spaces):
    the same for a resend whatever its key order or whitespace."""
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()


def signed_url(headers: Headers, configured: str | None) -> str:
    """The URL a URL-signing scheme signed: the configured public ``url`` (what was
    entered in the provider's console) with the request's query string when it has
    none of its own, else the URL the request was made to."""
    seen = headers.get(URL_HEADER) or ""
    if configured:
        query = urlsplit(seen).query if seen else ""
        if query and "?" not in configured:
            return f"{configured}?{query}"
        return configured
    if not seen:
        raise MalformedHeaders("the request URL is unknown; configure the source's url")
    return seen


def check_url(url: str | None, provider: str) -> str | None:
    if url is None:
        return None
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigurationError(f"{provider} source: url must be an absolute http(s) URL")
    return url
