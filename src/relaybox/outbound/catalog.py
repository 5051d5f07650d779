"""The event-type catalog: the types an application publishes, with JSON Schemas.

The application (not each tenant) owns its event types, so the catalog is one list
that every tenant reads (``GET /api/v1/event-types``) and subscribes from. A type with
a schema is checked on publish: a producer bug is refused in the producer's own
transaction instead of reaching every customer's endpoint.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jsonschema

from relaybox.errors import RelayboxError
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
    """A message relaybox refuses to publish; ``code`` says why (``event_type``,
    ``schema``, ``too_large``, ``idempotency_key``, ``tenant``, ``data``)."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class EventType:
    name: str
    description: str
    schema: dict[str, Any] | None

    def to_json(self) -> dict[str, Any]:
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
    box: Runtime, name: str, *, description: str = "", schema: dict[str, Any] | None = None
) -> EventType:
    """Add or replace a catalog entry. The schema itself is checked first."""
    check_event_type_name(name)
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
    await box.store.event_type_upsert(name, description, text, now=box.clock.now())
    return EventType(name, description, schema)


async def list_event_types(box: Runtime) -> list[EventType]:
    return [
        EventType(r.name, r.description, json.loads(r.schema) if r.schema else None)
        for r in await box.store.event_type_list()
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
