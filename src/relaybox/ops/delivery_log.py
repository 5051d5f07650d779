"""What the sending pages show, for one tenant (the portal) or for any (the dashboard,
``tenant=None``): the delivery log with its filters, one message with its deliveries
and attempts (request and response), examples of event types."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from relaybox.outbound import deliveries
from relaybox.outbound.publish import matches

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = ["STATUSES", "LogFilter", "delivery_log", "example_for", "message_view", "subscribed"]

STATUSES = ("pending", "sent", "dead", "held")
"""A delivery's statuses, the choices of the log's status filter."""


@dataclass(frozen=True)
class LogFilter:
    """The delivery log's filters; an empty field does not filter."""

    status: str = ""
    event_type: str = ""
    message_id: str = ""
    idempotency_key: str = ""
    since: float | None = None
    until: float | None = None

    def query(self) -> dict[str, str]:
        return {k: v for k, v in asdict(self).items() if isinstance(v, str) and v}


async def delivery_log(
    box: Runtime, tenant: str | None, log: LogFilter, *, limit: int
) -> list[dict[str, Any]]:
    """Deliveries newest first, as the log's rows (an unknown status matches none)."""
    if log.status and log.status not in STATUSES:
        return []
    found = await box.store.outbox.delivery_search(
        tenant,
        status=log.status or None,
        event_type=log.event_type or None,
        message_id=log.message_id or None,
        idempotency_key=log.idempotency_key or None,
        since=log.since,
        until=log.until,
        limit=limit,
    )
    return [asdict(r) for r in found]


async def message_view(box: Runtime, message_id: str, tenant: str | None) -> dict[str, Any] | None:
    """The message (``None`` when ``tenant`` has no such message), its deliveries, and
    its attempts, each with the request sent (body, and headers where recorded) and the
    answer (status, headers where recorded, first bytes)."""
    message = await deliveries.get_message(box, message_id, tenant)
    if message is None:
        return None
    rows = await deliveries.list_deliveries(box, tenant, message_id=message.id)
    attempts = await deliveries.list_attempts(box, message.id, tenant)
    body = message.body.decode("utf-8", "replace")
    for attempt in attempts:
        attempt["request_body"] = body
        recorded = _headers(attempt.pop("headers", None))
        attempt["request_headers"] = recorded.get("request")
        attempt["response_headers"] = recorded.get("response")
    return {
        **message.to_json(),
        "tenant": message.tenant,
        "body": body,
        "deliveries": rows,
        "attempts": attempts,
    }


def _headers(found: Any) -> dict[str, list[tuple[str, str]]]:
    """The attempt's recorded headers, as (name, value) pairs per side."""
    if not isinstance(found, dict):
        return {}
    return {
        side: [(str(p[0]), str(p[1])) for p in pairs if isinstance(p, list) and len(p) == 2]
        for side, pairs in found.items()
        if side in ("request", "response") and isinstance(pairs, list)
    }


def subscribed(event_type: str, patterns: list[str]) -> bool:
    return matches(event_type, patterns)


def example_for(schema: dict[str, Any] | None) -> Any:
    """An example payload for an event type: the schema's first ``examples`` entry,
    else one made from its ``properties`` (types, ``enum``, ``const``, ``default``)."""
    if not schema:
        return {}
    return _example(schema, 0)


def _example(schema: Any, depth: int) -> Any:
    if not isinstance(schema, dict) or depth > 8:
        return None
    for key in ("examples", "enum"):
        if isinstance(schema.get(key), list) and schema[key]:
            return schema[key][0]
    for key in ("const", "default", "example"):
        if key in schema:
            return schema[key]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), None)
    if kind == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        return {name: _example(sub, depth + 1) for name, sub in props.items()}
    if kind == "array":
        return [_example(schema.get("items", {}), depth + 1)]
    simple = {"string": "string", "integer": 0, "number": 0.0, "boolean": True, "null": None}
    if isinstance(kind, str) and kind in simple:
        if kind == "string" and schema.get("format") == "date-time":
            return "2026-01-01T00:00:00Z"
        return simple[kind]
    for key in ("oneOf", "anyOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return _example(schema[key][0], depth + 1)
    return None


def pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
