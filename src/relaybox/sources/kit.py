"""Small pieces the provider modules share: reading headers, HMACs, derived ids, the
public URL of URL-signing schemes and key material for public-key schemes."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

from relaybox.errors import BadSignature, ConfigurationError, MalformedHeaders, MalformedPayload
from relaybox.sources.base import (
    Headers,
    Identity,
    Secret,
    Source,
    canonical_json,
    parse_int_timestamp,
)
from relaybox.sources.hooks import URL_HEADER

__all__ = [
    "DEFAULT_URL",
    "MAX_ISO_CHARS",
    "MILLISECONDS_ABOVE",
    "TIMESTAMP_UNITS",
    "PublicUrl",
    "b64",
    "batch_identity",
    "derived_id",
    "digest",
    "event_keys",
    "json_object",
    "require_header",
    "scale_timestamp",
    "signed_url",
    "text",
    "timestamp_seconds",
    "timestamp_text",
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


def event_keys(events: Iterable[Any], field: str, provider: str) -> list[str]:
    """Each event's ``field`` (:func:`text`); an event without one is malformed."""
    keys: list[str] = []
    for event in events:
        key = text(event.get(field)) if isinstance(event, Mapping) else None
        if key is None:
            raise MalformedPayload(f'a {provider} event has no "{field}"')
        keys.append(key)
    return keys


def batch_identity(
    keys: Sequence[str], types: Iterable[str], accounts: Iterable[str] = ()
) -> Identity:
    """The identity of a delivery of events (Adyen's items, HubSpot's and SendGrid's
    arrays), from each event's key, type and account: the one event's key, or
    ``"batch:" + sha256`` of the sorted keys joined with commas (the same for a resend
    in any order); the type and the account the events share, else ``"batch"`` and
    ``None``."""
    kinds, owners = set(types), set(accounts)
    event_type = (kinds.pop() if len(kinds) == 1 else "") or "batch"
    account = (owners.pop() if len(owners) == 1 else "") or None
    if len(keys) == 1:
        return Identity(event_id=keys[0], event_type=event_type, account=account)
    joined = ",".join(sorted(keys)).encode()
    return Identity(
        event_id="batch:" + hashlib.sha256(joined).hexdigest(),
        event_type=event_type,
        account=account,
    )


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


TIMESTAMP_UNITS = ("s", "ms", "auto", "iso")
"""How a signed timestamp is written: Unix seconds, milliseconds, either (``auto``:
milliseconds above :data:`MILLISECONDS_ABOVE`) or RFC 3339 (``iso``)."""
MILLISECONDS_ABOVE = 10**12
"""An ``auto`` timestamp above this is milliseconds, else seconds."""
MAX_ISO_CHARS = 40
"""Characters of an RFC 3339 timestamp header (nanoseconds and an offset need 35)."""


class PublicUrl(Source):
    """A source that signs its URL takes ``url``, the public URL configured at the
    provider, for a request whose URL a proxy changed (``None``: the request's own)."""

    def __init__(
        self,
        *,
        url: str | None = None,
        secrets: Iterable[Secret | str] | Secret | str = (),
        **options: Any,
    ) -> None:
        super().__init__(secrets=secrets, **options)
        self.url = check_url(url, self.provider)


def scale_timestamp(value: int, unit: str) -> float:
    """Seconds of an integer timestamp sent in ``unit`` (``s``, ``ms``, ``auto``)."""
    if unit == "ms" or (unit == "auto" and value > MILLISECONDS_ABOVE):
        return value / 1000
    return float(value)


def timestamp_seconds(raw: str, label: str, unit: str) -> float:
    """Seconds of the timestamp text ``raw`` sent in ``unit`` (``iso``: RFC 3339);
    ``label`` names where it was read in the error that refuses it."""
    if unit != "iso":
        return scale_timestamp(parse_int_timestamp(raw, label), unit)
    if not raw:
        raise MalformedHeaders(f"missing {label} header")
    try:
        if len(raw) > MAX_ISO_CHARS:
            raise ValueError(raw)
        moment = datetime.fromisoformat(raw)
    except ValueError:
        raise MalformedHeaders(f"{label} header is not an RFC 3339 timestamp") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def timestamp_text(now: float, unit: str) -> str:
    """``now`` written in ``unit``, as a provider sends it."""
    if unit == "ms":
        return str(int(now * 1000))
    if unit == "iso":
        return datetime.fromtimestamp(int(now), UTC).isoformat().replace("+00:00", "Z")
    return str(int(now))
