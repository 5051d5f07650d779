"""The operator use cases of an endpoint's flow, shared by the admin API and the
dashboard: pause, resume, replay missing, and setting its payload filter. They call
what the tenant API and the CLI call (:mod:`relaybox.outbound.flow`,
:func:`relaybox.outbound.endpoints.update_endpoint`); who acted and why go into the
log (``endpoint_action``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog
from pydantic import Field

from relaybox.errors import Conflict, NotFound, OpsError
from relaybox.ops.outbound_models import EndpointActionRequest, _Model
from relaybox.outbound.filters import InvalidFilter
from relaybox.timespec import TIME_FORMS, parse_time

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = [
    "FilterRequest",
    "FilterResult",
    "InvalidFilterRequest",
    "PauseResult",
    "ReplayMissingRequest",
    "ReplayMissingResult",
    "endpoint_pause",
    "endpoint_replay_missing",
    "endpoint_set_filter",
]

log = structlog.get_logger("relaybox.admin")


class InvalidFilterRequest(OpsError):
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


async def _endpoint(box: Runtime, endpoint_id: str) -> Any:
    from relaybox.outbound.endpoints import get_endpoint

    found = await get_endpoint(box, endpoint_id, None)
    if found is None:
        raise NotFound(f"no endpoint {endpoint_id}")
    return found


async def _waiting(box: Runtime, endpoint_id: str) -> int:
    backlog = (await box.store.endpoint_backlog()).get(endpoint_id)
    return backlog.pending if backlog else 0


async def endpoint_pause(
    box: Runtime, endpoint_id: str, *, paused: bool, actor: str, reason: str
) -> PauseResult:
    """Pause or resume the endpoint; 409 ``already_paused`` / ``not_paused``."""
    from relaybox.outbound.flow import pause_endpoint, resume_endpoint

    current = await _endpoint(box, endpoint_id)
    if paused and current.paused_at is not None:
        raise Conflict(f"endpoint {endpoint_id} is already paused", code="already_paused")
    if not paused and current.paused_at is None:
        raise Conflict(f"endpoint {endpoint_id} is not paused", code="not_paused")
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
    box: Runtime, endpoint_id: str, body: ReplayMissingRequest, *, actor: str
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
    box: Runtime, endpoint_id: str, body: FilterRequest, *, actor: str
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
