"""The sending side in the admin app: endpoints with their health and recent attempts,
Disable, Enable and Recover; messages with their deliveries and attempts, and Redeliver.

Rows are read through :mod:`relaybox.outbound` (the area that owns those tables), so
the admin shows what the tenant API shows; only the health figures (success rate and
backlog per endpoint) are operator-specific queries (``ops_endpoint_*``). The section
names its tables in ``requires_tables``: on a database without them it stays hidden
and its routes answer 404 ``not_migrated``.

The endpoint actions call what the CLI and the tenant API call
(:func:`relaybox.outbound.endpoints.disable_endpoint`, ``enable_endpoint``,
:func:`relaybox.outbound.deliveries.recover`). Who acted and why go into the log
(``endpoint_action``) and, for a disable, into the endpoint's ``disabled_reason``
(``manual by dashboard: …``), which the endpoint's pages, ``relaybox endpoints list``
and the ``relaybox.endpoint.disabled`` operational event show.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import asdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import structlog
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from relaybox.admin import dashboard, ops
from relaybox.admin.models import RequestModel
from relaybox.admin.sections import Call, Operation, OverviewPanel, Section, register_section
from relaybox.errors import InvalidTimeSpec
from relaybox.store.outbox import EndpointBacklog, EndpointHealth
from relaybox.timespec import parse_time_or_none

if TYPE_CHECKING:
    from relaybox.app import Relaybox

__all__ = [
    "EndpointActionRequest",
    "EndpointActionResult",
    "EndpointDetail",
    "EndpointList",
    "EndpointSummary",
    "EventTypeList",
    "MessageDetail",
    "MessagePage",
    "MessageSummary",
    "RecoverRequest",
    "RecoverResult",
    "RedeliverResult",
    "register",
]

log = structlog.get_logger("relaybox.admin")

HEALTH_WINDOW = 24 * 3600.0
"""Seconds of attempts an endpoint's success rate is computed over."""

TABLES = ("relaybox_endpoints", "relaybox_messages", "relaybox_outbox_attempts")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EndpointFilter(RequestModel):
    tenant: str | None = Field(None, max_length=200)
    limit: int = Field(100, ge=1, le=1000)


class Health(_Model):
    attempts: int = Field(description="delivery attempts in the last 24 h")
    succeeded: int
    success_rate: float | None = Field(description="succeeded / attempts; null without attempts")
    last_attempt_at: float | None
    pending: int
    dead: int
    held: int
    oldest_pending_age_seconds: float | None


class EndpointSummary(_Model):
    id: str
    tenant: str
    url: str
    description: str
    event_types: list[str]
    status: str
    disabled_reason: str | None
    failing_since: float | None
    created_at: float
    health: Health


class EndpointList(_Model):
    items: list[EndpointSummary]


class EndpointAttempt(_Model):
    outbox_id: int
    message_id: str | None
    attempt: int
    started_at: float
    duration: float
    outcome: str
    status_code: int | None
    error: str | None


class EndpointDetail(EndpointSummary):
    recent_attempts: list[EndpointAttempt]


class MessageFilter(RequestModel):
    tenant: str | None = Field(None, max_length=200)
    type: str | None = Field(None, max_length=200, description="event type, exact")
    limit: int = Field(50, ge=1, le=500)
    cursor: str | None = Field(None, max_length=200)


class MessageSummary(_Model):
    id: str
    tenant: str
    event_type: str
    idempotency_key: str | None
    created_at: float


class MessagePage(_Model):
    items: list[MessageSummary]
    next_cursor: str | None


class Delivery(_Model):
    id: int
    endpoint_id: str | None
    channel: str
    status: str
    dead_reason: str | None
    attempts: int
    next_attempt_at: float | None
    last_error: str | None
    last_status: int | None
    created_at: float
    sent_at: float | None


class MessageAttempt(_Model):
    outbox_id: int
    endpoint_id: str | None
    attempt: int
    started_at: float
    duration: float
    outcome: str
    status_code: int | None
    error: str | None
    response: str | None


class MessageDetail(MessageSummary):
    payload: Any = Field(description="the envelope every endpoint receives; null once purged")
    purged_at: float | None = Field(
        description="when retention dropped the body (it can no longer be redelivered)"
    )
    deliveries: list[Delivery]
    attempts: list[MessageAttempt]


class EventTypeInfo(_Model):
    name: str
    description: str
    schema_: dict[str, Any] | None = Field(
        alias="schema", serialization_alias="schema", description="JSON Schema of data"
    )


class EventTypeList(_Model):
    items: list[EventTypeInfo]


class RedeliverRequest(RequestModel):
    reason: str = Field(min_length=1, max_length=2000)
    endpoint_id: str | None = Field(None, max_length=200, description="only this endpoint")
    actor: str | None = Field(None, min_length=1, max_length=200)


class RedeliverResult(_Model):
    message_id: str
    redelivered: int = Field(description="finished deliveries sent again")


class EndpointActionRequest(RequestModel):
    """Disable or enable an endpoint; ``reason`` (and ``actor``) are logged, and a
    disable keeps them as the endpoint's ``disabled_reason``."""

    reason: str = Field(min_length=1, max_length=2000, description="why: kept with the record")
    actor: str | None = Field(
        None, min_length=1, max_length=200, description="who asks (default: admin-api)"
    )


class EndpointActionResult(_Model):
    endpoint_id: str
    status: str = Field(description="enabled or disabled, after the action")
    disabled_reason: str | None
    message: str


class RecoverRequest(EndpointActionRequest):
    since: float = Field(description="dead deliveries created at or after (epoch seconds)")
    until: float | None = Field(None, description="created before (epoch seconds)")


class RecoverResult(_Model):
    endpoint_id: str
    recovered: int = Field(description="dead deliveries back to pending")
    message: str


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
        raise ops.InvalidRequest("cursor is not one this API returned") from None


async def _health(
    box: Relaybox,
) -> tuple[dict[str, EndpointHealth], dict[str, EndpointBacklog]]:
    store = box.store
    health = await store.endpoint_health(since=box.clock.now() - HEALTH_WINDOW)
    return health, await store.endpoint_backlog()


def _summary(
    box: Relaybox, e: Any, health: EndpointHealth | None, backlog: EndpointBacklog | None
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


async def endpoint_list(box: Relaybox, f: EndpointFilter) -> EndpointList:
    from relaybox.outbound.endpoints import list_endpoints

    endpoints = await list_endpoints(box, f.tenant, limit=f.limit)
    health, backlog = await _health(box)
    return EndpointList(
        items=[_summary(box, e, health.get(e.id), backlog.get(e.id)) for e in endpoints]
    )


async def endpoint_get(box: Relaybox, endpoint_id: str) -> EndpointDetail:
    from relaybox.outbound.endpoints import get_endpoint

    e = await get_endpoint(box, endpoint_id, None)
    if e is None:
        raise ops.NotFound(f"no endpoint {endpoint_id}")
    health, backlog = await _health(box)
    recent = [
        EndpointAttempt(**asdict(a))
        for a in await box.store.endpoint_attempts(endpoint_id, limit=50)
    ]
    summary = _summary(box, e, health.get(e.id), backlog.get(e.id))
    return EndpointDetail(**summary.model_dump(), recent_attempts=recent)


async def message_list(box: Relaybox, f: MessageFilter) -> MessagePage:
    from relaybox.outbound.deliveries import list_messages

    found = await list_messages(
        box, f.tenant, event_type=f.type, before=_decode(f.cursor), limit=f.limit
    )
    items = [
        MessageSummary(
            id=m.id,
            tenant=m.tenant,
            event_type=m.event_type,
            idempotency_key=m.idempotency_key,
            created_at=m.created_at,
        )
        for m in found
    ]
    last = found[-1] if len(found) == f.limit else None
    return MessagePage(items=items, next_cursor=_encode(last.created_at, last.id) if last else None)


async def message_get(box: Relaybox, message_id: str) -> MessageDetail:
    from relaybox.outbound.deliveries import get_message, list_attempts, list_deliveries

    m = await get_message(box, message_id, None)
    if m is None:
        raise ops.NotFound(f"no message {message_id}")
    deliveries = await list_deliveries(box, None, message_id=message_id, limit=1000)
    attempts = await list_attempts(box, message_id, None)
    purged_at = await _purged_at(box, message_id)
    return MessageDetail(
        id=m.id,
        tenant=m.tenant,
        event_type=m.event_type,
        idempotency_key=m.idempotency_key,
        created_at=m.created_at,
        payload=None if purged_at is not None else ops.decode_payload(m.body),
        purged_at=purged_at,
        deliveries=[Delivery(**{k: d[k] for k in Delivery.model_fields}) for d in deliveries],
        attempts=[
            MessageAttempt(**{k: a[k] for k in MessageAttempt.model_fields}) for a in attempts
        ],
    )


async def _purged_at(box: Relaybox, message_id: str) -> float | None:
    return await box.store.message_purged_at(message_id)


async def message_redeliver(
    box: Relaybox, message_id: str, *, endpoint_id: str | None
) -> RedeliverResult:
    from relaybox.outbound.deliveries import get_message, redeliver

    if await get_message(box, message_id, None) is None:
        raise ops.NotFound(f"no message {message_id}")
    purged_at = await _purged_at(box, message_id)
    if purged_at is not None:
        raise ops.Conflict(
            f"message {message_id} cannot be redelivered: its body was purged by retention "
            f"on {_iso(purged_at)} (its deliveries and attempts are kept)",
            code="payload_purged",
        )
    n = await redeliver(box, message_id, tenant=None, endpoint_id=endpoint_id)
    if n == 0:
        raise ops.Conflict(
            f"message {message_id} has no finished delivery to send again (still pending?)",
            code="nothing_to_redeliver",
        )
    return RedeliverResult(message_id=message_id, redelivered=n)


async def _endpoint_or_404(box: Relaybox, endpoint_id: str) -> Any:
    from relaybox.outbound.endpoints import get_endpoint

    found = await get_endpoint(box, endpoint_id, None)
    if found is None:
        raise ops.NotFound(f"no endpoint {endpoint_id}")
    return found


def _manual(actor: str, reason: str) -> str:
    """The reason of an operator's disable or enable: ``manual`` is what the CLI and
    the tenant API record; an operator adds who and why."""
    return f"manual by {actor}: {reason}"


async def endpoint_disable(
    box: Relaybox, endpoint_id: str, *, actor: str, reason: str
) -> EndpointActionResult:
    """Switch an endpoint off: its waiting deliveries become dead letters
    (``endpoint_disabled``, recoverable) and ``relaybox.endpoint.disabled`` is
    published, exactly as when the CLI or its tenant disables it."""
    from relaybox.outbound.endpoints import disable_endpoint

    current = await _endpoint_or_404(box, endpoint_id)
    if current.status == "disabled":
        raise ops.Conflict(
            f"endpoint {endpoint_id} is already disabled ({current.disabled_reason})",
            code="already_disabled",
        )
    await disable_endpoint(box, endpoint_id, tenant=None, reason=_manual(actor, reason))
    after = await _endpoint_or_404(box, endpoint_id)
    log.info(
        "endpoint_action", action="disable", endpoint_id=endpoint_id, actor=actor, reason=reason
    )
    return EndpointActionResult(
        endpoint_id=endpoint_id,
        status=after.status,
        disabled_reason=after.disabled_reason,
        message=f"endpoint {endpoint_id} disabled; its waiting deliveries are dead letters "
        "(endpoint_disabled) until you recover them",
    )


async def endpoint_enable(
    box: Relaybox, endpoint_id: str, *, actor: str, reason: str
) -> EndpointActionResult:
    """Switch an endpoint back on (its failure streak starts again). Its dead
    letters stay dead: recover them."""
    from relaybox.outbound.endpoints import enable_endpoint

    current = await _endpoint_or_404(box, endpoint_id)
    if current.status == "enabled":
        raise ops.Conflict(f"endpoint {endpoint_id} is already enabled", code="already_enabled")
    await enable_endpoint(box, endpoint_id, tenant=None, reason=_manual(actor, reason))
    after = await _endpoint_or_404(box, endpoint_id)
    log.info(
        "endpoint_action",
        action="enable",
        endpoint_id=endpoint_id,
        actor=actor,
        reason=reason,
        was=current.disabled_reason,
    )
    return EndpointActionResult(
        endpoint_id=endpoint_id,
        status=after.status,
        disabled_reason=after.disabled_reason,
        message=f"endpoint {endpoint_id} enabled (was disabled: {current.disabled_reason}); "
        "its dead letters stay dead until you recover them",
    )


async def endpoint_recover(
    box: Relaybox,
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
        raise ops.Conflict(
            f"endpoint {endpoint_id} is disabled: enable it first, or the recovered "
            "deliveries would only wait",
            code="endpoint_disabled",
        )
    if until is not None and until <= since:
        raise ops.InvalidRequest("until must be after since", hint="until_before_since")
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


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


async def event_types(box: Relaybox) -> EventTypeList:
    from relaybox.outbound.catalog import list_event_types

    return EventTypeList(
        items=[
            EventTypeInfo(name=t.name, description=t.description, schema=t.schema)
            for t in await list_event_types(box)
        ]
    )


async def overview_panel(box: Relaybox) -> OverviewPanel | None:
    """Delivery success rate per endpoint over the last 24 hours."""
    summaries = (await endpoint_list(box, EndpointFilter(limit=50))).items
    if not summaries:
        return None
    rows = [
        (
            e.id,
            e.status,
            e.health.attempts,
            "-" if e.health.success_rate is None else f"{e.health.success_rate:.1%}",
            e.health.pending,
            e.health.dead,
        )
        for e in summaries
    ]
    return OverviewPanel(
        title="Delivery success rate per endpoint (24 h)",
        columns=("endpoint", "status", "attempts", "success rate", "pending", "dead"),
        rows=rows,
        metric="endpoints",
    )


# -- API --------------------------------------------------------------------------


async def _endpoint_list(c: Call) -> BaseModel:
    return await endpoint_list(c.box, c.query)


async def _endpoint_get(c: Call) -> BaseModel:
    return await endpoint_get(c.box, c.path["id"])


async def _message_list(c: Call) -> BaseModel:
    return await message_list(c.box, c.query)


async def _message_get(c: Call) -> BaseModel:
    return await message_get(c.box, c.path["id"])


async def _event_types(c: Call) -> BaseModel:
    return await event_types(c.box)


async def _message_redeliver(c: Call) -> BaseModel:
    return await message_redeliver(c.box, c.path["id"], endpoint_id=c.body.endpoint_id)


async def _endpoint_disable(c: Call) -> BaseModel:
    return await endpoint_disable(c.box, c.path["id"], actor=c.actor, reason=c.body.reason)


async def _endpoint_enable(c: Call) -> BaseModel:
    return await endpoint_enable(c.box, c.path["id"], actor=c.actor, reason=c.body.reason)


async def _endpoint_recover(c: Call) -> BaseModel:
    b = c.body
    return await endpoint_recover(
        c.box, c.path["id"], since=b.since, until=b.until, actor=c.actor, reason=b.reason
    )


ENDPOINT_OPERATIONS = (
    Operation(
        "GET",
        "/endpoints",
        "listEndpoints",
        "Webhook endpoints of every tenant, with their health",
        _endpoint_list,
        EndpointList,
        query=EndpointFilter,
        errors=(400,),
    ),
    Operation(
        "GET",
        "/endpoints/{id:str}",
        "getEndpoint",
        "One endpoint with its health and most recent attempts",
        _endpoint_get,
        EndpointDetail,
        errors=(404,),
    ),
    Operation(
        "POST",
        "/endpoints/{id:str}/disable",
        "disableEndpoint",
        "Switch an endpoint off; its waiting deliveries become dead letters",
        _endpoint_disable,
        EndpointActionResult,
        body=EndpointActionRequest,
        errors=(400, 404, 409),
        description="The same as `relaybox endpoints disable` and the tenant API's "
        "`PATCH {enabled: false}`: waiting deliveries become dead letters "
        "(`endpoint_disabled`) and `relaybox.endpoint.disabled` is published. The "
        "disabled reason records the actor and the reason. 409 `already_disabled`.",
    ),
    Operation(
        "POST",
        "/endpoints/{id:str}/enable",
        "enableEndpoint",
        "Switch an endpoint back on (its dead letters stay dead: recover them)",
        _endpoint_enable,
        EndpointActionResult,
        body=EndpointActionRequest,
        errors=(400, 404, 409),
        description="409 `already_enabled`.",
    ),
    Operation(
        "POST",
        "/endpoints/{id:str}/recover",
        "recoverEndpoint",
        "Retry the endpoint's dead deliveries created in a time window",
        _endpoint_recover,
        RecoverResult,
        body=RecoverRequest,
        errors=(400, 404, 409),
        description="Every dead delivery created in [since, until) goes back to pending "
        "with a fresh attempt budget and the same webhook-id. 409 `endpoint_disabled`: "
        "enable the endpoint first.",
    ),
)
MESSAGE_OPERATIONS = (
    Operation(
        "GET",
        "/messages",
        "listMessages",
        "Published messages, newest first",
        _message_list,
        MessagePage,
        query=MessageFilter,
        errors=(400,),
    ),
    Operation(
        "GET",
        "/messages/{id:str}",
        "getMessage",
        "One message with its deliveries and attempts",
        _message_get,
        MessageDetail,
        errors=(404,),
    ),
    Operation(
        "GET",
        "/event-types",
        "listEventTypes",
        "The event-type catalog tenants subscribe to",
        _event_types,
        EventTypeList,
    ),
    Operation(
        "POST",
        "/messages/{id:str}/redeliver",
        "redeliverMessage",
        "Send a message again to every endpoint whose delivery finished",
        _message_redeliver,
        RedeliverResult,
        body=RedeliverRequest,
        errors=(400, 404, 409),
        description="Reuses the delivery row and so the webhook-id: a receiver that "
        "already processed the message recognises it. 409 `payload_purged` once retention "
        "dropped the body.",
    ),
)
OPERATIONS = ENDPOINT_OPERATIONS + MESSAGE_OPERATIONS


# -- pages ------------------------------------------------------------------------


def _text_id(request: Request) -> str:
    raw = str(request.path_params["id"])
    if "\x00" in raw or len(raw) > 200:
        raise ops.NotFound(f"{raw[:40]!r} is not a known id")
    return raw


@dashboard.page
async def endpoints_page(request: Request) -> Response:
    f = EndpointFilter.model_validate(
        {k: v for k, v in request.query_params.items() if v and k in EndpointFilter.model_fields}
    )
    result = await endpoint_list(dashboard.box_of(request), f)
    return await dashboard.render(request, "endpoints.html", active="endpoints", f=f, page=result)


@dashboard.page
async def endpoint_page(request: Request) -> Response:
    detail = await endpoint_get(dashboard.box_of(request), _text_id(request))
    return await dashboard.render(request, "endpoint.html", active="endpoints", e=detail)


@dashboard.page
async def messages_page(request: Request) -> Response:
    f = MessageFilter.model_validate(
        {k: v for k, v in request.query_params.items() if v and k in MessageFilter.model_fields}
    )
    result = await message_list(dashboard.box_of(request), f)
    next_url = None
    if result.next_cursor:
        next_url = f"{request.url.path}?cursor={result.next_cursor}"
    return await dashboard.render(
        request, "messages.html", active="messages", f=f, page=result, next_url=next_url
    )


@dashboard.page
async def message_page(request: Request) -> Response:
    detail = await message_get(dashboard.box_of(request), _text_id(request))
    return await dashboard.render(request, "message.html", active="messages", m=detail)


@dashboard.action
async def message_redeliver_action(request: Request, form: dict[str, str]) -> dashboard.Notice:
    RedeliverRequest.model_validate(
        {"reason": form.get("reason") or "redelivered from the dashboard"}
    )
    result = await message_redeliver(
        dashboard.box_of(request),
        _text_id(request),
        endpoint_id=form.get("endpoint_id") or None,
    )
    return "redelivered", result.redelivered


async def _endpoint_switch(
    request: Request, form: dict[str, str], switch: Any, done: str
) -> dashboard.Notice:
    """Disable or enable from the dashboard: the form's reason, or what was done."""
    r = EndpointActionRequest.model_validate(
        {"reason": form.get("reason") or f"{done} from the dashboard"}
    )
    await switch(
        dashboard.box_of(request),
        _text_id(request),
        actor=dashboard.actor_of(request),
        reason=r.reason,
    )
    return f"endpoint_{done}"


@dashboard.action
async def endpoint_disable_action(request: Request, form: dict[str, str]) -> dashboard.Notice:
    return await _endpoint_switch(request, form, endpoint_disable, "disabled")


@dashboard.action
async def endpoint_enable_action(request: Request, form: dict[str, str]) -> dashboard.Notice:
    return await _endpoint_switch(request, form, endpoint_enable, "enabled")


@dashboard.action
async def endpoint_recover_action(request: Request, form: dict[str, str]) -> dashboard.Notice:
    box = dashboard.box_of(request)
    now = box.clock.now()
    try:  # the CLI's forms of a time: 24h (ago), ISO 8601 (UTC unless told), epoch
        since = parse_time_or_none(form.get("since"), now)
        until = parse_time_or_none(form.get("until"), now)
    except InvalidTimeSpec as exc:
        raise ops.InvalidRequest(exc.message, hint="bad_time") from None
    if since is None:
        raise ops.InvalidRequest(
            "since is required: 24h, 2026-03-13T00:00:00Z or epoch seconds", hint="since_required"
        )
    r = RecoverRequest.model_validate(
        {
            "since": since,
            "until": until,
            "reason": form.get("reason") or "recovered from the dashboard",
        }
    )
    result = await endpoint_recover(
        box,
        _text_id(request),
        since=r.since,
        until=r.until,
        actor=dashboard.actor_of(request),
        reason=r.reason,
    )
    return "recovered", result.recovered


ENDPOINT_PAGES = (
    Route("/endpoints", endpoints_page, methods=["GET"]),
    Route("/endpoints/{id:str}", endpoint_page, methods=["GET"]),
    Route("/endpoints/{id:str}/disable", endpoint_disable_action, methods=["POST"]),
    Route("/endpoints/{id:str}/enable", endpoint_enable_action, methods=["POST"]),
    Route("/endpoints/{id:str}/recover", endpoint_recover_action, methods=["POST"]),
)
MESSAGE_PAGES = (
    Route("/messages", messages_page, methods=["GET"]),
    Route("/messages/{id:str}", message_page, methods=["GET"]),
    Route("/messages/{id:str}/redeliver", message_redeliver_action, methods=["POST"]),
)
PAGES = ENDPOINT_PAGES + MESSAGE_PAGES


def register() -> None:
    """Add the endpoints and messages sections (shown once their tables exist)."""
    register_section(
        Section(
            "endpoints",
            "Endpoints",
            40,
            nav_path="/endpoints",
            operations=ENDPOINT_OPERATIONS,
            pages=ENDPOINT_PAGES,
            requires_tables=TABLES,
            overview=overview_panel,
            tag_description="Tenants' webhook endpoints, their health and recent attempts; "
            "disable, enable, recover.",
        )
    )
    register_section(
        Section(
            "messages",
            "Messages",
            50,
            nav_path="/messages",
            operations=MESSAGE_OPERATIONS,
            pages=MESSAGE_PAGES,
            requires_tables=TABLES,
            tag_description="Published messages, their deliveries, attempts and redelivery.",
        )
    )
