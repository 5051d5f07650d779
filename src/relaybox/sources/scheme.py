"""Providers described as data: one frame for the many that sign alike.

Most providers authenticate a delivery in one of three ways: an HMAC over a string
built from the raw body (maybe with a timestamp, the event id or the URL), encoded
in hex or base64 and sent in a header (behind a prefix such as ``sha256=``, or as
``key=value`` entries such as ``t=…,v1=…``); HTTP Basic credentials; or a shared
token in a header. A :class:`Scheme` says which, with where the event id, type,
account and version live and what its test event looks like (a :class:`Sample`);
:class:`SchemeSource` verifies, signs and builds examples for every scheme in one
place. A provider module is then its class (so ``isinstance``, ``PROVIDERS`` and
the public names keep working), a scheme, and a factory; one whose class would hold
nothing but its scheme is a :class:`~relaybox.sources.preset_rows.Preset` row
(:mod:`relaybox.sources.preset_rows`).
Providers that truly differ (public keys, signatures inside the body, URL + form
parameters) keep a class of their own; handshakes and challenges are a method on a
scheme's class.

Where a value lives (``event_id``, ``event_type``, ``account``, ``version``) is a
:data:`~relaybox.sources.specs.Spec` (:mod:`relaybox.sources.specs`).

The signature is checked on the raw bytes, before anything is parsed, by comparing
the canonical text of the expected digest (lower-case hex, padded base64) in
constant time with each signature the request carries, for each configured secret
(rotation). A signed timestamp is checked against ``tolerance`` in both directions,
after a signature matched.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from hmac import compare_digest
from hmac import new as hmac_new
from typing import Any, ClassVar, TypeVar

from relaybox.errors import BadSignature, ConfigurationError, MalformedHeaders
from relaybox.sources.base import (
    DEFAULT_TOLERANCE,
    Headers,
    Identity,
    Secret,
    Signing,
    Source,
    canonical_json,
    check_timestamp,
    constant_time_equal,
    shared_key,
)
from relaybox.sources.kit import (
    DEFAULT_URL,
    TIMESTAMP_UNITS,
    PublicUrl,
    scale_timestamp,
    signed_url,
    timestamp_seconds,
    timestamp_text,
)
from relaybox.sources.specs import (
    Segment,
    Spec,
    alternatives,
    compile_template,
    extract_value,
    header_name,
    json_document,
    missing,
    put,
    read,
)

__all__ = [
    "BasicAuth",
    "Entries",
    "Example",
    "Hmac",
    "Sample",
    "Scheme",
    "SchemeSource",
    "Token",
    "UrlSchemeSource",
    "factory",
]

DIGESTS: dict[str, Callable[..., Any]] = {
    "sha1": hashlib.sha1,
    "sha256": hashlib.sha256,
    "sha512": hashlib.sha512,
}
ENCODINGS = ("hex", "base64")


@dataclass(frozen=True)
class Entries:
    """A signature header of ``key=value`` entries: Stripe's ``t=…,v1=…``, Paddle's
    ``ts=…;h1=…``. ``timestamp`` names the entry holding the signed timestamp (none
    when the scheme signs none); every ``signature`` entry is a candidate (a provider
    sends one per active secret while one is rotated). ``separator`` joins the
    entries when signing; they are split on it stripped of spaces."""

    separator: str = ","
    timestamp: str | None = "t"
    signature: str = "v1"
    positional: bool = False
    """Entries without keys (Recurly's ``<timestamp>,<sig>[,<sig>]``): the first is
    the timestamp, the others signatures."""


@dataclass(frozen=True)
class Hmac:
    """An HMAC of ``signed`` (a template over ``{body}``, ``{timestamp}``, ``{id}`` and
    ``{url}``; other text is literal, ``{{``/``}}`` braces) in ``header`` (or any of
    several headers, each with the digest of one key), after ``prefix`` or as
    :class:`Entries`. ``timestamp``: the header (``header:Name``) or JSON path it is
    read from, unless the entries carry it; ``unit`` ``s``, ``ms``, ``auto`` (ms above
    10**12) or ``iso`` (RFC 3339). ``{timestamp}`` is the text as sent, or its integer
    re-formatted with ``canonical_timestamp`` (as Stripe's library signs it)."""

    header: str | tuple[str, ...]
    signed: str = "{body}"
    digest: str = "sha256"
    encoding: str = "hex"
    prefix: str = ""
    entries: Entries | None = None
    timestamp: str | None = None
    unit: str = "s"
    canonical_timestamp: bool = False


@dataclass(frozen=True)
class BasicAuth:
    """HTTP Basic credentials (``Authorization: Basic``); a secret is ``user:password``."""


@dataclass(frozen=True)
class Token:
    """A shared token sent as is in ``header`` (compared in constant time)."""

    header: str


@dataclass(frozen=True)
class Example:
    """What an example event is built from: its id, type (the scheme's default when
    none was asked) and account, and the time it is sent."""

    id: str
    type: str
    account: str
    now: float

    @property
    def iso(self) -> str:
        """``now`` as RFC 3339 UTC with milliseconds (``2027-01-15T08:00:00.000Z``)."""
        stamp = datetime.fromtimestamp(self.now, UTC).isoformat(timespec="milliseconds")
        return stamp.replace("+00:00", "Z")

    @property
    def ms(self) -> int:
        return int(self.now * 1000)

    @property
    def resource(self) -> str:
        """What ``type`` is about, before its first dot (``issue`` of ``issue.created``)."""
        return self.type.partition(".")[0]

    @property
    def action(self) -> str:
        """What happened, after the first dot of ``type`` (``created``); empty without one."""
        return self.type.partition(".")[2]


@dataclass(frozen=True)
class Sample:
    """The test event a source sends as its provider would (``relaybox send-test``,
    :mod:`relaybox.testing`): its ``type`` and ``account`` when none is asked or
    configured, its ``body`` and the ``headers`` sent besides the signature and
    identity (each built from an :class:`Example`), and its ``content_type`` (none:
    no ``content-type`` header is sent)."""

    type: str = "test.event"
    account: str = ""
    body: Callable[[Example], Any] | None = None
    headers: Callable[[Example], Mapping[str, str]] | None = None
    content_type: str | None = "application/json"

    def event(self, id: str, type: str | None, account: str | None, now: float) -> Example:
        """The :class:`Example` of one test event: ``type`` and ``account`` as given,
        else this sample's."""
        return Example(id=id, type=type or self.type, account=account or self.account, now=now)

    def document(self, source: Source, type: str | None, id: str, now: float) -> bytes:
        """``source``'s example body (:meth:`~relaybox.sources.base.Source.example`):
        this sample's ``body`` of the event, as compact JSON."""
        if self.body is None:
            raise ConfigurationError(f"{source.provider} source: no example event; send your own")
        return json_document(self.body(self.event(id, type, source.account, now)))


@dataclass(frozen=True)
class Scheme:
    """A provider as data: how a delivery is authenticated (``check``), where its
    identity lives, the defaults of its source, and its test event (``sample``)."""

    check: Hmac | BasicAuth | Token
    event_id: Spec
    event_type: Spec
    account: Spec | None = None
    version: Spec | None = None
    tolerance: float = DEFAULT_TOLERANCE
    fingerprint_path: str | None = None
    unstable: tuple[str, ...] = ()
    """Top-level fields a resend changes (a send time, an attempt number): left out of
    the fingerprint, so a resend is a duplicate rather than a conflict."""
    sample: Sample = Sample()


# -- the source ---------------------------------------------------------------------------


class SchemeSource(Source):
    """A source whose provider is described by its :attr:`scheme`."""

    scheme: Scheme

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        scheme = cls.__dict__.get("scheme")
        if isinstance(scheme, Scheme) and isinstance(scheme.check, Hmac):
            cls.signs_url = "url" in compile_template(scheme.check.signed, _HMAC_FIELDS)

    def __init__(
        self, *, secrets: Iterable[Secret | str] | Secret | str = (), **options: Any
    ) -> None:
        scheme = self.scheme
        options.setdefault("tolerance", scheme.tolerance)
        if scheme.fingerprint_path is not None:
            options.setdefault("fingerprint_path", scheme.fingerprint_path)
        super().__init__(secrets=secrets, **options)
        self._prepare(scheme)

    def _prepare(self, scheme: Scheme) -> None:
        """Check and compile ``scheme`` once (its template, digest and encoding)."""
        check = scheme.check
        self._segments: tuple[Segment, ...] = ()
        if isinstance(check, Hmac):
            if check.digest not in DIGESTS:
                raise ConfigurationError(f"{self.provider}: unknown digest {check.digest!r}")
            if check.encoding not in ENCODINGS:
                raise ConfigurationError(f"{self.provider}: unknown encoding {check.encoding!r}")
            if check.unit not in TIMESTAMP_UNITS:
                raise ConfigurationError(f"{self.provider}: unknown unit {check.unit!r}")
            self._segments = compile_template(check.signed, _HMAC_FIELDS)
            names = (check.header,) if isinstance(check.header, str) else check.header
            self._signature_headers = tuple((n.lower(), n) for n in names)

    # -- the signature ----------------------------------------------------------------

    def check_secret(self, secret: Secret) -> None:
        if isinstance(self.scheme.check, BasicAuth):
            user, sep, password = secret.value.partition(":")
            if not sep or not user or not password:
                raise ConfigurationError(f"{self.provider} source: a secret is 'user:password'")
            return
        super().check_secret(secret)

    def authenticate(
        self, headers: Headers, body: bytes, now: float, check_time: bool
    ) -> tuple[Secret, float | None]:
        check = self.scheme.check
        if isinstance(check, Hmac):
            return self._authenticate_hmac(check, headers, body, now, check_time)
        if isinstance(check, Token):
            given = self.signature_header(headers, check.header.lower(), check.header)
            if not given:
                raise BadSignature(f"missing {check.header} header", code="missing_signature")
            token = given.encode()
            return self.try_secrets(lambda s: constant_time_equal(s.value.encode(), token)), None
        header = self.signature_header(headers, "authorization", "Authorization")
        credentials = _basic_credentials(header)
        return self.try_secrets(lambda s: constant_time_equal(s.value.encode(), credentials)), None

    def _authenticate_hmac(
        self, check: Hmac, headers: Headers, body: bytes, now: float, check_time: bool
    ) -> tuple[Secret, float | None]:
        raw_timestamp, given = self._signatures(check, headers)
        seconds: float | None = None
        if check.timestamp is not None and header_name(check.timestamp) is not None:
            raw_timestamp = (headers.get(header_name(check.timestamp) or "") or "").strip()
            label = check.timestamp[len("header:") :]
            seconds = timestamp_seconds(raw_timestamp, label, check.unit)
        elif raw_timestamp is not None:
            entry = check.entries.timestamp if check.entries is not None else ""
            label = f"{self._signature_headers[0][1]} {entry}="
            seconds = timestamp_seconds(raw_timestamp, label, check.unit)
        if raw_timestamp is not None and check.canonical_timestamp and seconds is not None:
            raw_timestamp = str(int(raw_timestamp))
        signed_id = self._signed_id(headers) if "id" in self._segments else ""
        urls = self.signed_urls(headers) if "url" in self._segments else ("",)
        candidates = [{"timestamp": raw_timestamp or "", "id": signed_id, "url": u} for u in urls]

        def matches(secret: Secret) -> bool:
            key = self.key(secret)
            for values in candidates:
                expected = self._encode(check, self._digest(check, key, body, values))
                if any(compare_digest(expected, sig) for sig in given):
                    return True
            return False

        secret = self.try_secrets(matches)
        if check.timestamp is not None and header_name(check.timestamp) is None:
            seconds = self._body_timestamp(check.timestamp, check.unit, body)
        if check_time and seconds is not None:
            check_timestamp(seconds, now, self.tolerance)
        return secret, seconds

    def _signatures(self, check: Hmac, headers: Headers) -> tuple[str | None, list[str]]:
        """The signed timestamp the entries carry (``None`` when they carry none) and
        every signature the request holds, in canonical text (hex lower-cased)."""
        found: list[str] = []
        timestamp: str | None = None
        for name, label in self._signature_headers:
            raw = self.signature_header(headers, name, label)
            if not raw:
                continue
            if check.entries is None:
                if not raw.startswith(check.prefix):
                    raise BadSignature(f"{label} header must start with {check.prefix!r}")
                found.append(raw[len(check.prefix) :])
                continue
            items = raw.split(check.entries.separator.strip())
            self.check_signature_count(len(items), label)
            for position, item in enumerate(items):
                key, sep, value = item.partition("=")
                key, value = key.strip(), value.strip()
                if check.entries.positional:  # the first is the timestamp, then signatures
                    sep, value = "=", item.strip()
                    key = check.entries.signature if position else check.entries.timestamp or ""
                if not sep:
                    continue
                if key == check.entries.timestamp and timestamp is None:
                    timestamp = value
                elif key == check.entries.signature:
                    found.append(value)
            if check.entries.timestamp is not None and timestamp is None:
                raise MalformedHeaders(f"{label} header has no {check.entries.timestamp}= entry")
        if not found and not any(headers.get(name) for name, _ in self._signature_headers):
            label = self._signature_headers[0][1]
            raise BadSignature(f"missing {label} header", code="missing_signature")
        if not found:
            raise BadSignature(f"no signature in {self._signature_headers[0][1]} header")
        if check.encoding == "hex":
            found = [value.lower() for value in found]
        return timestamp, found

    def _signed_id(self, headers: Headers) -> str:
        """The id a template signs: read from its header before the body is trusted."""
        for alternative in alternatives(self.scheme.event_id):
            if isinstance(alternative, str) and (name := header_name(alternative)):
                value = (headers.get(name) or "").strip()
                if value:
                    return value
        raise missing(self.scheme.event_id, "event id", "missing_event_id")

    def signed_urls(self, headers: Headers) -> tuple[str, ...]:
        """The URLs ``{url}`` may stand for (any may match): the request's, or what
        :class:`UrlSchemeSource` makes of a configured one."""
        return (signed_url(headers, None),)

    def key(self, secret: Secret) -> bytes:
        """The HMAC key of ``secret`` (its UTF-8 bytes)."""
        return shared_key(self.provider, secret)

    def _digest(self, check: Hmac, key: bytes, body: bytes, values: Mapping[str, str]) -> bytes:
        mac = hmac_new(key, digestmod=DIGESTS[check.digest])
        for segment in self._segments:
            if isinstance(segment, bytes):
                mac.update(segment)
            elif segment == "body":
                mac.update(body)
            else:
                mac.update(values[segment].encode())
        return mac.digest()

    @staticmethod
    def _encode(check: Hmac, digest: bytes) -> str:
        if check.encoding == "hex":
            return digest.hex()
        return base64.b64encode(digest).decode()

    def _body_timestamp(self, path: str, unit: str, body: bytes) -> float:
        sent = extract_value(self.parse(body), path)
        if isinstance(sent, bool) or not isinstance(sent, int) or not 0 <= sent < 10**16:
            raise BadSignature(f"{self.provider} payload has no integer {path}")
        return scale_timestamp(sent, unit)

    # -- identity -----------------------------------------------------------------------

    def identify(self, headers: Headers, payload: Any) -> Identity:
        scheme = self.scheme
        from_headers: set[str] = set()
        values: dict[str, str | None] = {}
        for field, spec, what, code in (
            ("event_id", scheme.event_id, "event id", "missing_event_id"),
            ("event_type", scheme.event_type, "event type", "missing_event_type"),
            ("account", scheme.account, "", ""),
            ("version", scheme.version, "", ""),
        ):
            if spec is None:
                values[field] = None
                continue
            value, in_header = read(spec, headers, payload)
            if value is None and code:
                raise missing(spec, what, code)
            if in_header:
                from_headers.add(field)
            values[field] = value
        return Identity(
            event_id=values["event_id"] or "",
            event_type=values["event_type"] or "",
            account=values["account"],
            version=values["version"],
            from_headers=frozenset(from_headers),
        )

    def fingerprint(self, body: bytes, headers: Headers, payload: Any) -> bytes:
        unstable = self.scheme.unstable
        if unstable and self.fingerprint_path is None and isinstance(payload, Mapping):
            stable = {k: v for k, v in payload.items() if k not in unstable}
            return hashlib.sha256(canonical_json(stable)).digest()
        return super().fingerprint(body, headers, payload)

    # -- signing and examples (send-test, relaybox.testing) ---------------------------------

    def signed_headers(self, body: bytes, signing: Signing) -> dict[str, str]:
        scheme, check, secret = self.scheme, self.scheme.check, signing.secret
        sample = scheme.sample
        account = secret.account or self.account
        event = sample.event(signing.event_id, signing.event_type, account, signing.now)
        headers: dict[str, str] = {}
        if isinstance(check, Hmac):
            headers.update(self._sign_hmac(check, body, event, secret, signing.url))
        elif isinstance(check, Token):
            headers[check.header.lower()] = secret.value
        else:
            headers["authorization"] = "Basic " + base64.b64encode(secret.value.encode()).decode()
        # Whatever identity is read from headers has to be sent in headers.
        for spec, value in (
            (scheme.event_id, event.id),
            (scheme.event_type, event.type),
            (scheme.account, event.account),
        ):
            first = alternatives(spec)[0] if spec is not None else None
            name = header_name(first) if isinstance(first, str) else None
            if name is not None and value:
                headers[name] = value
        if sample.headers is not None:
            headers.update({k.lower(): v for k, v in sample.headers(event).items()})
        if sample.content_type is not None:
            headers["content-type"] = sample.content_type
        return headers

    def _sign_hmac(
        self, check: Hmac, body: bytes, event: Example, secret: Secret, url: str | None
    ) -> dict[str, str]:
        timestamp = timestamp_text(event.now, check.unit)
        values = {
            "timestamp": timestamp,
            "id": event.id,
            "url": self._sign_url(url),
        }
        signature = self._encode(check, self._digest(check, self.key(secret), body, values))
        headers: dict[str, str] = {}
        if check.entries is None:
            value = check.prefix + signature
        else:
            entries = check.entries
            parts = [f"{entries.signature}={signature}"]
            if entries.timestamp is not None:
                parts.insert(0, f"{entries.timestamp}={timestamp}")
            if entries.positional:
                parts = [part.partition("=")[2] for part in parts]
            value = entries.separator.join(parts)
        headers[self._signature_headers[0][0]] = value
        if check.timestamp is not None and (name := header_name(check.timestamp)):
            headers[name] = timestamp
        return headers

    def _sign_url(self, url: str | None) -> str:
        return url or DEFAULT_URL.format(name=self.name)

    def embed(self, body: bytes, *, now: float, secret: Secret | None = None) -> bytes:
        """``body`` with the send time set where the scheme signs it in the body (as
        Linear does); other bodies are returned as they are."""
        check = self.scheme.check
        if not isinstance(check, Hmac) or check.timestamp is None or header_name(check.timestamp):
            return body
        document = json.loads(body)
        put(document, check.timestamp, int(now * 1000) if check.unit == "ms" else int(now))
        return json_document(document)

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        return self.scheme.sample.document(self, event_type, event_id, now)


class UrlSchemeSource(PublicUrl, SchemeSource):
    """A scheme that signs the URL: ``url`` is the public URL configured at the
    provider, for a request whose URL a proxy changed (else the request's own)."""

    append_query: ClassVar[bool] = True
    """Whether the request's query string is appended to the configured ``url``."""

    def signed_urls(self, headers: Headers) -> tuple[str, ...]:
        if self.url is not None and not self.append_query:
            return (self.url,)
        return (signed_url(headers, self.url),)

    def _sign_url(self, url: str | None) -> str:
        if self.url is not None and not self.append_query:
            return self.url
        return url or self.url or DEFAULT_URL.format(name=self.name)


_HMAC_FIELDS = ("body", "timestamp", "id", "url")


def _basic_credentials(header: str) -> bytes:
    if not header:
        raise BadSignature("missing Authorization header", code="missing_signature")
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        raise BadSignature("Authorization is not HTTP Basic")
    try:
        return base64.b64decode(encoded.strip(), validate=True)
    except (ValueError, binascii.Error):
        raise BadSignature("Authorization credentials are not base64") from None


S = TypeVar("S", bound=Source)


def factory(cls: type[S], doc: str) -> Callable[..., S]:
    """The ``relaybox.sources.<provider>(secrets=..., **options)`` function of ``cls``."""

    def make(*, secrets: Iterable[Secret | str] | Secret | str, **options: Any) -> S:
        return cls(secrets=secrets, **options)

    make.__name__ = make.__qualname__ = cls.provider
    make.__module__ = cls.__module__
    make.__doc__ = doc
    return make
