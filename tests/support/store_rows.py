"""Rows the store conformance tests write."""

from __future__ import annotations

from relaybox.store.outbox_rows import EndpointWrite


def endpoint_write(eid: str, tenant: str = "t1", **fields: object) -> EndpointWrite:
    """An endpoint ``eid`` of ``tenant`` subscribed to every event type, 4 in flight;
    ``fields`` override any column."""
    values: dict[str, object] = {
        "id": eid,
        "tenant": tenant,
        "url": f"https://example.com/{eid}",
        "description": "",
        "event_types": ["*"],
        "signature": "standard",
        "timeout": None,
        "schedule": None,
        "max_in_flight": 4,
        "rate_limit": None,
    }
    values.update(fields)
    return EndpointWrite(**values)  # type: ignore[arg-type]
