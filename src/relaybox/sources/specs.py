"""Where a provider's values live, and the template of what it signs.

A :data:`Spec` is a path read by :func:`~relaybox.sources.base.extract` (``"id"``,
``"data.order.id"``, ``"header:X-Event-Id"``); a template joining several
(``"{meta.event_name}:{data.id}:{data.updated_at?}"``, ``?`` for a part that may be
missing); a :class:`Digest` (``"sha256:" + hex`` of the canonical JSON, for a
provider that sends no id); or a tuple of these, the first found winning.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from string import Formatter
from typing import Any

from relaybox.errors import ConfigurationError, MalformedHeaders, MalformedPayload
from relaybox.sources.base import Headers, extract
from relaybox.sources.kit import derived_id

__all__ = [
    "Digest",
    "Spec",
    "alternatives",
    "compile_template",
    "extract_value",
    "header_name",
    "json_document",
    "missing",
    "put",
    "read",
]

_FIELD = re.compile(r"\{([^{}]+)\}")


@dataclass(frozen=True)
class Digest:
    """An id derived from content: ``"sha256:" + hex`` of the canonical JSON of the
    payload, or of its top-level ``keys`` (a missing key counts as ``null``)."""

    keys: tuple[str, ...] = ()

    def read(self, payload: Any) -> str | None:
        if not self.keys:
            return derived_id(payload)
        if not isinstance(payload, Mapping):
            return None
        return derived_id({k: payload.get(k) for k in self.keys})


Spec = str | Digest | tuple[str | Digest, ...]
"""Where a value lives: a path, a template, a :class:`Digest`, or alternatives."""


Segment = bytes | str


def compile_template(
    signed: str, fields: Iterable[str], what: str = "signed template"
) -> tuple[Segment, ...]:
    """``signed`` split into literal bytes and field names, ``{body}`` exactly once."""
    allowed = tuple(fields)
    if signed in ("body", "{body}"):
        return ("body",)
    segments: list[Segment] = []
    try:
        parsed = list(Formatter().parse(signed))
    except ValueError:
        raise ConfigurationError(f"{what} {signed!r} is malformed") from None
    for literal, field, spec, conversion in parsed:
        if literal:
            segments.append(literal.encode())
        if field is None:
            continue
        if field not in allowed or spec or conversion:
            names = ", ".join("{" + f + "}" for f in allowed)
            raise ConfigurationError(
                f"{what} may only use {names} (no format specs); got {{{field}}}"
            )
        segments.append(field)
    if segments.count("body") != 1:
        raise ConfigurationError(f"{what} must contain {{body}} exactly once")
    return tuple(segments)


def header_name(path: str | None) -> str | None:
    """The lower-cased header name of a ``header:Name`` path, else ``None``."""
    if path is not None and path.startswith("header:"):
        return path[len("header:") :].strip().lower()
    return None


def alternatives(spec: Spec) -> tuple[str | Digest, ...]:
    return spec if isinstance(spec, tuple) else (spec,)


def _read_one(spec: str | Digest, headers: Headers, payload: Any) -> str | None:
    if isinstance(spec, Digest):
        return spec.read(payload)
    if "{" not in spec:
        value = extract(spec, headers, payload)
        value = value.strip() if value is not None else None
        return value or None
    parts: list[str] = []
    position = 0
    for match in _FIELD.finditer(spec):
        parts.append(spec[position : match.start()])
        path = match.group(1)
        optional = path.endswith("?")
        value = extract(path.rstrip("?"), headers, payload)
        value = value.strip() if value is not None else ""
        if not value and not optional:
            return None
        parts.append(value)
        position = match.end()
    parts.append(spec[position:])
    return "".join(parts)


def read(spec: Spec, headers: Headers, payload: Any) -> tuple[str | None, bool]:
    """The first value ``spec`` finds, and whether it came from a header alone."""
    for alternative in alternatives(spec):
        value = _read_one(alternative, headers, payload)
        if value is not None:
            from_header = isinstance(alternative, str) and header_name(alternative) is not None
            return value, from_header
    return None, False


def missing(spec: Spec, what: str, code: str) -> Exception:
    first = alternatives(spec)[0]
    if isinstance(first, str) and (name := header_name(first)) is not None:
        return MalformedHeaders(f"missing {first[len('header:') :].strip() or name} header")
    where = f" at {first!r}" if isinstance(first, str) else ""
    return MalformedPayload(f"no {what}{where} in the payload", code=code)


def json_document(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def put(document: dict[str, Any], path: str, value: Any) -> None:
    node = document
    *parents, last = path.split(".")
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[last] = value


def extract_value(payload: Any, path: str) -> Any:
    """The JSON value at a dotted ``path`` (objects only), or ``None``."""
    node = payload
    for part in path.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node
