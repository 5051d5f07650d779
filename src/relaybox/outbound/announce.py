"""Operational events: what relaybox tells an operator about its own state, published
as messages of the operational tenant (``outbound.operational_tenant``, default
``relaybox``) to its endpoints, like any tenant's messages. An operator subscribes an
endpoint of that tenant (``relaybox endpoints create --tenant relaybox …``) and gets
them signed and retried like any webhook.

    relaybox.message.attempt.exhausted   a delivery used its last attempt (dead letter)
    relaybox.endpoint.failing            an endpoint's failures in a row reached a
                                         threshold (outbound.failing_thresholds, 3/10/50)
    relaybox.endpoint.recovered          a success of an endpoint announced failing
    relaybox.endpoint.disabled           (outbound.endpoints.disable_in)
    relaybox.endpoint.enabled            (outbound.endpoints.enable_endpoint)
    relaybox.inbox.dead                  a received event went to dead letters
    relaybox.inbox.quarantined           a received event conflicts with one accepted
    relaybox.source.silent               a source sent nothing for its traffic window
    relaybox.source.resumed              (relaybox.silence)
    relaybox.endpoint.silent             an endpoint took nothing for its window while
    relaybox.endpoint.resumed            deliveries wait (relaybox.silence)

Each is published in the transaction that records the change behind it, so it exists
exactly when the change does. The exceptions are an inbox event dead-lettered by a
claim (its worker died during its last attempt) and a quarantined delivery: the
statements that write those run outside any transaction relaybox could add to, so
their event follows in a transaction of its own right after. The receiving side
(``relaybox.inbound``) does not import this module: it publishes through the
:func:`announcer` the composition root passes it (``box.inbound.announce``).
Deliveries to the operational tenant's own endpoints raise no
``message.attempt.exhausted`` (an operator endpoint that is down would otherwise
feed itself). For the same reason a received event of one of
these types that goes to dead letters raises no ``relaybox.inbox.dead``: an
application that receives its operational events through its own receiver (a
Standard Webhooks source holding its operator endpoint's secret) would otherwise
turn every one it does not handle, or fails to handle, into another. (A dead letter
of a worker that died names no type, so it is announced.)
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox.outbound.publish import Publication, publish
from relaybox.outbound.registry import outbound
from relaybox.sync.publish import publish_sync

if TYPE_CHECKING:
    from relaybox.outbound.channels.base import Result
    from relaybox.runtime import Announce, AnnounceSync, Runtime
    from relaybox.store.outbox_rows import Delivery

__all__ = [
    "EVENT_TYPES",
    "announcer",
    "attempt_exhausted",
    "emit",
    "endpoint_failing",
    "endpoint_recovered",
    "operational_events",
    "sync_announcer",
]

log = structlog.get_logger("relaybox.outbound")

EVENT_TYPES = (
    "relaybox.message.attempt.exhausted",
    "relaybox.endpoint.failing",
    "relaybox.endpoint.recovered",
    "relaybox.endpoint.disabled",
    "relaybox.endpoint.enabled",
    "relaybox.inbox.dead",
    "relaybox.inbox.quarantined",
    "relaybox.source.silent",
    "relaybox.source.resumed",
    "relaybox.endpoint.silent",
    "relaybox.endpoint.resumed",
)


async def emit(
    box: Runtime,
    conn: AsyncConnection,
    event_type: str,
    data: Any,
    *,
    key: str | None = None,
    inbox_id: int | None = None,
    outbox_id: int | None = None,
) -> None:
    """Publish an operational event in ``conn``'s transaction (``key``: published once
    per key, as a message's idempotency key). ``inbox_id``, ``outbox_id``: the row it
    is about, whose error it quotes: the message is indexed under that row's subjects
    (:meth:`ErasureStore.subject_inherit`), so erasing one of them empties it too."""
    if event_type == "relaybox.inbox.dead" and _operational(data):
        return
    tenant = outbound(box).settings.operational_tenant
    message = await publish(box, conn, event_type, data, tenant=tenant, idempotency_key=key)
    if inbox_id is not None or outbox_id is not None:
        await box.store.erasure.subject_inherit(
            conn, message.id, inbox_id=inbox_id, outbox_id=outbox_id
        )


def announcer(box: Runtime) -> Announce:
    """:func:`emit` for ``box``: what the receiving side is given to tell with."""
    return functools.partial(emit, box)


def sync_announcer(box: Runtime) -> AnnounceSync:
    """:func:`announcer` in a synchronous transaction: what a plain-def handler's
    outcome is told with (``relaybox.inbox.dead``), through ``publish_sync``."""

    def announce(
        conn: Connection,
        event_type: str,
        data: Any,
        *,
        key: str | None = None,
        inbox_id: int | None = None,
    ) -> None:
        if event_type == "relaybox.inbox.dead" and _operational(data):
            return
        tenant = outbound(box).settings.operational_tenant
        request = Publication(event_type, data, tenant, idempotency_key=key)
        message = publish_sync(box, conn, request)
        if inbox_id is not None:
            box.store.sync.erasure.subject_inherit(conn, message.id, inbox_id=inbox_id)

    return announce


def _operational(data: Any) -> bool:
    """A dead letter of a received operational event (see the module docstring)."""
    return isinstance(data, dict) and data.get("eventType") in EVENT_TYPES


async def attempt_exhausted(
    box: Runtime, conn: AsyncConnection, d: Delivery, result: Result | None, error: str | None
) -> None:
    """A delivery used its last attempt: it is a dead letter (``exhausted``)."""
    if d.tenant == outbound(box).settings.operational_tenant:
        return
    data = {
        "messageId": d.message.id if d.message is not None else None,
        "eventType": d.message.event_type if d.message is not None else None,
        "endpointId": d.endpoint.id if d.endpoint is not None else None,
        "tenant": d.tenant,
        "channel": d.channel,
        "outboxId": d.id,
        "attempts": d.attempt if result is not None else d.attempt - 1,
        "lastStatus": result.status_code if result is not None else None,
        "lastError": error,
    }
    await emit(box, conn, "relaybox.message.attempt.exhausted", data, outbox_id=d.id)


async def endpoint_failing(
    box: Runtime,
    conn: AsyncConnection,
    endpoint_id: str,
    failures: int,
    level: int,
    result: Result,
    outbox_id: int | None = None,
) -> None:
    """The endpoint's failures in a row reached ``level``, a threshold not announced
    since it last recovered (another batch may have announced it meanwhile).
    ``outbox_id``: the delivery whose ``result`` this is (its error is quoted)."""
    row = await box.store.credentials.endpoint_failing_level(conn, endpoint_id, level)
    if row is None:
        return
    tenant, url, since = row
    data = {
        "endpointId": endpoint_id,
        "tenant": tenant,
        "url": url,
        "failures": failures,
        "threshold": level,
        "failingSince": since,
        "lastStatus": result.status_code,
        "lastError": result.error,
    }
    await emit(box, conn, "relaybox.endpoint.failing", data, outbox_id=outbox_id)
    log.warning("endpoint_failing", endpoint_id=endpoint_id, tenant=tenant, failures=failures)


async def endpoint_recovered(
    box: Runtime, conn: AsyncConnection, endpoint_ids: list[str], *, now: float | None = None
) -> None:
    """A success of endpoints leased as announced failing: each that still was is
    announced recovered; every one's failure run ends (one that failed again within
    the batch, after an earlier success recovered it, included)."""
    recovered = await box.store.credentials.endpoints_recovered(conn, endpoint_ids)
    await box.store.dispatch.endpoints_succeeded(conn, endpoint_ids, now=now)
    for row in recovered:
        data = {"endpointId": row.id, "tenant": row.tenant, "url": row.url}
        await emit(box, conn, "relaybox.endpoint.recovered", data)
        log.info("endpoint_recovered", endpoint_id=row.id, tenant=row.tenant)


async def operational_events(box: Runtime, *, limit: int = 50) -> list[Any]:
    """The most recent operational events, newest first (the dashboard's list)."""
    tenant = outbound(box).settings.operational_tenant
    return await box.store.outbox.message_list(tenant, event_type=None, before=None, limit=limit)
