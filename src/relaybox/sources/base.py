"""What every inbound source shares: secrets, tolerance, limits, tenant mapping.

A source turns a raw HTTP delivery (headers + the exact body bytes) into a
:class:`Verified` delivery or raises a :class:`~relaybox.errors.RejectedDelivery`.
Provider modules (``standard``, ``stripe``, ``github``, ``shopify``, ``slack``,
``hmac``) implement :meth:`Source.authenticate` (signature and timestamp) and
:meth:`Source.identify` (event id, type, verified account); this base class does
the rest in one order for all of them:

1. ``authenticate`` on the raw bytes, trying each configured secret (rotation);
2. parse JSON (only after the signature matched: never re-serialise before it);
3. ``identify`` the event, then map the verified account to a tenant.

The tenant comes from what was verified: the secret that matched (``Secret.tenant``
/ ``Secret.account``) or a verified account mapped through ``tenants``; never from
an unverified payload field alone.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from relaybox.errors import (
    BadSignature,
    ConfigurationError,
    MalformedHeaders,
    MalformedPayload,
    StaleTimestamp,
)
from relaybox.sources.bodies import DEFAULT_LIMITS, BodyLimits
from relaybox.sources.hooks import Answer, Request

__all__ = [
    "DEFAULT_MAX_BODY",
    "DEFAULT_TOLERANCE",
    "Headers",
    "Identity",
    "Secret",
    "Source",
    "Verified",
    "canonical_json",
    "check_timestamp",
    "constant_time_equal",
    "extract",
]

_JSON_OPENERS = (b"{", b"[")

DEFAULT_TOLERANCE = 300.0
DEFAULT_MAX_BODY = 1024 * 1024

Headers = Mapping[str, str]
"""Request headers with lower-case names (the receiver lower-cases them)."""


@dataclass(frozen=True)
class Secret:
    """One signing secret of a source, and what a match on it proves.

    ``account``/``tenant`` let a secret identify the sender: with one secret per
    customer account, the secret that matched *is* the verified account.
    """

    value: str
    account: str | None = None
    tenant: str | None = None

    def __repr__(self) -> str:  # never print secret material
        return f"Secret(account={self.account!r}, tenant={self.tenant!r}, value=<hidden>)"


def shared_key(provider: str, secret: Secret) -> bytes:
    """A shared HMAC secret as the providers use it: its UTF-8 bytes."""
    if not secret.value.strip():
        raise ConfigurationError(f"{provider} source: empty secret")
    return secret.value.encode("utf-8")


@dataclass(frozen=True)
class Identity:
    """What a provider module reads from a verified delivery."""

    event_id: str
    event_type: str
    account: str | None = None
    version: str | None = None


@dataclass(slots=True)
class Verified:
    """A delivery whose signature matched: safe to store under its event key."""

    source: str
    account: str
    event_id: str
    event_type: str
    tenant: str | None
    fingerprint: bytes
    payload: Any
    timestamp: float | None = None
    version: str | None = None


def constant_time_equal(a: bytes | str, b: bytes | str) -> bool:
    if isinstance(a, str):
        a = a.encode()
    if isinstance(b, str):
        b = b.encode()
    return hmac.compare_digest(a, b)


def check_timestamp(ts: float, now: float, tolerance: float) -> None:
    """Refuse a signed timestamp too far in the past *or* the future."""
    if abs(now - ts) > tolerance:
        direction = "old" if ts < now else "far in the future"
        raise StaleTimestamp(
            f"signature timestamp is too {direction} (tolerance {int(tolerance)} s)"
        )


def parse_int_timestamp(raw: str | None, header: str) -> int:
    if raw is None or raw == "":
        raise MalformedHeaders(f"missing {header} header")
    try:
        return int(raw.strip())
    except ValueError:
        raise MalformedHeaders(f"{header} header is not an integer timestamp") from None


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def extract(path: str, headers: Headers, payload: Any) -> str | None:
    """Read a value named by ``path``: ``header:Name`` or a dotted JSON path (``data.order.id``).

    Lists are indexed by number (``items.0.id``). Returns ``None`` when absent; numbers
    are returned as their decimal text.
    """
    if path.startswith("header:"):
        return headers.get(path[len("header:") :].strip().lower())
    node: Any = payload
    for part in path.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    if node is None or isinstance(node, (dict, list)):
        return None
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


def b64decode_secret(value: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except Exception:
        raise ConfigurationError("secret is not valid base64") from None


class Source:
    """Base class of inbound sources. Subclasses set ``provider`` and implement
    :meth:`authenticate`, :meth:`identify`, :meth:`sign` and :meth:`example`."""

    provider: ClassVar[str] = "base"
    is_json: ClassVar[bool] = True
    signs_url: ClassVar[bool] = False
    """The scheme signs the request URL: the receiver passes it as ``headers[":url"]``."""
    body_limits: BodyLimits = DEFAULT_LIMITS
    """Bounds on non-JSON bodies; :meth:`Relaybox.source` sets the configured ones."""

    def __init__(
        self,
        *,
        secrets: Iterable[Secret | str] | Secret | str = (),
        tolerance: float = DEFAULT_TOLERANCE,
        verify_timestamp: bool = True,
        max_body: int = DEFAULT_MAX_BODY,
        account: str | None = None,
        tenant: str | None = None,
        tenants: Mapping[str, str] | None = None,
        ignore_types: Sequence[str] = (),
        inline: bool = False,
        fingerprint_path: str | None = None,
        version_path: str | None = None,
        name: str | None = None,
    ) -> None:
        if isinstance(secrets, (str, Secret)):
            secrets = (secrets,)
        self.secrets: tuple[Secret, ...] = tuple(
            s if isinstance(s, Secret) else Secret(s) for s in secrets
        )
        if not self.secrets:
            raise ConfigurationError(f"{self.provider} source needs at least one secret")
        for secret in self.secrets:
            self.check_secret(secret)
        if tolerance <= 0:
            raise ConfigurationError("tolerance must be positive seconds")
        if max_body <= 0:
            raise ConfigurationError("max_body must be positive bytes")
        self.tolerance = float(tolerance)
        self.verify_timestamp = verify_timestamp
        self.max_body = int(max_body)
        self.account = account
        self.tenant = tenant
        self.tenants = dict(tenants or {})
        self.ignore_types = tuple(ignore_types)
        self.inline = inline
        self.fingerprint_path = fingerprint_path
        self.version_path = version_path
        self.name = name or self.provider

    # -- provider hooks -------------------------------------------------------

    def check_secret(self, secret: Secret) -> None:
        """Refuse, when the source is built, a secret no delivery could match (by
        default an empty shared secret; a provider with key formats checks those)."""
        shared_key(self.provider, secret)

    def authenticate(
        self, headers: Headers, body: bytes, now: float, check_time: bool
    ) -> tuple[Secret, float | None]:
        """Check the signature on the raw ``body``; return the secret that matched and
        the signed timestamp (``None`` when the scheme has none). Raise
        :class:`BadSignature`, :class:`StaleTimestamp` or :class:`MalformedHeaders`."""
        raise NotImplementedError

    def identify(self, headers: Headers, payload: Any) -> Identity:
        """Read event id, type and (verified) account from a delivery whose
        signature already matched. Raise :class:`MalformedPayload` or
        :class:`MalformedHeaders` when the id or type is missing."""
        raise NotImplementedError

    def sign(
        self,
        body: bytes,
        *,
        event_id: str,
        event_type: str,
        now: float,
        secret: Secret | None = None,
    ) -> dict[str, str]:
        """Headers that the real provider would send with ``body`` (for
        ``relaybox send-test`` and tests). Uses the first secret by default."""
        raise NotImplementedError

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        """A plausible body for ``relaybox send-test`` (provider's own envelope)."""
        raise NotImplementedError

    # -- shared pipeline ------------------------------------------------------

    def verify(
        self, headers: Headers, body: bytes, now: float, *, check_time: bool | None = None
    ) -> Verified:
        """Authenticate, parse, identify and map to a tenant. ``check_time=False``
        verifies a stored delivery again ignoring its (old) timestamp, for replays."""
        if check_time is None:
            check_time = self.verify_timestamp
        secret, ts = self.authenticate(headers, body, now, check_time)
        payload = self.decode(headers, body)
        ident = self.identify(headers, payload)
        if not ident.event_id:
            raise MalformedPayload("delivery has no event id", code="missing_event_id")
        if len(ident.event_id) > 512:
            raise MalformedPayload("event id is longer than 512 characters")
        account = secret.account or ident.account or self.account or "default"
        tenant = secret.tenant or self.tenants.get(account) or self.tenant
        version = ident.version
        if self.version_path is not None:
            version = extract(self.version_path, headers, payload)
        return Verified(
            source=self.name,
            account=account,
            event_id=ident.event_id,
            event_type=ident.event_type or "",
            tenant=tenant,
            fingerprint=self.fingerprint(body, headers, payload),
            payload=payload,
            timestamp=ts,
            version=version,
        )

    def parse(self, body: bytes) -> Any:
        if not self.is_json:
            return None
        try:
            if body[:1] in _JSON_OPENERS and body[1:2] not in (b"", b"\x00"):
                # What json.loads(bytes) decodes as UTF-8 (no BOM, not UTF-16/32),
                # without its pure-Python encoding sniffing: ~1.4 µs a request.
                return json.loads(body.decode("utf-8", "surrogatepass"))
            return json.loads(body)
        except (UnicodeDecodeError, ValueError):
            raise MalformedPayload("body is not valid JSON", code="malformed_json") from None

    def fingerprint(self, body: bytes, headers: Headers, payload: Any) -> bytes:
        """Content fingerprint used to tell a duplicate from a conflicting delivery.

        The raw body by default. With ``fingerprint_path`` (seed 004: an envelope
        that changes on every resend) only that part of the JSON counts, canonicalised.
        """
        if self.fingerprint_path is None:
            return hashlib.sha256(body).digest()
        node: Any = payload
        for part in self.fingerprint_path.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        return hashlib.sha256(canonical_json(node)).digest()

    def ignores(self, event_type: str) -> bool:
        return any(fnmatch.fnmatchcase(event_type, pat) for pat in self.ignore_types)

    def try_secrets(self, check: Any) -> Secret:
        """Return the first secret for which ``check(secret)`` is true (rotation)."""
        for secret in self.secrets:
            if check(secret):
                return secret
        raise BadSignature("no signature matched")

    def describe(self) -> dict[str, Any]:
        """Non-secret configuration, for the CLI and admin API."""
        return {
            "name": self.name,
            "provider": self.provider,
            "secrets": len(self.secrets),
            "tolerance": self.tolerance,
            "verify_timestamp": self.verify_timestamp,
            "max_body": self.max_body,
            "account": self.account,
            "tenant": self.tenant,
            "ignore_types": list(self.ignore_types),
            "inline": self.inline,
        }

    # -- bodies and answers (relaybox.sources.bodies, relaybox.sources.hooks) ---

    def decode(self, headers: Headers, body: bytes) -> Any:
        """The payload a handler sees. JSON by default (:meth:`parse`); a provider
        that sends form, multipart or XML bodies decodes them here to a dict. The
        raw ``body`` is still what is stored and fingerprinted."""
        return self.parse(body)

    def handshake(self, request: Request) -> Answer | None:
        """Answer an unsigned verification challenge, before any signature check;
        ``None`` for an ordinary delivery. Nothing is stored for a handshake."""
        return None

    def challenge(self, verified: Verified) -> Answer | None:
        """Answer a signed verification challenge (its signature matched); ``None``
        for an ordinary delivery. Nothing is stored for a challenge."""
        return None

    def acknowledge(self, verified: Verified, status: str) -> Answer | None:
        """The 2xx answer the provider expects once the delivery is committed
        (``status``: accepted, duplicate, quarantined, ignored); ``None``: relaybox's
        JSON ``{"status", "event_id"}``."""
        return None
