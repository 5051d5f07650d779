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
    "DEFAULT_MAX_JSON_DEPTH",
    "DEFAULT_MAX_SIGNATURES",
    "DEFAULT_TOLERANCE",
    "MAX_ACCOUNT_CHARS",
    "MAX_EVENT_ID_CHARS",
    "MAX_EVENT_TYPE_CHARS",
    "MAX_SUBJECT_CHARS",
    "MAX_TIMESTAMP_DIGITS",
    "MAX_VERSION_CHARS",
    "SIGNATURE_ENTRY_CHARS",
    "Headers",
    "Identity",
    "Secret",
    "Signing",
    "Source",
    "Verified",
    "canonical_json",
    "check_timestamp",
    "constant_time_equal",
    "extract",
    "subject_digest",
]

_JSON_OPENERS = (b"{", b"[")

DEFAULT_TOLERANCE = 300.0
DEFAULT_MAX_BODY = 1024 * 1024
DEFAULT_MAX_SIGNATURES = 16
"""Signature entries a signature header may hold (rotation sends two or three)."""
SIGNATURE_ENTRY_CHARS = 128
"""Characters allowed per signature entry: a signature header longer than
``max_signatures + 1`` times this is refused before it is split (an Ed25519 ``v1a``
entry is 92 characters, a Stripe ``v1`` entry 68; the one more leaves room for
Stripe's ``t=`` and a configured prefix)."""
DEFAULT_MAX_JSON_DEPTH = 256
"""Nesting depth of a JSON body (objects and arrays) beyond which it is refused."""
MAX_TIMESTAMP_DIGITS = 16
"""Digits of a signed timestamp header: seconds need 10, milliseconds 13."""
MAX_EVENT_ID_CHARS = 512
MAX_EVENT_TYPE_CHARS = 256
MAX_ACCOUNT_CHARS = 128
MAX_VERSION_CHARS = 128
MAX_SUBJECT_CHARS = 1024
"""The longest subject an erasure or a publish names."""
MAX_SUBJECT_PATH_DEPTH = 32
"""The most names a subject path may have (``erasure.path_max_depth`` may lower it)."""
MAX_SUBJECT_PATH_CHARS = 512
"""The longest subject path (``erasure.path_max_chars`` may lower it)."""
# The event key (source, account, event_id) is one unique index entry: 512 + 128
# characters stay within PostgreSQL's ~2,700-byte b-tree entry even at 4 bytes each.

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
    """What a provider module reads from a verified delivery. ``from_headers`` names
    the fields (``event_id``, ``event_type``, ``account``, ``version``) read from
    headers rather than the body: a bad value there is a ``malformed_headers`` 400."""

    event_id: str
    event_type: str
    account: str | None = None
    version: str | None = None
    from_headers: frozenset[str] = frozenset()


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
    subject: bytes | None = None
    """The digest of the subject the payload names at the source's ``subject`` path
    (:func:`subject_digest`); ``None`` without a path or a value there."""


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
    """A timestamp header's value: ASCII digits only, at most ``MAX_TIMESTAMP_DIGITS``
    (no sign, exponent, ``inf`` or ``nan``), so that it always fits a float."""
    text = (raw or "").strip()
    if not text:
        raise MalformedHeaders(f"missing {header} header")
    if len(text) > MAX_TIMESTAMP_DIGITS or not (text.isascii() and text.isdigit()):
        raise MalformedHeaders(
            f"{header} header is not an integer timestamp (at most {MAX_TIMESTAMP_DIGITS} digits)"
        )
    return int(text)


def text_problem(value: str, limit: int) -> str | None:
    """Why ``value`` cannot be stored as text in both databases, or ``None``: longer
    than ``limit`` characters, a NUL (PostgreSQL refuses it in text) or an unpaired
    surrogate (not encodable as UTF-8, as JSON ``"\\ud800"`` decodes)."""
    if len(value) > limit:
        return f"is longer than {limit} characters"
    if "\x00" in value:
        return "contains a NUL character"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "contains an unpaired surrogate"
    return None


def check_text(value: str, what: str, limit: int, *, in_headers: bool) -> None:
    """Refuse a delivery whose ``value`` (its event id, type, account or version)
    cannot be stored: 400 ``malformed_headers`` or ``malformed_payload``."""
    problem = text_problem(value, limit)
    if problem is not None:
        error = MalformedHeaders if in_headers else MalformedPayload
        raise error(f"{what} {problem}")


def _check_config_text(value: str | None, what: str, limit: int) -> None:
    if value is not None and (problem := text_problem(value, limit)) is not None:
        raise ConfigurationError(f"{what} {problem}")


def json_depth_exceeds(value: Any, limit: int) -> bool:
    """Whether parsed JSON nests objects/arrays deeper than ``limit`` (iterative: a
    deep document cannot exhaust the stack here)."""
    if type(value) is not dict and type(value) is not list:
        return False
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in node.values() if type(node) is dict else node:
            if type(child) is dict or type(child) is list:
                stack.append((child, depth + 1))
    return False


def canonical_json(value: Any) -> bytes:
    # surrogatepass: a lone surrogate in the JSON (valid JSON, not valid UTF-8) still
    # has one, stable encoding.
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8", "surrogatepass")


def subject_digest(subject: str) -> bytes:
    """What relaybox stores to find a subject's rows (``relaybox_subjects``) and
    records of an erasure: the SHA-256 of the subject's text, never the text itself.
    One digest for every source and event type: erasing ``cus_123`` finds it
    wherever a path declared it."""
    text = subject.encode("utf-8", "surrogatepass")
    return hashlib.sha256(b"relaybox.subject\x00" + text).digest()


def check_subject_path(path: str, *, max_depth: int, max_chars: int) -> None:
    """Refuse a subject path outside the grammar: a dotted JSON path of 1 to
    ``max_depth`` non-empty names (list indexes as numbers) within ``max_chars``."""
    parts = path.split(".")
    if not path or len(path) > max_chars or len(parts) > max_depth or not all(parts):
        raise ConfigurationError(
            f"subject path {path[:80]!r} must be a dotted JSON path of at most "
            f"{max_depth} names and {max_chars} characters (data.object.customer)"
        )
    if path.startswith("header:"):
        raise ConfigurationError("a subject path reads the payload, not a header")


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


@dataclass(frozen=True)
class Signing:
    """What :meth:`Source.sign` signs a body for: the event's id and type, the time it
    is sent, the secret (the source's first unless one is given) and the URL it is
    sent to (``None``: the source's default)."""

    event_id: str
    event_type: str
    now: float
    secret: Secret
    url: str | None = None


class Source:
    """Base class of inbound sources. Subclasses set ``provider`` and implement
    :meth:`authenticate`, :meth:`identify`, :meth:`sign` and :meth:`example`."""

    provider: ClassVar[str] = "base"
    is_json: ClassVar[bool] = True
    may_offload: bool = False
    """Whether :meth:`offload` can ever be true (the receiver asks only then)."""
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
        max_signatures: int = DEFAULT_MAX_SIGNATURES,
        max_json_depth: int = DEFAULT_MAX_JSON_DEPTH,
        account: str | None = None,
        tenant: str | None = None,
        tenants: Mapping[str, str] | None = None,
        ignore_types: Sequence[str] = (),
        inline: bool = False,
        fingerprint_path: str | None = None,
        version_path: str | None = None,
        subject: str | None = None,
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
        if not 1 <= max_signatures <= 1024:
            raise ConfigurationError("max_signatures must be between 1 and 1024")
        if not 1 <= max_json_depth <= 512:
            # Past ~900 levels json.loads itself runs out of stack (RecursionError).
            raise ConfigurationError("max_json_depth must be between 1 and 512")
        for value, what, limit in (
            (account, "account", MAX_ACCOUNT_CHARS),
            (tenant, "tenant", MAX_ACCOUNT_CHARS),
            *((s.account, "a secret's account", MAX_ACCOUNT_CHARS) for s in self.secrets),
            *((s.tenant, "a secret's tenant", MAX_ACCOUNT_CHARS) for s in self.secrets),
            *((v, "a tenants value", MAX_ACCOUNT_CHARS) for v in (tenants or {}).values()),
        ):
            _check_config_text(value, f"{self.provider} source: {what}", limit)
        self.tolerance = float(tolerance)
        self.verify_timestamp = verify_timestamp
        self.max_body = int(max_body)
        self.max_signatures = int(max_signatures)
        # A signature header longer than this cannot hold max_signatures entries.
        self.max_signature_chars = (self.max_signatures + 1) * SIGNATURE_ENTRY_CHARS
        self.max_json_depth = int(max_json_depth)
        self.account = account
        self.tenant = tenant
        self.tenants = dict(tenants or {})
        self.ignore_types = tuple(ignore_types)
        self.inline = inline
        self.fingerprint_path = fingerprint_path
        self.version_path = version_path
        if subject is not None:
            check_subject_path(
                subject, max_depth=MAX_SUBJECT_PATH_DEPTH, max_chars=MAX_SUBJECT_PATH_CHARS
            )
        self.subject_path = subject
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
        url: str | None = None,
    ) -> dict[str, str]:
        """Headers that the real provider would send with ``body`` (for
        ``relaybox send-test`` and tests). Uses the first secret by default; ``url``
        is where it is sent, for a source that signs it (:attr:`signs_url`)."""
        signing = Signing(event_id, event_type, now, secret or self.secrets[0], url)
        return self.signed_headers(body, signing)

    def signed_headers(self, body: bytes, signing: Signing) -> dict[str, str]:
        """What :meth:`sign` returns: each provider's own."""
        raise NotImplementedError

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        """A plausible body for ``relaybox send-test`` (provider's own envelope)."""
        raise NotImplementedError

    def offload(self, headers: Headers, body: bytes) -> bool:
        """Whether verifying this request costs enough CPU (public-key signatures on
        a large body, many keys) to run it in a thread instead of on the event loop."""
        return False

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
        # What the provider sent becomes text columns: refused here, for this request
        # alone, when no database could store it (not as a failed group commit).
        where = ident.from_headers
        check_text(ident.event_id, "event id", MAX_EVENT_ID_CHARS, in_headers="event_id" in where)
        if ident.event_type:
            check_text(
                ident.event_type,
                "event type",
                MAX_EVENT_TYPE_CHARS,
                in_headers="event_type" in where,
            )
        if ident.account:
            # Even when the secret names the account (then this one is not stored): an
            # account no database can store is no account a provider sends.
            check_text(ident.account, "account", MAX_ACCOUNT_CHARS, in_headers="account" in where)
        account = secret.account or ident.account or self.account or "default"
        tenant = secret.tenant or self.tenants.get(account) or self.tenant
        version = ident.version
        in_headers = "version" in where
        if self.version_path is not None:
            version = extract(self.version_path, headers, payload)
            in_headers = self.version_path.startswith("header:")
        if version:
            check_text(version, "version", MAX_VERSION_CHARS, in_headers=in_headers)
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
            subject=None if self.subject_path is None else self.subject_of(headers, payload),
        )

    def parse(self, body: bytes) -> Any:
        if not self.is_json:
            return None
        try:
            if body[:1] in _JSON_OPENERS and body[1:2] not in (b"", b"\x00"):
                # What json.loads(bytes) decodes as UTF-8 (no BOM, not UTF-16/32),
                # without its pure-Python encoding sniffing: ~1.4 µs a request.
                payload = json.loads(body.decode("utf-8", "surrogatepass"))
            else:
                payload = json.loads(body)
        except (UnicodeDecodeError, ValueError):
            raise MalformedPayload("body is not valid JSON", code="malformed_json") from None
        except RecursionError:  # deeper than the stack allows: far past max_json_depth
            raise self._too_deep() from None
        # Fewer openers than the limit cannot nest past it: the walk is for the rare
        # body with more (brackets inside strings count here, not in the walk).
        limit = self.max_json_depth
        if body.count(b"[") + body.count(b"{") > limit and json_depth_exceeds(payload, limit):
            raise self._too_deep()
        return payload

    def _too_deep(self) -> MalformedPayload:
        return MalformedPayload(
            f"JSON is nested deeper than {self.max_json_depth} levels", code="json_too_deep"
        )

    def fingerprint(self, body: bytes, headers: Headers, payload: Any) -> bytes:
        """Content fingerprint used to tell a duplicate from a conflicting delivery.

        The raw body by default. With ``fingerprint_path`` (for a provider whose
        envelope changes on every resend) only that part of the JSON counts, canonicalised.
        """
        if self.fingerprint_path is None:
            return hashlib.sha256(body).digest()
        node: Any = payload
        for part in self.fingerprint_path.split("."):
            node = node.get(part) if isinstance(node, Mapping) else None
        return hashlib.sha256(canonical_json(node)).digest()

    def subject_of(self, headers: Headers, payload: Any) -> bytes | None:
        """The digest of the subject at the ``subject`` path of the parsed payload
        (:func:`subject_digest`; no second parse); ``None`` without a path or a
        scalar value there."""
        if self.subject_path is None:
            return None
        value = extract(self.subject_path, headers, payload)
        return None if value is None or value == "" else subject_digest(value)

    def ignores(self, event_type: str) -> bool:
        if not self.ignore_types:
            return False
        return any(fnmatch.fnmatchcase(event_type, pat) for pat in self.ignore_types)

    def signature_header(self, headers: Headers, name: str, label: str) -> str:
        """The stripped text of the signature header ``name`` (``""`` when absent),
        refused as ``too_many_signatures`` (401) before anything parses it when it is
        longer than ``max_signatures`` entries can be."""
        raw = headers.get(name) or ""
        if len(raw) > self.max_signature_chars:
            raise BadSignature(
                f"{label} header is longer than {self.max_signature_chars} characters",
                code="too_many_signatures",
            )
        return raw.strip()

    def check_signature_count(self, count: int, label: str) -> None:
        """Refuse, before any cryptography, a header with more than ``max_signatures``
        entries: each entry is checked against each key."""
        if count > self.max_signatures:
            raise BadSignature(
                f"{label} header has more than {self.max_signatures} entries",
                code="too_many_signatures",
            )

    def try_secrets(self, check: Any, secrets: Sequence[Secret] | None = None) -> Secret:
        """Return the first secret (of ``secrets``, by default all the source's) for
        which ``check(secret)`` is true (rotation)."""
        for secret in self.secrets if secrets is None else secrets:
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
            "max_signatures": self.max_signatures,
            "max_json_depth": self.max_json_depth,
            "account": self.account,
            "tenant": self.tenant,
            "ignore_types": list(self.ignore_types),
            "inline": self.inline,
            "subject": self.subject_path,
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
