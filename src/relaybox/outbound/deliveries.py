"""Reading and repairing deliveries: messages, attempts, undelivered rows, redeliver
one message, recover an endpoint's failures since a time.

A redelivery reuses the row (and so the ``webhook-id``): a receiver that already
processed the message recognises it; one that missed it processes it now.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog

from relaybox.outbound import db
from relaybox.outbound.endpoints import get_endpoint
from relaybox.outbound.publish import Message

if TYPE_CHECKING:
    from relaybox.app import Relaybox

__all__ = [
    "get_message",
    "list_attempts",
    "list_deliveries",
    "list_messages",
    "recover",
    "redeliver",
]

log = structlog.get_logger("relaybox.outbound")


async def get_message(box: Relaybox, message_id: str, tenant: str | None) -> Message | None:
    store = box.store
    async with store.transaction() as conn:
        row = await db.first(conn, store, "message_get", message_id, tenant)
    return Message.from_row(row) if row else None


async def list_messages(
    box: Relaybox,
    tenant: str | None,
    *,
    event_type: str | None = None,
    before: tuple[float, str] | None = None,
    limit: int = 50,
) -> list[Message]:
    """Newest first; ``before`` is the ``(created_at, id)`` of the last one seen."""
    store = box.store
    after_time, after_id = before if before else (None, None)
    async with store.transaction() as conn:
        found = await db.rows(
            conn, store, "message_list", tenant, event_type, after_time, after_id, limit
        )
    return [Message.from_row(r) for r in found]


async def list_deliveries(
    box: Relaybox,
    tenant: str | None,
    *,
    message_id: str | None = None,
    endpoint_id: str | None = None,
    undelivered: bool = False,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Outbox rows (webhook deliveries and channel rows), newest first. With
    ``undelivered``: only rows not sent — pending, dead or held — with the reason."""
    store = box.store
    async with store.transaction() as conn:
        found = await db.rows(
            conn, store, "delivery_list", tenant, message_id, endpoint_id, undelivered, limit
        )
    return [dict(r) for r in found]


async def list_attempts(box: Relaybox, message_id: str, tenant: str | None) -> list[dict[str, Any]]:
    store = box.store
    async with store.transaction() as conn:
        found = await db.rows(conn, store, "delivery_attempts", message_id, tenant)
    return [dict(r) for r in found]


async def redeliver(
    box: Relaybox, message_id: str, *, tenant: str | None, endpoint_id: str | None = None
) -> int:
    """Send a message again to every endpoint (or ``endpoint_id``) whose delivery has
    finished — sent, dead or held — with a fresh attempt budget. Returns how many."""
    store, now = box.store, box.clock.now()
    async with store.transaction() as conn:
        found = await db.rows(
            conn, store, "delivery_redeliver", message_id, tenant, endpoint_id, now
        )
        if found:
            await store.notify(conn, "outbox")
    log.info("message_redelivered", message_id=message_id, deliveries=len(found))
    return len(found)


async def recover(
    box: Relaybox,
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
    store, now = box.store, box.clock.now()
    async with store.transaction() as conn:
        found = await db.rows(conn, store, "delivery_recover", endpoint_id, since, until, now)
        if found:
            await store.notify(conn, "outbox")
    log.info("endpoint_recovered", endpoint_id=endpoint_id, since=since, deliveries=len(found))
    return len(found)
