"""Generic HMAC signatures, for providers without a built-in module.

Configured, not coded: the signature ``header`` (value ``prefix`` + the encoded
digest), the ``algorithm`` (``sha256``/``sha512``), the ``encoding``
(``hex``/``base64``) and what is ``signed``: the raw ``"body"`` (default) or a
template such as ``"{timestamp}.{body}"`` or ``"{id}.{timestamp}.{body}"``. The
template is split around ``{body}`` at configuration time and the raw body bytes
are fed between the encoded literal parts: the body is never decoded, parsed or
re-serialised before verification. ``{{``/``}}`` stand for literal braces.

``format``: how the body is decoded for ``id_path``/``type_path`` and handlers:
``json`` (default), ``form`` (``application/x-www-form-urlencoded``), ``multipart``
(``multipart/form-data``), ``xml``, or ``auto`` (by the request's Content-Type).
Paths read form fields by name and XML as the dict :mod:`relaybox.sources.bodies`
builds (``Envelope.Order.@id``). The signature is always over the raw bytes.

``timestamp_header`` (optional): when set, the timestamp is required and checked
against ``tolerance`` in both directions. Integer seconds; values above 10**12 are
taken as milliseconds. ``{timestamp}`` in the template is that header's text as
sent, so it needs ``timestamp_header``.

Identity comes from paths read by :func:`relaybox.sources.base.extract`:
``id_path`` (required: ``"header:X-Event-Id"`` or a dotted JSON path such as
``"data.order.id"``), ``type_path`` (default ``"type"``) and ``account_path``
(optional). ``{id}`` in the template needs a header ``id_path``: the id must be
known before the body is trusted.

For envelopes that change on every resend (a payment provider wrapping a stable
order in a fresh notification id and send time), point ``id_path`` at the stable
id (``data.order.id``) and set ``fingerprint_path`` (``data``) so only the stable
part decides whether a resend is a duplicate or a conflicting change.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Iterable
from hmac import compare_digest
from hmac import new as hmac_new
from string import Formatter
from typing import Any
from urllib.parse import urlencode

from relaybox.errors import (
    BadSignature,
    ConfigurationError,
    MalformedHeaders,
    MalformedPayload,
)
from relaybox.sources.base import (
    Headers,
    Identity,
    Secret,
    Source,
    check_timestamp,
    extract,
    parse_int_timestamp,
    shared_key,
)
from relaybox.sources.bodies import FORMATS, decode

__all__ = ["HmacSource", "hmac"]

_ALGORITHMS = {"sha256": hashlib.sha256, "sha512": hashlib.sha512}
_ENCODINGS = ("hex", "base64")
_FIELDS = ("body", "timestamp", "id")
_MILLISECONDS_ABOVE = 10**12
_DEFAULT_TYPE = "test.event"  # example() and sign() agree when no type is given

# A compiled template: literal bytes, or the name of a field to insert.
_Segment = bytes | str


def _key(secret: Secret) -> bytes:
    return shared_key("hmac", secret)


def _compile(signed: str) -> tuple[_Segment, ...]:
    if signed == "body":
        return ("body",)
    segments: list[_Segment] = []
    try:
        parsed = list(Formatter().parse(signed))
    except ValueError:
        raise ConfigurationError(f"hmac source: signed template {signed!r} is malformed") from None
    for literal, field, spec, conversion in parsed:
        if literal:
            segments.append(literal.encode())
        if field is None:
            continue
        if field not in _FIELDS or spec or conversion:
            raise ConfigurationError(
                "hmac source: signed template may only use {body}, {timestamp} and {id} "
                f"(no format specs); got {{{field}}}"
            )
        segments.append(field)
    if segments.count("body") != 1:
        raise ConfigurationError("hmac source: signed template must contain {body} exactly once")
    return tuple(segments)


def _header_name(path: str | None) -> str | None:
    """The lower-cased header name of a ``header:Name`` path, else ``None``."""
    if path is not None and path.startswith("header:"):
        return path[len("header:") :].strip().lower()
    return None


def _put(document: dict[str, Any], path: str, value: Any) -> None:
    node = document
    *parents, last = path.split(".")
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[last] = value


class HmacSource(Source):
    """Any provider that signs with an HMAC over the body (and maybe a timestamp/id)."""

    provider = "hmac"

    def __init__(
        self,
        *,
        header: str,
        id_path: str,
        algorithm: str = "sha256",
        encoding: str = "hex",
        prefix: str = "",
        signed: str = "body",
        timestamp_header: str | None = None,
        type_path: str = "type",
        account_path: str | None = None,
        format: str = "json",
        secrets: Iterable[Secret | str] | Secret | str = (),
        **options: Any,
    ) -> None:
        super().__init__(secrets=secrets, **options)
        if format not in FORMATS:
            raise ConfigurationError(
                f"hmac source: format must be one of {', '.join(FORMATS)}, not {format!r}"
            )
        self.format = format
        for name, value in (
            ("header", header),
            ("id_path", id_path),
            ("type_path", type_path),
            ("algorithm", algorithm),
            ("encoding", encoding),
            ("signed", signed),
        ):
            if not isinstance(value, str) or not value.strip():
                raise ConfigurationError(f"hmac source: {name} must be a non-empty string")
        for name, optional in (
            ("prefix", prefix),
            ("timestamp_header", timestamp_header),
            ("account_path", account_path),
        ):
            if optional is not None and not isinstance(optional, str):
                raise ConfigurationError(f"hmac source: {name} must be a string")
        if algorithm not in _ALGORITHMS:
            raise ConfigurationError(
                f"hmac source: algorithm must be one of {', '.join(_ALGORITHMS)}, not {algorithm!r}"
            )
        if encoding not in _ENCODINGS:
            raise ConfigurationError(
                f"hmac source: encoding must be hex or base64, not {encoding!r}"
            )
        self.header = header.strip()
        self.algorithm = algorithm
        self.encoding = encoding
        self.prefix = prefix or ""
        self.signed = signed
        self.timestamp_header = (timestamp_header or "").strip() or None
        self.id_path = id_path.strip()
        self.type_path = type_path.strip()
        self.account_path = (account_path or "").strip() or None
        self._segments = _compile(signed)
        self._from_headers = frozenset(
            field
            for field, path in (
                ("event_id", self.id_path),
                ("event_type", self.type_path),
                ("account", self.account_path),
            )
            if _header_name(path) is not None
        )
        if "timestamp" in self._segments and self.timestamp_header is None:
            raise ConfigurationError("hmac source: {timestamp} in signed needs timestamp_header")
        if "id" in self._segments and _header_name(self.id_path) is None:
            raise ConfigurationError(
                "hmac source: {id} in signed needs id_path to be a header (header:Name)"
            )

    # -- signing primitives ---------------------------------------------------

    def _digest(self, key: bytes, body: bytes, timestamp: str, event_id: str) -> bytes:
        mac = hmac_new(key, digestmod=_ALGORITHMS[self.algorithm])
        for segment in self._segments:
            if isinstance(segment, bytes):
                mac.update(segment)
            elif segment == "body":
                mac.update(body)
            elif segment == "timestamp":
                mac.update(timestamp.encode())
            else:
                mac.update(event_id.encode())
        return mac.digest()

    def _encode(self, digest: bytes) -> str:
        if self.encoding == "hex":
            return self.prefix + digest.hex()
        return self.prefix + base64.b64encode(digest).decode()

    def _decode(self, value: str) -> bytes:
        try:
            if self.encoding == "hex":
                return bytes.fromhex(value)
            return base64.b64decode(value, validate=True)
        except (ValueError, binascii.Error):
            raise BadSignature(f"{self.header} header is not {self.encoding}") from None

    # -- Source hooks ---------------------------------------------------------

    def decode(self, headers: Headers, body: bytes) -> Any:
        if self.format == "json":
            return self.parse(body)
        return decode(self.format, headers, body, self.body_limits, parse_json=self.parse)

    def authenticate(
        self, headers: Headers, body: bytes, now: float, check_time: bool
    ) -> tuple[Secret, float | None]:
        raw = self.signature_header(headers, self.header.lower(), self.header)
        if not raw:
            raise BadSignature(f"missing {self.header} header", code="missing_signature")
        raw_timestamp = ""
        seconds: float | None = None
        if self.timestamp_header is not None:
            raw_timestamp = (headers.get(self.timestamp_header.lower()) or "").strip()
            value = parse_int_timestamp(raw_timestamp, self.timestamp_header)
            seconds = value / 1000 if value > _MILLISECONDS_ABOVE else float(value)
        event_id = ""
        id_header = _header_name(self.id_path)
        if "id" in self._segments and id_header is not None:
            event_id = (headers.get(id_header) or "").strip()
            if not event_id:
                raise MalformedHeaders(f"missing {self.id_path[len('header:') :].strip()} header")
        if not raw.startswith(self.prefix):
            raise BadSignature(f"{self.header} header must start with {self.prefix!r}")
        given = self._decode(raw[len(self.prefix) :])

        def matches(secret: Secret) -> bool:
            expected = self._digest(_key(secret), body, raw_timestamp, event_id)
            return compare_digest(expected, given)

        secret = self.try_secrets(matches)
        if check_time and seconds is not None:
            check_timestamp(seconds, now, self.tolerance)
        return secret, seconds

    def identify(self, headers: Headers, payload: Any) -> Identity:
        event_id = self._required(self.id_path, headers, payload, "event id", "missing_event_id")
        event_type = self._required(
            self.type_path, headers, payload, "event type", "missing_event_type"
        )
        account = None
        if self.account_path is not None:
            account = extract(self.account_path, headers, payload) or None
        return Identity(
            event_id=event_id,
            event_type=event_type,
            account=account,
            from_headers=self._from_headers,
        )

    def _required(self, path: str, headers: Headers, payload: Any, what: str, code: str) -> str:
        value = extract(path, headers, payload)
        if value is not None and value.strip():
            return value.strip()
        header = _header_name(path)
        if header is not None:
            raise MalformedHeaders(f"missing {path[len('header:') :].strip()} header")
        raise MalformedPayload(f"no {what} at {path!r} in the payload", code=code)

    def sign(
        self,
        body: bytes,
        *,
        event_id: str,
        event_type: str,
        now: float,
        secret: Secret | None = None,
    ) -> dict[str, str]:
        secret = secret or self.secrets[0]
        timestamp = str(int(now))
        headers = {
            self.header.lower(): self._encode(self._digest(_key(secret), body, timestamp, event_id))
        }
        if self.timestamp_header is not None:
            headers[self.timestamp_header.lower()] = timestamp
        if self.format == "form":
            headers["content-type"] = "application/x-www-form-urlencoded"
        # Whatever identity is read from headers has to be sent in headers.
        for path, value in (
            (self.id_path, event_id),
            (self.type_path, event_type or _DEFAULT_TYPE),
            (self.account_path, secret.account or self.account),
        ):
            name = _header_name(path)
            if name is not None and value:
                headers[name] = value
        return headers

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        document: dict[str, Any] = {"created": int(now)}
        account = self.account or "acct_example"
        for path, value in (
            (self.id_path, event_id),
            (self.type_path, event_type or _DEFAULT_TYPE),
            (self.account_path, account),
        ):
            if path is not None and _header_name(path) is None:
                _put(document, path, value)
        if self.format == "form":
            flat = {k: v for k, v in document.items() if not isinstance(v, dict)}
            return urlencode(flat).encode()
        if self.format in ("xml", "multipart"):
            raise ConfigurationError(
                f"hmac source: no example body for format {self.format!r}; send your own"
            )
        return json.dumps(document, separators=(",", ":")).encode()

    def describe(self) -> dict[str, Any]:
        described = super().describe()
        described.update(
            header=self.header,
            algorithm=self.algorithm,
            encoding=self.encoding,
            prefix=self.prefix,
            signed=self.signed,
            timestamp_header=self.timestamp_header,
            id_path=self.id_path,
            type_path=self.type_path,
            account_path=self.account_path,
            fingerprint_path=self.fingerprint_path,
            format=self.format,
        )
        return described


def hmac(
    *,
    secrets: Iterable[Secret | str] | Secret | str,
    header: str,
    id_path: str,
    algorithm: str = "sha256",
    encoding: str = "hex",
    prefix: str = "",
    signed: str = "body",
    timestamp_header: str | None = None,
    type_path: str = "type",
    account_path: str | None = None,
    format: str = "json",
    **options: Any,
) -> HmacSource:
    """A generic HMAC source (see the module docstring for every option).
    ``options`` are :class:`Source` arguments (``tolerance``, ``fingerprint_path``, ...)."""
    return HmacSource(
        secrets=secrets,
        header=header,
        id_path=id_path,
        algorithm=algorithm,
        encoding=encoding,
        prefix=prefix,
        signed=signed,
        timestamp_header=timestamp_header,
        type_path=type_path,
        account_path=account_path,
        format=format,
        **options,
    )
