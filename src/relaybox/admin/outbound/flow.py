"""The admin API's operations and the dashboard's actions of an endpoint's flow: pause,
resume, replay missing, and (API only) setting its payload filter. They call what the
tenant API and the CLI call (:mod:`relaybox.outbound.flow`,
:func:`relaybox.outbound.endpoints.update_endpoint`); who acted and why go into the
log (``endpoint_action``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog
from pydantic import BaseModel, Field
from starlette.requests import Request
from starlette.routing import Route

from relaybox.admin import dashboard, ops
from relaybox.admin.outbound.models import EndpointActionRequest, _Model
from relaybox.admin.sections import Call, Operation
from relaybox.outbound.filters import InvalidFilter
from relaybox.timespec import TIME_FORMS, parse_time

if TYPE_CHECKING:
    from relaybox.app import Relaybox

__all__ = [
    "FLOW_OPERATIONS",
    "FLOW_PAGES",
    "FilterRequest",
    "FilterResult",
    "PauseResult",
    "ReplayMissingRequest",
    "ReplayMissingResult",
]

log = structlog.get_logger("relaybox.admin")


class InvalidFilterRequest(ops.OpsError):
    """A payload filter outside the grammar (422 ``invalid_filter``)."""

    status = 422
    code = "invalid_filter"


class PauseResult(_Model):
    endpoint_id: str
    paused: bool = Field(description="whether the endpoint is paused, after the action")
    paused_at: float | None
    waiting: int = Field(description="its deliveries waiting (pending)")
    message: str


class ReplayMissingRequest(EndpointActionRequest):
    since: float | str = Field(
        description=f"messages published at or after: {TIME_FORMS}", union_mode="left_to_right"
    )
    limit: int | None = Field(
        None, ge=1, description="deliveries to queue at most (default and cap: replay_max)"
    )


class ReplayMissingResult(_Model):
    endpoint_id: str
    since: float
    queued: int = Field(description="deliveries created")
    scanned: int = Field(description="messages without a delivery read")
    complete: bool = Field(description="every message up to now was read")
    resume_since: float | None = Field(description="when not complete: since of the next call")
    message: str


class FilterRequest(EndpointActionRequest):
    filter: dict[str, Any] = Field(description="the payload filter; {} removes it")


class FilterResult(_Model):
    endpoint_id: str
    filter: dict[str, Any] | None
    message: str


async def _endpoint(box: Relaybox, endpoint_id: str) -> Any:
    from relaybox.outbound.endpoints import get_endpoint

    found = await get_endpoint(box, endpoint_id, None)
    if found is None:
        raise ops.NotFound(f"no endpoint {endpoint_id}")
    return found


async def _waiting(box: Relaybox, endpoint_id: str) -> int:
    backlog = (await box.store.endpoint_backlog()).get(endpoint_id)
    return backlog.pending if backlog else 0


async def endpoint_pause(
    box: Relaybox, endpoint_id: str, *, paused: bool, actor: str, reason: str
) -> PauseResult:
    """Pause or resume the endpoint; 409 ``already_paused`` / ``not_paused``."""
    from relaybox.outbound.flow import pause_endpoint, resume_endpoint

    current = await _endpoint(box, endpoint_id)
    if paused and current.paused_at is not None:
        raise ops.Conflict(f"endpoint {endpoint_id} is already paused", code="already_paused")
    if not paused and current.paused_at is None:
        raise ops.Conflict(f"endpoint {endpoint_id} is not paused", code="not_paused")
    action = pause_endpoint if paused else resume_endpoint
    await action(box, endpoint_id, tenant=None)
    after = await _endpoint(box, endpoint_id)
    waiting = await _waiting(box, endpoint_id)
    verb = "pause" if paused else "resume"
    log.info("endpoint_action", action=verb, endpoint_id=endpoint_id, actor=actor, reason=reason)
    message = (
        f"endpoint {endpoint_id} paused: its {waiting} waiting deliveries (and new ones) wait"
        " until you resume it"
        if paused
        else f"endpoint {endpoint_id} resumed: its {waiting} waiting deliveries go out oldest first"
    )
    return PauseResult(
        endpoint_id=endpoint_id,
        paused=after.paused_at is not None,
        paused_at=after.paused_at,
        waiting=waiting,
        message=message,
    )


async def endpoint_replay_missing(
    box: Relaybox, endpoint_id: str, body: ReplayMissingRequest, *, actor: str
) -> ReplayMissingResult:
    """Queue the messages since ``body.since`` the endpoint's subscription matches and
    it has no delivery of; 409 ``endpoint_disabled``."""
    from relaybox.outbound.flow import replay_missing

    since = body.since if isinstance(body.since, float) else parse_time(body.since, box.clock.now())
    await _endpoint(box, endpoint_id)
    result = await replay_missing(box, endpoint_id, since=since, tenant=None, limit=body.limit)
    assert result is not None  # the endpoint exists (deleted meanwhile: 404 above next time)
    log.info(
        "endpoint_action",
        action="replay_missing",
        endpoint_id=endpoint_id,
        actor=actor,
        reason=body.reason,
        since=since,
        queued=result.queued,
    )
    more = "" if result.complete else f"; more may remain: go on with since={result.resume_since}"
    return ReplayMissingResult(
        **result.to_json(),
        message=f"{result.queued} missing deliver(ies) queued for {endpoint_id}{more}",
    )


async def endpoint_set_filter(
    box: Relaybox, endpoint_id: str, body: FilterRequest, *, actor: str
) -> FilterResult:
    """Set (or with ``{}`` remove) the endpoint's payload filter; 422 ``invalid_filter``."""
    from relaybox.outbound.endpoints import EndpointPatch, update_endpoint

    current = await _endpoint(box, endpoint_id)
    try:
        await update_endpoint(box, endpoint_id, current.tenant, EndpointPatch(filter=body.filter))
    except InvalidFilter as exc:
        raise InvalidFilterRequest(str(exc)) from None
    after = await _endpoint(box, endpoint_id)
    log.info(
        "endpoint_action", action="filter", endpoint_id=endpoint_id, actor=actor, reason=body.reason
    )
    return FilterResult(
        endpoint_id=endpoint_id,
        filter=after.payload_filter,
        message=f"endpoint {endpoint_id}: "
        + ("payload filter set" if after.payload_filter else "payload filter removed"),
    )


async def _pause(c: Call) -> BaseModel:
    return await endpoint_pause(
        c.box, c.path["id"], paused=True, actor=c.actor, reason=c.body.reason
    )


async def _resume(c: Call) -> BaseModel:
    return await endpoint_pause(
        c.box, c.path["id"], paused=False, actor=c.actor, reason=c.body.reason
    )


async def _replay_missing(c: Call) -> BaseModel:
    return await endpoint_replay_missing(c.box, c.path["id"], c.body, actor=c.actor)


async def _set_filter(c: Call) -> BaseModel:
    return await endpoint_set_filter(c.box, c.path["id"], c.body, actor=c.actor)


FLOW_OPERATIONS = (
    Operation(
        "POST",
        "/endpoints/{id:str}/pause",
        "pauseEndpoint",
        "Pause an endpoint: its deliveries wait (never dead-lettered) until resumed",
        _pause,
        PauseResult,
        body=EndpointActionRequest,
        errors=(400, 404, 409),
        description="The same as `relaybox endpoints pause` and the tenant API's "
        "`POST /endpoints/{id}/pause`. Messages published meanwhile still get a delivery; "
        "no dispatcher leases them until the resume. 409 `already_paused`.",
    ),
    Operation(
        "POST",
        "/endpoints/{id:str}/resume",
        "resumeEndpoint",
        "Resume a paused endpoint: its waiting deliveries go out in publish order",
        _resume,
        PauseResult,
        body=EndpointActionRequest,
        errors=(400, 404, 409),
        description="409 `not_paused`.",
    ),
    Operation(
        "POST",
        "/endpoints/{id:str}/replay-missing",
        "replayMissing",
        "Send the messages since a time the endpoint matches but never got a delivery of",
        _replay_missing,
        ReplayMissingResult,
        body=ReplayMissingRequest,
        errors=(400, 404, 409),
        description="Messages published while the endpoint was disabled or before it "
        "existed: each gets one delivery, however often this runs (the delivery key is "
        "unique). At most `limit` (and `outbound.replay_max`) per call; `complete` false "
        "and `resume_since` when more may remain. 409 `endpoint_disabled`: enable it first.",
    ),
    Operation(
        "PUT",
        "/endpoints/{id:str}/filter",
        "setEndpointFilter",
        "Set or remove an endpoint's payload filter",
        _set_filter,
        FilterResult,
        body=FilterRequest,
        errors=(400, 404, 422),
        description="The grammar is in docs/sending.md (payload filters). `{}` removes the "
        "filter. 422 `invalid_filter` names the place and the problem.",
    ),
)


# -- dashboard ----------------------------------------------------------------------------


def _endpoint_id(request: Request) -> str:
    raw = str(request.path_params["id"])
    if "\x00" in raw or len(raw) > 200:
        raise ops.NotFound(f"{raw[:40]!r} is not a known id")
    return raw


async def _switch(request: Request, form: dict[str, str], paused: bool) -> dashboard.Notice:
    done = "paused" if paused else "resumed"
    r = EndpointActionRequest.model_validate(
        {"reason": form.get("reason") or f"{done} from the dashboard"}
    )
    result = await endpoint_pause(
        dashboard.box_of(request),
        _endpoint_id(request),
        paused=paused,
        actor=dashboard.actor_of(request),
        reason=r.reason,
    )
    return f"endpoint_{done}", result.waiting


@dashboard.action
async def endpoint_pause_action(request: Request, form: dict[str, str]) -> dashboard.Notice:
    return await _switch(request, form, True)


@dashboard.action
async def endpoint_resume_action(request: Request, form: dict[str, str]) -> dashboard.Notice:
    return await _switch(request, form, False)


@dashboard.action
async def endpoint_replay_missing_action(
    request: Request, form: dict[str, str]
) -> dashboard.Notice:
    body = ReplayMissingRequest.model_validate(
        {
            "since": form.get("since") or "24h",
            "reason": form.get("reason") or "replayed from the dashboard",
        }
    )
    result = await endpoint_replay_missing(
        dashboard.box_of(request), _endpoint_id(request), body, actor=dashboard.actor_of(request)
    )
    return "replayed_missing", result.queued


FLOW_PAGES = (
    Route("/endpoints/{id:str}/pause", endpoint_pause_action, methods=["POST"]),
    Route("/endpoints/{id:str}/resume", endpoint_resume_action, methods=["POST"]),
    Route("/endpoints/{id:str}/replay-missing", endpoint_replay_missing_action, methods=["POST"]),
)
