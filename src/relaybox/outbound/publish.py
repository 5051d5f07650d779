"""Publishing: one message plus one outbox row per subscribed endpoint, written in the
caller's own transaction.

    async with box.store.transaction() as conn:          # or the app's own connection
        await conn.execute(text("UPDATE pets SET status = 'adopted' ..."))
        await box.publish(conn, "pet.adopted", {"petId": ...}, tenant="client-42")

Either the adoption and its webhooks commit together, or neither exists: no webhook
for a change that rolled back, no change whose webhook was lost (the outbox pattern).
Nothing is sent here; the dispatcher delivers after COMMIT.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox.bodies import text_problem
from relaybox.outbound.catalog import InvalidMessage, check_event_type_name, validate_data
from relaybox.outbound.registry import outbound
from relaybox.store.outbox import Message, NewMessage, new_id

if TYPE_CHECKING:
    from relaybox.app import Relaybox

__all__ = [
    "Message",
    "check_request",
    "envelope_time",
    "matches",
    "new_message",
    "publish",
    "published",
    "targets",
]


def envelope_time(now: float) -> str:
    stamp = datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def matches(event_type: str, patterns: Sequence[str]) -> bool:
    """Does an endpoint subscribed to ``patterns`` (``*`` wildcards) get this type?"""
    return any(fnmatch.fnmatchcase(event_type, p) for p in patterns)


def check_request(event_type: str, tenant: str, idempotency_key: str | None) -> None:
    """The checks of a publish that need no database: :class:`InvalidMessage` for a
    bad type, tenant or idempotency key."""
    check_event_type_name(event_type)
    if not tenant:
        raise InvalidMessage("a message needs a tenant", code="tenant")
    if problem := text_problem(tenant, "tenant"):
        raise InvalidMessage(problem, code="tenant")
    if idempotency_key is not None:
        if not 0 < len(idempotency_key) <= 256:
            raise InvalidMessage("an idempotency key is 1-256 characters", code="idempotency_key")
        if problem := text_problem(idempotency_key, "idempotency key"):
            raise InvalidMessage(problem, code="idempotency_key")


def new_message(
    box: Relaybox,
    event_type: str,
    data: Any,
    *,
    tenant: str,
    idempotency_key: str | None,
    api_version: str | None,
) -> NewMessage:
    """The message row: its id, and the envelope as JSON text within ``max_payload``."""
    ob = outbound(box)
    now = box.clock.now()
    msg_id = new_id("msg", now)
    envelope = {
        "id": msg_id,
        "type": event_type,
        "timestamp": envelope_time(now),
        "data": data,
        "apiVersion": api_version or ob.settings.api_version,
    }
    try:
        text = json.dumps(envelope, separators=(",", ":"), ensure_ascii=False)
        size = len(text.encode())
    except UnicodeEncodeError:
        # A lone surrogate ("\ud800" in JSON) is not Unicode text: no backend stores it.
        problem = text_problem(data, "data") or "data: not valid Unicode"
        raise InvalidMessage(problem, code="data") from None
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidMessage(f"data is not JSON-serialisable: {exc}"[:200], code="data") from None
    if size > ob.settings.max_payload:
        raise InvalidMessage(
            f"the message is over {ob.settings.max_payload} bytes", code="too_large"
        )
    return NewMessage(msg_id, tenant, event_type, idempotency_key, text, now)


def targets(
    event_type: str,
    subscribers: Sequence[tuple[str, str]],
    endpoint_ids: Sequence[str] | None,
) -> list[str]:
    """The endpoints a message goes to, of the tenant's enabled ``subscribers``."""
    if endpoint_ids is not None:
        wanted = set(endpoint_ids)
        return [eid for eid, _ in subscribers if eid in wanted]
    return [eid for eid, patterns in subscribers if matches(event_type, json.loads(patterns))]


def published(new: NewMessage, endpoints: Sequence[str]) -> Message:
    """What ``publish`` returns for the message it inserted."""
    return Message(
        id=new.id,
        tenant=new.tenant,
        event_type=new.event_type,
        idempotency_key=new.idempotency_key,
        body=new.body.encode(),
        created_at=new.created_at,
        endpoints=tuple(endpoints),
    )


async def publish(
    box: Relaybox,
    conn: AsyncConnection,
    event_type: str,
    data: Any,
    *,
    tenant: str,
    idempotency_key: str | None = None,
    endpoint_ids: Sequence[str] | None = None,
    api_version: str | None = None,
) -> Message:
    """Publish ``data`` as ``event_type`` to ``tenant``'s subscribed, enabled
    endpoints (or only to ``endpoint_ids`` among them, subscribed or not: test sends)
    in ``conn``'s transaction. Raises :class:`InvalidMessage` (bad type, data not
    matching the catalog's schema, data that is not JSON text (a lone surrogate),
    body over ``max_payload``)."""
    store = box.store
    check_request(event_type, tenant, idempotency_key)
    if idempotency_key is not None:
        existing = await store.message_get_by_key(conn, tenant, idempotency_key)
        if existing is not None:
            return existing
    await validate_data(box, conn, event_type, data)
    new = new_message(
        box,
        event_type,
        data,
        tenant=tenant,
        idempotency_key=idempotency_key,
        api_version=api_version,
    )
    if not await store.message_insert(conn, new):
        # A concurrent publish with this key committed first.
        assert idempotency_key is not None  # only a key conflicts
        existing = await store.message_get_by_key(conn, tenant, idempotency_key)
        assert existing is not None  # the conflicting row is committed
        return existing
    subscribers = await store.endpoint_subscribers(conn, tenant)
    found = targets(event_type, subscribers, endpoint_ids)
    if found:
        await store.delivery_insert(conn, new.id, tenant, found, now=new.created_at)
    return published(new, found)
