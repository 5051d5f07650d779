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
from relaybox.timespec import TIME_FORMS, TimeSpec

if TYPE_CHECKING:
    from relaybox.runtime import Runtime
    from relaybox.store.outbox_flow import ReplayJob

__all__ = [
    "FilterRequest",
    "FilterResult",
    "InvalidFilterRequest",
    "PauseResult",
    "ReplayMissingRequest",
    "ReplayMissingResult",
    "endpoint_pause",
    "endpoint_replay_job",
    "endpoint_replay_missing",
    "endpoint_set_filter",
    "replay_result",
]

log = structlog.get_logger("relaybox.admin")


class InvalidFilterRequest(OpsError, status=422, code="invalid_filter"):
    """A payload filter outside the grammar (422 ``invalid_filter``)."""


class PauseResult(_Model):
    endpoint_id: str
    paused: bool = Field(description="whether the endpoint is paused, after the action")
    paused_at: float | None
    waiting: int = Field(description="its deliveries waiting (pending)")
    message: str


class ReplayMissingRequest(EndpointActionRequest):
    since: TimeSpec = Field(description=f"messages published at or after: {TIME_FORMS}")
    limit: int | None = Field(
        None, ge=1, description="deliveries to queue at most (default and cap: replay_max)"
    )


class ReplayMissingResult(_Model):
    id: str = Field(description="the job's id (rpl_…)")
    endpoint_id: str
    status: str = Field(description="queued, running, done or failed")
    since: float
    until: float = Field(description="messages published up to this time (the request's)")
    limit: int = Field(description="deliveries the job queues at most")
    queued: int = Field(description="deliveries created so far")
    scanned: int = Field(description="messages without a delivery read so far")
    complete: bool = Field(description="done, and every message up to until was read")
    resume_since: float | None = Field(
        description="when done and not complete (a limit reached): since of the next replay"
    )
    error: str | None = Field(description="why it failed (the endpoint deleted or disabled)")
    created_at: float
    started_at: float | None
    finished_at: float | None
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
    backlog = (await box.store.outbox.endpoint_backlog()).get(endpoint_id)
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
    """Queue a replay-missing job: a dispatcher delivers the messages since
    ``body.since`` the endpoint's subscription matches and it has no delivery of;
    409 ``endpoint_disabled``, 409 ``replay_running``."""
    from relaybox.outbound.replays import start_replay

    since = body.since
    await _endpoint(box, endpoint_id)
    job = await start_replay(box, endpoint_id, since=since, tenant=None, limit=body.limit)
    if job is None:  # deleted meanwhile
        raise NotFound(f"no endpoint {endpoint_id}")
    log.info(
        "endpoint_action",
        action="replay_missing",
        endpoint_id=endpoint_id,
        actor=actor,
        reason=body.reason,
        since=since,
        job_id=job.id,
    )
    return replay_result(job)


async def endpoint_replay_job(box: Runtime, endpoint_id: str, job_id: str) -> ReplayMissingResult:
    """The endpoint's replay-missing job, by id (404 when there is none)."""
    from relaybox.outbound.replays import get_replay

    job = await get_replay(box, job_id, tenant=None, endpoint_id=endpoint_id)
    if job is None:
        raise NotFound(f"no replay job {job_id} of endpoint {endpoint_id}")
    return replay_result(job)


def replay_result(job: ReplayJob) -> ReplayMissingResult:
    """The job as the admin API shows it, with a sentence saying where it is."""
    from relaybox.outbound.replays import job_json

    shown = job_json(job)
    if job.status in ("queued", "running"):
        message = (
            f"replay job {job.id} {job.status}: {job.queued} missing deliver(ies) queued, "
            f"{job.scanned} messages read so far"
        )
    elif job.status == "failed":
        message = f"replay job {job.id} failed: {job.error}"
    else:
        more = (
            "" if shown["complete"] else f"; more may remain: go on with since={job.resume_since}"
        )
        message = f"{job.queued} missing deliver(ies) queued for {job.endpoint_id}{more}"
    return ReplayMissingResult(**shown, message=message)


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
