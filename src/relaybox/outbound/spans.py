"""What a delivery attempt's span says (``relaybox.deliver``, :mod:`relaybox.tracing`):
the attempt's ids, channel and number when it starts, the dispatcher's decision when
it ends. No payload, no URL, no secret."""

from __future__ import annotations

from relaybox.store.dispatch_rows import Decision, Result
from relaybox.store.outbox_rows import Delivery

__all__ = ["decision_attributes", "delivery_attributes"]


def delivery_attributes(d: Delivery) -> dict[str, str | int | bool]:
    """The attributes of an attempt's ``relaybox.deliver`` span (ids, the channel, the
    attempt's number: no payload, no URL, no secret)."""
    attributes: dict[str, str | int | bool] = {
        "relaybox.outbox_id": d.id,
        "relaybox.channel": d.channel,
        "relaybox.attempt": d.attempt,
        "relaybox.uncertain": d.uncertain,
    }
    if d.message is not None:
        attributes["relaybox.message_id"] = d.message.id
        attributes["relaybox.event_type"] = d.message.event_type
    if d.endpoint is not None:
        attributes["relaybox.endpoint_id"] = d.endpoint.id
        attributes["relaybox.tenant"] = d.endpoint.tenant
    return attributes


def decision_attributes(
    decision: Decision, result: Result | None, now: float
) -> dict[str, str | float | int]:
    """The decision on an attempt, for its span: what the row becomes, why, and the
    retry's delay in seconds."""
    attributes: dict[str, str | float | int] = {"relaybox.decision": decision.status}
    if decision.reason is not None:
        attributes["relaybox.decision.reason"] = decision.reason
    if decision.at is not None and decision.status == "retry":
        attributes["relaybox.retry.delay"] = round(max(decision.at - now, 0.0), 3)
    if result is not None and result.status_code is not None:
        attributes["http.response.status_code"] = result.status_code
    return attributes
