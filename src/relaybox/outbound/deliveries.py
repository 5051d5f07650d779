"""Reading and repairing deliveries: messages, attempts, undelivered rows, redeliver
one message, recover an endpoint's failures since a time.

A redelivery reuses the row (and so the ``webhook-id``): a receiver that already
processed the message recognises it; one that missed it processes it now.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import structlog

from relaybox.outbound.endpoints import get_endpoint
from relaybox.outbound.registry import outbound
from relaybox.store.outbox_rows import Message

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = [
    "get_message",
    "list_attempts",
    "list_deliveries",
    "list_messages",
    "recover",
    "redeliver",
]

log = structlog.get_logger("relaybox.outbound")


async def get_message(box: Runtime, message_id: str, tenant: str | None) -> Message | None:
    return await box.store.outbox.message_get(message_id, tenant)


async def list_messages(
    box: Runtime,
    tenant: str | None,
    *,
    event_type: str | None = None,
    before: tuple[float, str] | None = None,
    limit: int = 50,
    idempotency_key: str | None = None,
) -> list[Message]:
    """Newest first; ``before`` is the ``(created_at, id)`` of the last one seen;
    ``idempotency_key`` finds the message published with exactly that key."""
    return await box.store.outbox.message_list(
        tenant, event_type=event_type, before=before, limit=limit, idempotency_key=idempotency_key
    )


async def list_deliveries(
    box: Runtime,
    tenant: str | None,
    *,
    message_id: str | None = None,
    endpoint_id: str | None = None,
    undelivered: bool = False,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Outbox rows (webhook deliveries and channel rows), newest first. With
    ``undelivered``: only rows not sent — pending, dead or held — with the reason.

    Each row names its way out: ``channel`` is the channel that delivers it (an
    endpoint's deliveries: ``webhook``, or the destination's name for an endpoint
    routed to ``broker:<name>``), ``kind`` what that channel is (``webhook``,
    ``rabbitmq``, ``nats``, ``redis``, ``email``, ``http``, ``custom``; ``None``: a
    channel this process does not have)."""
    found = await box.store.outbox.delivery_list(
        tenant,
        message_id=message_id,
        endpoint_id=endpoint_id,
        undelivered=undelivered,
        limit=limit,
    )
    ob = outbound(box)
    rows = []
    for r in found:
        row = asdict(r)
        name = row.pop("broker")
        if name is not None:  # the endpoint's current destination
            row["channel"] = name
            broker = ob.settings.brokers.get(name)
            row["kind"] = broker.kind if broker is not None else None
        else:
            channel = ob.channels.get(r.channel) if r.channel is not None else None
            row["kind"] = channel.kind if channel is not None else None
        rows.append(row)
    return rows


async def list_attempts(box: Runtime, message_id: str, tenant: str | None) -> list[dict[str, Any]]:
    """The message's attempts; ``headers`` is ``{"request": [[name, value], …],
    "response": […]}`` where the channel recorded them (HTTP), else ``None``."""
    found = []
    for r in await box.store.outbox.attempt_list(message_id, tenant):
        row = asdict(r)
        row["headers"] = json.loads(r.headers) if r.headers else None
        found.append(row)
    return found


async def redeliver(
    box: Runtime, message_id: str, *, tenant: str | None, endpoint_id: str | None = None
) -> int:
    """Send a message again to every endpoint (or ``endpoint_id``) whose delivery has
    finished — sent, dead or held — with a fresh attempt budget. Returns how many."""
    count = await box.store.outbox.delivery_redeliver(
        message_id, tenant=tenant, endpoint_id=endpoint_id, now=box.clock.now()
    )
    log.info("message_redelivered", message_id=message_id, deliveries=count)
    return count


async def recover(
    box: Runtime,
    endpoint_id: str,
    *,
    since: float,
    until: float | None = None,
    tenant: str | None,
) -> int | None:
    """Retry every dead delivery of an endpoint created in ``[since, until)``, e.g.
    after the endpoint was fixed and enabled again. ``None``: no such endpoint."""
    if await get_endpoint(box, endpoint_id, tenant) is None:
        return None
    count = await box.store.outbox.delivery_recover(
        endpoint_id, since=since, until=until, now=box.clock.now()
    )
    log.info("endpoint_recovered", endpoint_id=endpoint_id, since=since, deliveries=count)
    return count
