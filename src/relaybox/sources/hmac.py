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

import json
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlencode

from relaybox.errors import ConfigurationError
from relaybox.sources.base import Headers, Secret
from relaybox.sources.bodies import FORMATS, decode
from relaybox.sources.scheme import Hmac, Sample, Scheme, SchemeSource, factory
from relaybox.sources.specs import compile_template, header_name, put

__all__ = ["HmacSource", "hmac"]

_ALGORITHMS = ("sha256", "sha512")
_ENCODINGS = ("hex", "base64")
_FIELDS = ("body", "timestamp", "id")
_DEFAULT_TYPE = "test.event"  # example() and sign() agree when no type is given


class HmacSource(SchemeSource):
    """Any provider that signs with an HMAC over the body (and maybe a timestamp/id):
    a :class:`~relaybox.sources.scheme.Scheme` made from configuration."""

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
        if format not in FORMATS:
            raise ConfigurationError(
                f"hmac source: format must be one of {', '.join(FORMATS)}, not {format!r}"
            )
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
        self.format = format
        self.header = header.strip()
        self.algorithm = algorithm
        self.encoding = encoding
        self.prefix = prefix or ""
        self.signed = signed
        self.timestamp_header = (timestamp_header or "").strip() or None
        self.id_path = id_path.strip()
        self.type_path = type_path.strip()
        self.account_path = (account_path or "").strip() or None
        segments = compile_template(signed, _FIELDS, "hmac source: signed template")
        if "timestamp" in segments and self.timestamp_header is None:
            raise ConfigurationError("hmac source: {timestamp} in signed needs timestamp_header")
        if "id" in segments and header_name(self.id_path) is None:
            raise ConfigurationError(
                "hmac source: {id} in signed needs id_path to be a header (header:Name)"
            )
        timestamp = f"header:{self.timestamp_header}" if self.timestamp_header else None
        self.scheme = Scheme(
            Hmac(
                self.header,
                signed,
                digest=algorithm,
                encoding=encoding,
                prefix=self.prefix,
                timestamp=timestamp,
                unit="auto",
            ),
            event_id=self.id_path,
            event_type=self.type_path,
            account=self.account_path,
            sample=Sample(
                type=_DEFAULT_TYPE,
                content_type="application/x-www-form-urlencoded" if format == "form" else None,
            ),
        )
        super().__init__(secrets=secrets, **options)

    def decode(self, headers: Headers, body: bytes) -> Any:
        if self.format == "json":
            return self.parse(body)
        return decode(self.format, headers, body, self.body_limits, parse_json=self.parse)

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        document: dict[str, Any] = {"created": int(now)}
        account = self.account or "acct_example"
        for path, value in (
            (self.id_path, event_id),
            (self.type_path, event_type or _DEFAULT_TYPE),
            (self.account_path, account),
        ):
            if path is not None and header_name(path) is None:
                put(document, path, value)
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


hmac = factory(
    HmacSource,
    """A generic HMAC source (see the module docstring for every option).
    ``options`` are :class:`Source` arguments (``tolerance``, ``fingerprint_path``, ...).""",
)
