"""The event-type catalog: the types an application publishes, with JSON Schemas.

The application (not each tenant) owns its event types, so the catalog is one list
that every tenant reads (``GET /api/v1/event-types``) and subscribes from. A type with
a schema is checked on publish: a producer bug is refused in the producer's own
transaction instead of reaching every customer's endpoint. A type with a subject path
(``data.customer.id``) has each message indexed under the subject found there, so that
``relaybox erase --subject`` finds it without every publish passing ``subject=``.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jsonschema

from relaybox.errors import ConfigurationError, RelayboxError
from relaybox.sources.base import check_subject_path, text_problem
from relaybox.wire import write_json

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = [
    "EventType",
    "InvalidMessage",
    "check_event_type_name",
    "check_schema",
    "define_event_type",
    "list_event_types",
]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}")


class InvalidMessage(RelayboxError):
    """A message relaybox refuses to publish (or an event type it refuses to define);
    ``code`` says why (``event_type``, ``schema``, ``subject_path``, ``too_large``,
    ``idempotency_key``, ``tenant``, ``data``, ``subject``, ``ordering_key``)."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class EventType:
    name: str
    description: str
    schema: dict[str, Any] | None
    subject: str | None = None
    """Where its messages name their subject (a dotted path into the envelope:
    ``data.customer.id``), or ``None``."""

    def to_json(self) -> dict[str, Any]:
        """What tenants read of it (the subject path is the operator's own)."""
        return {"name": self.name, "description": self.description, "schema": self.schema}


def check_event_type_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidMessage(
            "an event type is 1-200 characters of letters, digits and . _ : -",
            code="event_type",
        )
    return name


@functools.lru_cache(maxsize=256)
def _validator(schema_text: str) -> Any:
    schema = json.loads(schema_text)
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema)


async def define_event_type(
    box: Runtime,
    name: str,
    *,
    description: str = "",
    schema: dict[str, Any] | None = None,
    subject: str | None = None,
) -> EventType:
    """Add or replace a catalog entry. The schema itself is checked first, and the
    subject path against its grammar and the ``[erasure]`` bounds (``path_max_depth``
    names, ``path_max_chars`` characters): :class:`InvalidMessage` (``schema``,
    ``subject_path``)."""
    check_event_type_name(name)
    if subject is not None:
        check_subject_path_of(box, subject)
    text = None
    if schema is not None:
        cls = jsonschema.validators.validator_for(schema)
        try:
            cls.check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise InvalidMessage(f"not a valid JSON Schema: {exc.message}", code="schema") from None
        try:
            text = write_json(schema, sort_keys=True)
        except ValueError as exc:  # NaN or Infinity in it: no tenant could read it
            raise InvalidMessage(f"not a valid JSON Schema: {exc}", code="schema") from None
    await box.store.catalog.event_type_upsert(
        name, description, text, now=box.clock.now(), subject=subject
    )
    return EventType(name, description, schema, subject)


def check_subject_path_of(box: Runtime, path: str) -> None:
    """:class:`InvalidMessage` (``subject_path``) for a path an event type may not
    declare: not a dotted JSON path (``data.customer.id``), a header, or past the
    ``[erasure]`` bounds."""
    bounds = box.settings.erasure
    if not isinstance(path, str):
        raise InvalidMessage("a subject path is text (data.customer.id)", code="subject_path")
    try:
        check_subject_path(path, max_depth=bounds.path_max_depth, max_chars=bounds.path_max_chars)
    except ConfigurationError as exc:
        raise InvalidMessage(str(exc), code="subject_path") from None
    if text_problem(path, bounds.path_max_chars):
        raise InvalidMessage("a subject path is printable text", code="subject_path")


async def list_event_types(box: Runtime) -> list[EventType]:
    return [
        EventType(r.name, r.description, json.loads(r.schema) if r.schema else None, r.subject)
        for r in await box.store.catalog.event_type_list()
    ]


def check_schema(schema: str | None, event_type: str, data: Any) -> None:
    """Raise :class:`InvalidMessage` when ``data`` does not match ``schema`` (the
    catalog's JSON text for ``event_type``; ``None``: nothing to check)."""
    if schema is None:
        return
    error = jsonschema.exceptions.best_match(_validator(schema).iter_errors(data))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(root)"
        raise InvalidMessage(
            f"data does not match the schema of {event_type} at {where}: {error.message}",
            code="schema",
        )
