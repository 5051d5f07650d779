"""Reading a request's body with a limit, strict JSON, and checking text that came
from outside.

:func:`read_body` refuses a body over its limit before reading it when the request
declares its length (``Content-Length``), and while streaming it otherwise (chunked),
so a client never makes a process hold more than ``limit`` bytes of its body. The
callers answer :class:`BodyTooLarge` with a 413 in their own format (JSON for the
APIs, a page for the dashboard). The rest of the body is never read: the server
closes the connection after the answer.

:func:`json_as_is` tells whether strings joined between JSON quotes are already
what JSON writes of them (the hot paths that write JSON by hand use it).

:func:`text_problem` finds what a database cannot store: NUL characters (PostgreSQL
text refuses them) and lone surrogates (not encodable as UTF-8, so no backend stores
them), anywhere in a decoded JSON value or a string.

JSON in and out is strict (RFC 8259), everywhere JSON enters or leaves relaybox:
:func:`parse_json` refuses ``NaN``, ``Infinity``, ``-Infinity`` and numbers beyond a
double's range (``1e999``), which Python's ``json`` reads as floats; :func:`write_json`
refuses non-finite floats, which ``json.dumps`` writes as those words. Neither is JSON:
a receiver's parser refuses the document, and a JSON answer that holds one cannot be
written (Starlette's ``JSONResponse`` raises). :func:`stored_json` reads what earlier
versions stored with them anyway, as ``null``.

:class:`JSONAnswer` and :class:`HTMLAnswer` write such text back out, where it can
still come from: a provider's payload is kept as the bytes it sent, and JSON may
escape a lone surrogate (``"\\ud800"``, valid JSON, not Unicode), which decoding it
for a page turns into a string no UTF-8 encoder takes. They write it escaped, as the
provider's JSON had it, rather than fail the answer.
"""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse

__all__ = [
    "BodyTooLarge",
    "HTMLAnswer",
    "JSONAnswer",
    "NotJsonNumber",
    "parse_json",
    "read_body",
    "stored_json",
    "text_problem",
    "write_json",
]


class BodyTooLarge(Exception):
    """The request body is (or declares to be) over ``limit`` bytes."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the request body is over {limit} bytes")
        self.limit = limit


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body of ``request``, or :class:`BodyTooLarge` as soon as it is known
    to exceed ``limit`` bytes (from ``Content-Length``, or while streaming)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        raise BodyTooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


class NotJsonNumber(ValueError):
    """``NaN``, ``Infinity``, ``-Infinity`` or a number beyond a double's range: not a
    JSON number (RFC 8259 section 6), though Python's ``json`` reads and writes them."""


def _constant(name: str) -> Any:
    raise NotJsonNumber(f"{name} is not a JSON number (JSON has no NaN or Infinity)")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NotJsonNumber(f"{text[:40]} is beyond the range of a JSON number (a double)")
    return value


def parse_json(raw: str | bytes) -> Any:
    """``json.loads`` of JSON as RFC 8259 has it: :class:`NotJsonNumber` (a
    ``ValueError``, as for any text that is not JSON) for ``NaN``, ``Infinity``,
    ``-Infinity`` and numbers a double cannot hold (``1e999``); ``RecursionError`` for
    a document too deep for the parser."""
    return json.loads(raw, parse_constant=_constant, parse_float=_finite)


_PLAIN = json.JSONEncoder(allow_nan=False)
"""``json.dumps``'s default encoder, strict: made once, as ``json.dumps`` keeps its own
(a call with options makes one each time)."""


def write_json(value: Any, **options: Any) -> str:
    """``json.dumps(value, **options)`` that refuses a float NaN or infinity with
    :class:`NotJsonNumber` instead of writing a document no JSON parser reads."""
    try:
        if not options:
            return _PLAIN.encode(value)
        return json.dumps(value, allow_nan=False, **options)
    except ValueError as exc:
        if str(exc).startswith("Out of range float values"):
            raise NotJsonNumber("NaN and Infinity are not JSON numbers") from None
        raise


def _as_null(_: str) -> None:
    return None


_STORED = json.JSONDecoder(parse_constant=_as_null)


def stored_json(text: str) -> Any:
    """JSON text relaybox wrote itself: earlier versions wrote a float NaN or infinity
    of published data as ``NaN`` / ``Infinity`` (not JSON), read here as ``null``, as
    JavaScript's ``JSON.stringify`` writes them, so that such a message can still be
    listed and shown. Costs nothing where there is none (one decoder, made once)."""
    return _STORED.decode(text)


def _string_problem(text: str, *, nul: bool) -> str | None:
    if nul and "\x00" in text:
        return "contains a NUL character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (not valid Unicode: escape it or drop it)"
    return None


def text_problem(
    value: Any, where: str = "body", *, nul: bool = True, nul_ok_under: frozenset[str] = frozenset()
) -> str | None:
    """``"<where>: <problem>"`` for the first string (key or value) in ``value`` that
    cannot be stored, or ``None``. ``nul=False`` allows NUL (a JSON value serialised
    again escapes it); top-level keys in ``nul_ok_under`` hold such values. The walk
    is iterative: a deeply nested document cannot exhaust the stack."""
    stack: list[tuple[Any, str, bool]] = [(value, where, nul)]
    top = True
    while stack:
        item, path, strict = stack.pop()
        if isinstance(item, str):
            problem = _string_problem(item, nul=strict)
            if problem:
                return f"{path}: {problem}"
        elif isinstance(item, dict):
            for key, child in item.items():
                key_text = str(key)
                problem = _string_problem(key_text, nul=strict)
                if problem:
                    return f"{path}: a key {problem}"
                child_strict = strict and not (top and key_text in nul_ok_under)
                stack.append((child, f"{path}.{key_text[:40]}", child_strict))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{i}]", strict) for i, child in enumerate(item))
        top = False
    return None


# What JSON writes escaped in an ASCII string (json.dumps escapes DEL too).
_JSON_ESCAPED = bytes(range(0x20)) + b'"\\\x7f'


def json_as_is(text: str, quotes: int) -> bool:
    """Whether ``text``, strings joined between ``quotes`` JSON quote marks, is what
    JSON writes of them: ASCII, and no byte that JSON escapes but those quotes. One
    pass in C: deleting every such byte leaves all but the quotes only when no string
    holds one."""
    if not text.isascii():
        return False
    raw = text.encode()
    return len(raw.translate(None, _JSON_ESCAPED)) == len(raw) - quotes


class JSONAnswer(JSONResponse):
    """starlette's :class:`JSONResponse`, with a lone surrogate in ``content`` written
    as its JSON escape (``\\ud800``: a JSON reader gets back the same string)
    instead of an encoding error."""

    def render(self, content: Any) -> bytes:
        text = json.dumps(
            content, ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":")
        )
        return text.encode("utf-8", "backslashreplace")


class HTMLAnswer(HTMLResponse):
    """starlette's :class:`HTMLResponse`, with a lone surrogate in the page shown as
    its escape (``\\ud800``) instead of an encoding error."""

    def render(self, content: Any) -> bytes:
        if isinstance(content, str):
            return content.encode("utf-8", "backslashreplace")
        return bytes(super().render(content))
