"""The admin API's operations and the dashboard's actions of an endpoint's flow: pause,
resume, replay missing, and (API only) setting its payload filter; the use cases are
:mod:`relaybox.ops.outbound_flow`."""

from __future__ import annotations

from pydantic import BaseModel
from starlette.requests import Request
from starlette.routing import Route

from relaybox.admin import html
from relaybox.admin.sections import Call, Operation
from relaybox.ops.outbound_flow import (
    FilterRequest,
    FilterResult,
    PauseResult,
    ReplayMissingRequest,
    ReplayMissingResult,
    endpoint_pause,
    endpoint_replay_job,
    endpoint_replay_missing,
    endpoint_set_filter,
)
from relaybox.ops.outbound_models import EndpointActionRequest
from relaybox.timespec import parse_time

__all__ = ["FLOW_OPERATIONS", "FLOW_PAGES"]


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


async def _replay_job(c: Call) -> BaseModel:
    return await endpoint_replay_job(c.box, c.path["id"], c.path["job"])


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
        status=202,
        errors=(400, 404, 409),
        description="Messages published while the endpoint was disabled or before it "
        "existed: each gets one delivery, however often this runs (the delivery key is "
        "unique). The answer is a job (`id`, `status` queued) that a dispatcher runs in "
        "batches of `outbound.replay_batch` messages; `getReplayMissing` shows its progress. "
        "At most `limit` (and `outbound.replay_max`) deliveries per job; when done, "
        "`complete` false and `resume_since` say more may remain. 409 `endpoint_disabled`: "
        "enable it first; 409 `replay_running`: the endpoint has a job queued or running.",
    ),
    Operation(
        "GET",
        "/endpoints/{id:str}/replay-missing/{job:str}",
        "getReplayMissing",
        "A replay-missing job: its status and what it queued so far",
        _replay_job,
        ReplayMissingResult,
        errors=(404,),
        description="`status`: queued, running, done or failed (`error` says why: the "
        "endpoint was deleted or disabled).",
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


async def _switch(request: Request, form: dict[str, str], paused: bool) -> html.Notice:
    done = "paused" if paused else "resumed"
    r = EndpointActionRequest.model_validate(
        {"reason": form.get("reason") or f"{done} from the dashboard"}
    )
    result = await endpoint_pause(
        html.box_of(request),
        html.text_id(request),
        paused=paused,
        actor=html.actor_of(request),
        reason=r.reason,
    )
    return f"endpoint_{done}", result.waiting


@html.action
async def endpoint_pause_action(request: Request, form: dict[str, str]) -> html.Notice:
    return await _switch(request, form, True)


@html.action
async def endpoint_resume_action(request: Request, form: dict[str, str]) -> html.Notice:
    return await _switch(request, form, False)


@html.action
async def endpoint_replay_missing_action(request: Request, form: dict[str, str]) -> html.Notice:
    now = html.box_of(request).clock.now()
    body = ReplayMissingRequest.model_validate(
        {
            # Parsed here so that a bad time reads as one (bad_time), not a bad form.
            "since": parse_time(form.get("since") or "24h", now),
            "reason": form.get("reason") or "replayed from the dashboard",
        }
    )
    await endpoint_replay_missing(
        html.box_of(request), html.text_id(request), body, actor=html.actor_of(request)
    )
    return "replay_started"


FLOW_PAGES = (
    Route("/endpoints/{id:str}/pause", endpoint_pause_action, methods=["POST"]),
    Route("/endpoints/{id:str}/resume", endpoint_resume_action, methods=["POST"]),
    Route("/endpoints/{id:str}/replay-missing", endpoint_replay_missing_action, methods=["POST"]),
)
