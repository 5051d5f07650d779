"""Rows the store conformance tests write."""

from __future__ import annotations

from typing import Any

from relaybox.store.dispatch_rows import Attempt, Decision, Outcome, Result
from relaybox.store.outbox_rows import Delivery, EndpointWrite


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


def attempt(
    d: Delivery,
    status: str = "sent",
    *,
    label: str | None = None,
    code: int | None = 200,
    error: str | None = None,
    response: str | None = None,
    headers: str | None = None,
    next_at: float | None = None,
    reason: str | None = None,
    started: float = 0.0,
    duration: float = 0.1,
    dispatcher: str | None = "d1",
) -> Attempt:
    """``d``'s attempt as the dispatcher records it: the row becomes ``status``
    (``pending``: retried at ``next_at``; ``dead`` / ``held`` with ``reason``), the
    attempt log's outcome is ``label`` (the status's usual one by default), and the
    channel answered ``code``, ``error``, ``response`` and ``headers``."""
    decision_status = "retry" if status == "pending" else status
    if label is None:
        label = {"pending": "retry", "dead": "failed"}.get(status, status)
    outcome: Outcome = "sent" if status == "sent" else "retry"
    result = Result(outcome, code, error, response, headers=headers)
    decision = Decision(decision_status, label, reason, next_at)
    return Attempt(d, result, decision, dispatcher, started, duration)


def logged(
    outbox_id: int, number: int, label: str, *, lease_token: int | None = None, **fields: Any
) -> Attempt:
    """An attempt of row ``outbox_id`` (its ``number``-th, under lease token
    ``lease_token``, by default the same) for the attempt log alone
    (``DispatchStore.outbox_attempts_insert``); ``fields`` as :func:`attempt`'s."""
    token = number if lease_token is None else lease_token
    d = Delivery(outbox_id, "webhook", "k", None, None, number, token, False, 30.0)
    return attempt(d, label=label, **fields)
