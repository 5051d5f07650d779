"""Bodies that aren't JSON: form-encoded, multipart/form-data and XML, decoded to a dict.

The raw bytes stay what is stored and fingerprinted; these functions only build the
``payload`` a handler sees. Every count and depth that comes from the sender is
bounded by :class:`BodyLimits` (``[receiver_bodies]`` in the settings), and a body
that does not decode is a :class:`~relaybox.errors.MalformedPayload` (400) for its
own request.

Shapes:

* form (``application/x-www-form-urlencoded``): ``{name: value}``; a name sent more
  than once maps to the list of its values, in order;
* multipart (``multipart/form-data``): the same, and a file part becomes
  ``{"filename", "content_type", "size", "content": bytes}``;
* XML: ``{root_tag: element}``, where an element with neither attributes nor
  children is its text, and otherwise a dict of ``"@attribute"`` keys, child tags
  (repeated tags: a list) and ``"#text"``. Documents with a DOCTYPE (and so any
  entity declaration) are refused: no entity expansion, no external entities.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from email.message import Message
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any
from urllib.parse import parse_qsl
from xml.etree.ElementTree import Element, ParseError, XMLParser

from relaybox.errors import MalformedPayload

__all__ = [
    "DEFAULT_LIMITS",
    "FORMATS",
    "BodyLimits",
    "content_type",
    "decode",
    "decode_form",
    "decode_multipart",
    "decode_xml",
    "parse_query",
]

FORMATS = ("json", "form", "multipart", "xml", "auto")


@dataclass(frozen=True)
class BodyLimits:
    """Bounds on what a non-JSON body may contain."""

    max_fields: int = 1000
    """form fields, multipart parts and query parameters per request"""
    max_xml_depth: int = 64
    """nesting depth of an XML document"""
    max_xml_elements: int = 100_000
    """elements in an XML document"""


DEFAULT_LIMITS = BodyLimits()


def content_type(headers: Any) -> tuple[str, dict[str, str]]:
    """The media type (lower case) and its parameters from a ``content-type`` header."""
    raw = headers.get("content-type") or ""
    message = Message()
    message["content-type"] = raw
    media = message.get_content_type() if raw else ""
    params = {k.lower(): v for k, v in message.get_params(failobj=[])[1:]}
    return media, params


def _add(fields: dict[str, Any], name: str, value: Any) -> None:
    if name in fields:
        current = fields[name]
        if isinstance(current, list):
            current.append(value)
        else:
            fields[name] = [current, value]
    else:
        fields[name] = value


def parse_query(query: str | bytes, limits: BodyLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    """A query string or form body as a dict (see the module docstring)."""
    if isinstance(query, bytes):
        try:
            query = query.decode("utf-8")
        except UnicodeDecodeError:
            raise MalformedPayload("form data is not UTF-8", code="malformed_form") from None
    try:
        pairs = parse_qsl(
            query, keep_blank_values=True, max_num_fields=limits.max_fields, errors="strict"
        )
    except ValueError as exc:
        # parse_qsl raises ValueError for too many fields and for undecodable escapes.
        if "Max number of fields" in str(exc):
            raise MalformedPayload(
                f"more than {limits.max_fields} form fields", code="too_many_fields"
            ) from None
        raise MalformedPayload("form data is not valid", code="malformed_form") from None
    fields: dict[str, Any] = {}
    for name, value in pairs:
        _add(fields, name, value)
    return fields


def decode_form(body: bytes, limits: BodyLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    """An ``application/x-www-form-urlencoded`` body."""
    return parse_query(body, limits)


def decode_multipart(
    body: bytes, boundary: str | None, limits: BodyLimits = DEFAULT_LIMITS
) -> dict[str, Any]:
    """A ``multipart/form-data`` body with its ``boundary`` (from the content type)."""
    if not boundary or len(boundary) > 200 or any(c in boundary for c in '\r\n"'):
        raise MalformedPayload("multipart body without a valid boundary", code="malformed_form")
    if body.count(b"--" + boundary.encode("latin-1")) > limits.max_fields + 1:
        raise MalformedPayload(f"more than {limits.max_fields} parts", code="too_many_fields")
    head = f'Content-Type: multipart/form-data; boundary="{boundary}"\r\n\r\n'.encode("latin-1")
    message = BytesParser(policy=HTTP).parsebytes(head + body)
    if not message.is_multipart() or message.defects:
        raise MalformedPayload("multipart body is not valid", code="malformed_form")
    fields: dict[str, Any] = {}
    for part in message.iter_parts():
        disposition = part.get("content-disposition")
        name = part.get_param("name", header="content-disposition") if disposition else None
        if not isinstance(name, str):
            raise MalformedPayload("multipart part without a name", code="malformed_form")
        raw = part.get_payload(decode=True)
        content = raw if isinstance(raw, bytes) else b""
        filename = part.get_filename()
        if filename is not None:
            value: Any = {
                "filename": filename,
                "content_type": part.get_content_type(),
                "size": len(content),
                "content": content,
            }
        else:
            charset = part.get_content_charset() or "utf-8"
            try:
                value = content.decode(charset)
            except (LookupError, UnicodeDecodeError):
                raise MalformedPayload(
                    f"multipart field {name!r} is not {charset} text", code="malformed_form"
                ) from None
        _add(fields, name, value)
    return fields


def _element(node: Element, depth: int, limits: BodyLimits) -> Any:
    if depth > limits.max_xml_depth:
        raise MalformedPayload(f"XML is nested deeper than {limits.max_xml_depth}", code="too_deep")
    children = list(node)
    text = (node.text or "").strip()
    if not children and not node.attrib:
        return text
    value: dict[str, Any] = {f"@{k}": v for k, v in node.attrib.items()}
    for child in children:
        _add(value, child.tag, _element(child, depth + 1, limits))
    if text:
        value["#text"] = text
    return value


def decode_xml(body: bytes, limits: BodyLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    """An XML document (``application/xml``, ``text/xml``)."""
    if b"<!DOCTYPE" in body.upper() or b"<!ENTITY" in body.upper():
        raise MalformedPayload("XML with a DOCTYPE or entities is refused", code="malformed_xml")
    parser = XMLParser()
    try:
        parser.feed(body)
        root = parser.close()
    except ParseError:
        raise MalformedPayload("body is not valid XML", code="malformed_xml") from None
    count = sum(1 for _ in root.iter())
    if count > limits.max_xml_elements:
        raise MalformedPayload(
            f"XML has more than {limits.max_xml_elements} elements", code="too_many_fields"
        )
    return {root.tag: _element(root, 1, limits)}


def decode(
    fmt: str,
    headers: Any,
    body: bytes,
    limits: BodyLimits = DEFAULT_LIMITS,
    *,
    parse_json: Callable[[bytes], Any],
) -> Any:
    """Decode ``body`` as ``fmt`` (one of :data:`FORMATS`; ``auto`` follows the
    request's ``content-type``, JSON when it names none of the others). JSON goes to
    ``parse_json`` (the source's own parser, with its limits)."""
    media, params = content_type(headers)
    if fmt == "auto":
        if media == "application/x-www-form-urlencoded":
            fmt = "form"
        elif media == "multipart/form-data":
            fmt = "multipart"
        elif media in ("application/xml", "text/xml") or media.endswith("+xml"):
            fmt = "xml"
        else:
            fmt = "json"
    if fmt == "form":
        return decode_form(body, limits)
    if fmt == "multipart":
        return decode_multipart(body, params.get("boundary"), limits)
    if fmt == "xml":
        return decode_xml(body, limits)
    return parse_json(body)
