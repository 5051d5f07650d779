"""The sending side's operator reads and actions, shared by the admin API, the dashboard
and the CLI: endpoints with their health and recent attempts, Disable, Enable and
Recover, their headers and credentials; messages with their deliveries and attempts,
and Redeliver; the operational events."""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import asdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import structlog

from relaybox.errors import Conflict, InvalidRequest, NotFound, OpsError
from relaybox.ops import inbound as ops
from relaybox.ops.outbound_models import (
    BlockedKeyInfo,
    Delivery,
    EndpointAccess,
    EndpointActionResult,
    EndpointAttempt,
    EndpointDetail,
    EndpointFilter,
    EndpointList,
    EndpointSummary,
    EventTypeDefinition,
    EventTypeInfo,
    EventTypeList,
    Health,
    MessageAttempt,
    MessageDetail,
    MessageFilter,
    MessagePage,
    MessageSummary,
    OperationalEvent,
    OperationalEventList,
    RecoverResult,
    RedeliverResult,
)
from relaybox.store.outbox_rows import EndpointBacklog, EndpointHealth, Message

if TYPE_CHECKING:
    from relaybox.outbound.credentials import CredentialsSpec
    from relaybox.outbound.endpoints import EndpointPatch
    from relaybox.runtime import Runtime


log = structlog.get_logger("relaybox.admin")

HEALTH_WINDOW = 24 * 3600.0
"""Seconds of attempts an endpoint's success rate is computed over."""


# -- reads ------------------------------------------------------------------------


def _encode(created_at: float, message_id: str) -> str:
    raw = json.dumps([created_at, message_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode(cursor: str | None) -> tuple[float, str] | None:
    if not cursor:
        return None
    try:
        created_at, message_id = json.loads(
            base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        )
        return float(created_at), str(message_id)
    except (binascii.Error, ValueError, TypeError):
        raise InvalidRequest("cursor is not one this API returned") from None


async def _health(
    box: Runtime,
) -> tuple[dict[str, EndpointHealth], dict[str, EndpointBacklog]]:
    store = box.store
    health = await store.outbox.endpoint_health(since=box.clock.now() - HEALTH_WINDOW)
    return health, await store.outbox.endpoint_backlog()


def _summary(
    box: Runtime, e: Any, health: EndpointHealth | None, backlog: EndpointBacklog | None
) -> EndpointSummary:
    attempts = health.attempts if health else 0
    succeeded = health.succeeded if health else 0
    oldest = backlog.oldest if backlog else None
    return EndpointSummary(
        id=e.id,
        tenant=e.tenant,
        url=e.url,
        description=e.description,
        event_types=list(e.event_types),
        status=e.status,
        disabled_reason=e.disabled_reason,
        failing_since=e.failing_since,
        created_at=e.created_at,
        paused_at=e.paused_at,
        filter=e.payload_filter,
        ordered=e.ordered,
        on_dead=e.on_dead,
        health=Health(
            attempts=attempts,
            succeeded=succeeded,
            success_rate=round(succeeded / attempts, 4) if attempts else None,
            last_attempt_at=health.last_attempt_at if health else None,
            pending=backlog.pending if backlog else 0,
            dead=backlog.dead if backlog else 0,
            held=backlog.held if backlog else 0,
            oldest_pending_age_seconds=None if oldest is None else box.clock.now() - oldest,
        ),
    )


async def endpoint_list(box: Runtime, f: EndpointFilter) -> EndpointList:
    from relaybox.outbound.endpoints import list_endpoints

    endpoints = await list_endpoints(box, f.tenant, limit=f.limit)
    health, backlog = await _health(box)
    return EndpointList(
        items=[_summary(box, e, health.get(e.id), backlog.get(e.id)) for e in endpoints]
    )


async def endpoint_get(box: Runtime, endpoint_id: str) -> EndpointDetail:
    from relaybox.outbound.endpoints import get_endpoint

    e = await get_endpoint(box, endpoint_id, None)
    if e is None:
        raise NotFound(f"no endpoint {endpoint_id}")
    health, backlog = await _health(box)
    recent = [
        EndpointAttempt(**asdict(a))
        for a in await box.store.outbox.endpoint_attempts(endpoint_id, limit=50)
    ]
    summary = _summary(box, e, health.get(e.id), backlog.get(e.id))
    held = await box.store.outbox.ordering_blocked_keys(endpoint_id=e.id, tenant=None, limit=100)
    blocked = [
        BlockedKeyInfo(**{k: v for k, v in b.to_json().items() if k != "endpoint_id"}) for b in held
    ]
    return EndpointDetail(**summary.model_dump(), recent_attempts=recent, blocked_keys=blocked)


async def message_list(box: Runtime, f: MessageFilter) -> MessagePage:
    from relaybox.outbound.deliveries import list_messages

    found = await list_messages(
        box, f.tenant, event_type=f.type, before=_decode(f.cursor), limit=f.limit
    )
    items = [MessageSummary(**_message_summary(m)) for m in found]
    last = found[-1] if len(found) == f.limit else None
    return MessagePage(items=items, next_cursor=_encode(last.created_at, last.id) if last else None)


async def message_get(box: Runtime, message_id: str) -> MessageDetail:
    from relaybox.outbound.deliveries import get_message, list_attempts, list_deliveries

    m = await get_message(box, message_id, None)
    if m is None:
        raise NotFound(f"no message {message_id}")
    deliveries = await list_deliveries(box, None, message_id=message_id, limit=1000)
    attempts = await list_attempts(box, message_id, None)
    purged_at = await _purged_at(box, message_id)
    return MessageDetail(
        **_message_summary(m),
        payload=None if purged_at is not None else ops.decode_payload(m.body),
        purged_at=purged_at,
        deliveries=[Delivery(**{k: d[k] for k in Delivery.model_fields}) for d in deliveries],
        attempts=[
            MessageAttempt(**{k: a[k] for k in MessageAttempt.model_fields}) for a in attempts
        ],
    )


def _message_summary(m: Message) -> dict[str, Any]:
    """The fields of a :class:`MessageSummary` (the start of a :class:`MessageDetail`)
    from the stored message."""
    return {name: getattr(m, name) for name in MessageSummary.model_fields}


async def _purged_at(box: Runtime, message_id: str) -> float | None:
    return await box.store.outbox.message_purged_at(message_id)


async def message_redeliver(
    box: Runtime, message_id: str, *, endpoint_id: str | None
) -> RedeliverResult:
    from relaybox.outbound.deliveries import get_message, redeliver

    if await get_message(box, message_id, None) is None:
        raise NotFound(f"no message {message_id}")
    purged_at = await _purged_at(box, message_id)
    if purged_at is not None:
        raise Conflict(
            f"message {message_id} cannot be redelivered: its body was purged by retention "
            f"on {_iso(purged_at)} (its deliveries and attempts are kept)",
            code="payload_purged",
        )
    n = await redeliver(box, message_id, tenant=None, endpoint_id=endpoint_id)
    if n == 0:
        raise Conflict(
            f"message {message_id} has no finished delivery to send again (still pending?)",
            code="nothing_to_redeliver",
        )
    return RedeliverResult(message_id=message_id, redelivered=n)


async def _endpoint_or_404(box: Runtime, endpoint_id: str) -> Any:
    from relaybox.outbound.endpoints import get_endpoint

    found = await get_endpoint(box, endpoint_id, None)
    if found is None:
        raise NotFound(f"no endpoint {endpoint_id}")
    return found


def _manual(actor: str, reason: str) -> str:
    """The reason of an operator's disable or enable: ``manual`` is what the CLI and
    the tenant API record; an operator adds who and why."""
    return f"manual by {actor}: {reason}"


async def endpoint_disable(
    box: Runtime, endpoint_id: str, *, actor: str, reason: str
) -> EndpointActionResult:
    """Switch an endpoint off: its waiting deliveries become dead letters
    (``endpoint_disabled``, recoverable) and ``relaybox.endpoint.disabled`` is
    published, exactly as when the CLI or its tenant disables it."""
    from relaybox.outbound.endpoints import disable_endpoint

    current = await _endpoint_or_404(box, endpoint_id)
    if current.status == "disabled":
        raise Conflict(
            f"endpoint {endpoint_id} is already disabled ({current.disabled_reason})",
            code="already_disabled",
        )
    await disable_endpoint(box, endpoint_id, tenant=None, reason=_manual(actor, reason))
    log.info(
        "endpoint_action", action="disable", endpoint_id=endpoint_id, actor=actor, reason=reason
    )
    return await _switched(
        box,
        endpoint_id,
        f"endpoint {endpoint_id} disabled; its waiting deliveries are dead letters "
        "(endpoint_disabled) until you recover them",
    )


async def endpoint_enable(
    box: Runtime, endpoint_id: str, *, actor: str, reason: str
) -> EndpointActionResult:
    """Switch an endpoint back on (its failure streak starts again). Its dead
    letters stay dead: recover them."""
    from relaybox.outbound.endpoints import enable_endpoint

    current = await _endpoint_or_404(box, endpoint_id)
    if current.status == "enabled":
        raise Conflict(f"endpoint {endpoint_id} is already enabled", code="already_enabled")
    await enable_endpoint(box, endpoint_id, tenant=None, reason=_manual(actor, reason))
    log.info(
        "endpoint_action",
        action="enable",
        endpoint_id=endpoint_id,
        actor=actor,
        reason=reason,
        was=current.disabled_reason,
    )
    return await _switched(
        box,
        endpoint_id,
        f"endpoint {endpoint_id} enabled (was disabled: {current.disabled_reason}); "
        "its dead letters stay dead until you recover them",
    )


async def _switched(box: Runtime, endpoint_id: str, message: str) -> EndpointActionResult:
    """What a disable or an enable left: the endpoint's status read again."""
    after = await _endpoint_or_404(box, endpoint_id)
    return EndpointActionResult(
        endpoint_id=endpoint_id,
        status=after.status,
        disabled_reason=after.disabled_reason,
        message=message,
    )


async def endpoint_recover(
    box: Runtime,
    endpoint_id: str,
    *,
    since: float,
    until: float | None,
    actor: str,
    reason: str,
) -> RecoverResult:
    """Retry every dead delivery of the endpoint created in ``[since, until)``. The
    endpoint must be enabled: a disabled one is not leased, so they would only wait."""
    from relaybox.outbound.deliveries import recover

    current = await _endpoint_or_404(box, endpoint_id)
    if current.status != "enabled":
        raise Conflict(
            f"endpoint {endpoint_id} is disabled: enable it first, or the recovered "
            "deliveries would only wait",
            code="endpoint_disabled",
        )
    if until is not None and until <= since:
        raise InvalidRequest("until must be after since", hint="until_before_since")
    n = await recover(box, endpoint_id, since=since, until=until, tenant=None)
    log.info(
        "endpoint_action",
        action="recover",
        endpoint_id=endpoint_id,
        actor=actor,
        reason=reason,
        since=since,
        until=until,
        recovered=n,
    )
    window = f"since {_iso(since)}" + (f" until {_iso(until)}" if until is not None else "")
    return RecoverResult(
        endpoint_id=endpoint_id,
        recovered=n or 0,
        message=f"{n or 0} dead deliver(ies) of {endpoint_id} created {window} queued again",
    )


# -- operational events, an endpoint's headers and credentials ---------------------


class InvalidEndpointSettings(OpsError, status=422, code="invalid_endpoint"):
    """Headers or credentials relaybox refuses (422)."""


class SecretsUnavailable(OpsError, status=503, code="secrets_unavailable"):
    """No key to seal credentials with (``outbound.secrets_key``; 503)."""


async def operational_event_list(box: Runtime, *, limit: int = 50) -> OperationalEventList:
    """The most recent operational events (:mod:`relaybox.outbound.announce`), newest
    first."""
    from relaybox.outbound.announce import operational_events

    found = await operational_events(box, limit=limit)
    items = [
        OperationalEvent(
            id=m.id, event_type=m.event_type, created_at=m.created_at, data=m.envelope["data"]
        )
        for m in found
    ]
    return OperationalEventList(tenant=box.outbound.settings.operational_tenant, items=items)


async def endpoint_set_headers(
    box: Runtime, endpoint_id: str, headers: dict[str, str]
) -> EndpointAccess:
    """Replace an endpoint's custom request headers (what the tenant API's ``PATCH``
    and ``relaybox endpoints headers`` set)."""
    from relaybox.outbound.endpoints import EndpointPatch

    return await _change_access(box, endpoint_id, EndpointPatch(headers=headers))


async def endpoint_set_credentials(
    box: Runtime, endpoint_id: str, credentials: CredentialsSpec
) -> EndpointAccess:
    """Set or remove an endpoint's HTTP credentials, sealed; the answer says which
    kind is set, never the credentials."""
    from relaybox.outbound.endpoints import EndpointPatch

    return await _change_access(box, endpoint_id, EndpointPatch(credentials=credentials))


async def _change_access(box: Runtime, endpoint_id: str, patch: EndpointPatch) -> EndpointAccess:
    from relaybox.outbound.endpoints import InvalidEndpoint, update_endpoint
    from relaybox.outbound.vault import SecretsLocked

    found = await _endpoint_or_404(box, endpoint_id)
    try:
        updated = await update_endpoint(box, found.id, found.tenant, patch)
    except InvalidEndpoint as exc:
        raise InvalidEndpointSettings(str(exc)) from None
    except SecretsLocked as exc:  # the operator's key is missing or wrong
        raise SecretsUnavailable(str(exc)) from None
    if updated is None:
        raise NotFound(f"no endpoint {endpoint_id}")
    shown = updated.to_json()
    return EndpointAccess(
        id=updated.id,
        tenant=updated.tenant,
        headers=shown["headers"],
        credentials=shown["credentials"],
    )


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


class InvalidEventType(OpsError):
    """An event type the catalog refuses (422): a bad JSON Schema or subject path."""

    status = 422

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


async def event_type_define(
    box: Runtime, name: str, definition: EventTypeDefinition
) -> EventTypeInfo:
    """Add or replace a catalog entry (``PUT /admin/api/v1/event-types/{name}``):
    :class:`InvalidEventType` (422 ``invalid_event_type``, ``invalid_schema``,
    ``invalid_subject_path``) for what the catalog refuses."""
    from relaybox.outbound.catalog import InvalidMessage, define_event_type

    try:
        t = await define_event_type(
            box,
            name,
            description=definition.description,
            schema=definition.schema_,
            subject=definition.subject,
        )
    except InvalidMessage as exc:
        raise InvalidEventType(str(exc), code=f"invalid_{exc.code}") from None
    refresh = getattr(box, "refresh_webhooks", None)
    if refresh is not None:  # the application's OpenAPI webhooks section
        await refresh()
    return EventTypeInfo(name=t.name, description=t.description, schema=t.schema, subject=t.subject)


async def event_types(box: Runtime) -> EventTypeList:
    from relaybox.outbound.catalog import list_event_types

    return EventTypeList(
        items=[
            EventTypeInfo(
                name=t.name, description=t.description, schema=t.schema, subject=t.subject
            )
            for t in await list_event_types(box)
        ]
    )
