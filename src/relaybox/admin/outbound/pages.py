"""The dashboard's pages and actions of the endpoints and messages sections."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from relaybox.admin import html
from relaybox.admin.outbound import sending
from relaybox.errors import InvalidRequest, InvalidTimeSpec
from relaybox.ops.outbound import (
    endpoint_disable,
    endpoint_enable,
    endpoint_get,
    endpoint_list,
    endpoint_recover,
    message_get,
    message_list,
    message_redeliver,
)
from relaybox.ops.outbound_flow import replay_result
from relaybox.ops.outbound_models import (
    EndpointActionRequest,
    EndpointFilter,
    MessageFilter,
    RecoverRequest,
    RedeliverRequest,
)
from relaybox.timespec import parse_time_or_none

if TYPE_CHECKING:
    pass


log = structlog.get_logger("relaybox.admin")


# -- pages ------------------------------------------------------------------------


@html.page
async def endpoints_page(request: Request) -> Response:
    f = html.filters_of(request, EndpointFilter)
    result = await endpoint_list(html.box_of(request), f)
    return await html.render(request, "endpoints.html", active="endpoints", f=f, page=result)


@html.page
async def endpoint_page(request: Request) -> Response:
    box = html.box_of(request)
    detail = await endpoint_get(box, html.text_id(request))
    latest = await box.store.flow.replay_job_latest(detail.id)
    replay = None if latest is None else replay_result(latest)
    return await html.render(request, "endpoint.html", active="endpoints", e=detail, replay=replay)


@html.page
async def messages_page(request: Request) -> Response:
    f = html.filters_of(request, MessageFilter)
    result = await message_list(html.box_of(request), f)
    next_url = None
    if result.next_cursor:
        next_url = f"{request.url.path}?cursor={result.next_cursor}"
    return await html.render(
        request, "messages.html", active="messages", f=f, page=result, next_url=next_url
    )


@html.page
async def message_page(request: Request) -> Response:
    detail = await message_get(html.box_of(request), html.text_id(request))
    attempts = await sending.attempts_html(request, detail.id)
    return await html.render(
        request, "message.html", active="messages", m=detail, attempts_html=attempts
    )


@html.action
async def message_redeliver_action(request: Request, form: dict[str, str]) -> html.Notice:
    RedeliverRequest.model_validate(
        {"reason": form.get("reason") or "redelivered from the dashboard"}
    )
    result = await message_redeliver(
        html.box_of(request),
        html.text_id(request),
        endpoint_id=form.get("endpoint_id") or None,
    )
    return "redelivered", result.redelivered


async def _endpoint_switch(
    request: Request, form: dict[str, str], switch: Any, done: str
) -> html.Notice:
    """Disable or enable from the dashboard: the form's reason, or what was done."""
    r = EndpointActionRequest.model_validate(
        {"reason": form.get("reason") or f"{done} from the dashboard"}
    )
    await switch(
        html.box_of(request),
        html.text_id(request),
        actor=html.actor_of(request),
        reason=r.reason,
    )
    return f"endpoint_{done}"


@html.action
async def endpoint_disable_action(request: Request, form: dict[str, str]) -> html.Notice:
    return await _endpoint_switch(request, form, endpoint_disable, "disabled")


@html.action
async def endpoint_enable_action(request: Request, form: dict[str, str]) -> html.Notice:
    return await _endpoint_switch(request, form, endpoint_enable, "enabled")


@html.action
async def endpoint_recover_action(request: Request, form: dict[str, str]) -> html.Notice:
    box = html.box_of(request)
    now = box.clock.now()
    try:  # the CLI's forms of a time: 24h (ago), ISO 8601 (UTC unless told), epoch
        since = parse_time_or_none(form.get("since"), now)
        until = parse_time_or_none(form.get("until"), now)
    except InvalidTimeSpec as exc:
        raise InvalidRequest(exc.message, hint="bad_time") from None
    if since is None:
        raise InvalidRequest(
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
        html.text_id(request),
        since=r.since,
        until=r.until,
        actor=html.actor_of(request),
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
