"""The receiving side's dashboard pages: the inbox and an event's history (Replay),
dead letters (Retry, Retry all matching, Discard), quarantine (side by side, Resolve).
Each reads and acts through :mod:`relaybox.ops.inbound`, as the admin API's
:mod:`relaybox.admin.inbound.api` does."""

from __future__ import annotations

import difflib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from relaybox.admin.html import (
    Notice,
    action,
    actor_of,
    box_of,
    filters_of,
    next_url,
    page,
    path_id,
    pretty,
    render,
)
from relaybox.ops import inbound as ops
from relaybox.ops import inbound_models as m
from relaybox.timespec import TIME_FORMS

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = ["DEAD_PAGES", "INBOX_PAGES", "QUARANTINE_PAGES"]

F = TypeVar("F", m.InboxFilter, m.DeadFilter)


# -- inbox ----------------------------------------------------------------------


def _event_list(
    name: str, filters: type[F], read: Callable[[Runtime, F], Awaitable[m.EventPage]]
) -> Callable[[Request], Awaitable[Response]]:
    """The page ``name`` (``name.html``): events through the filters, a page at a time
    (``read`` is the use case that lists them)."""

    async def listing(request: Request) -> Response:
        f = filters_of(request, filters)
        result = await read(box_of(request), f)
        return await render(
            request,
            f"{name}.html",
            active=name,
            f=f,
            q=request.query_params,
            time_forms=TIME_FORMS,
            page=result,
            next_url=next_url(request, result.next_cursor),
        )

    listing.__name__ = name
    return page(listing)


inbox = _event_list("inbox", m.InboxFilter, ops.inbox_list)


@page
async def event(request: Request) -> Response:
    detail = await ops.event_get(box_of(request), path_id(request))
    return await render(request, "event.html", active="inbox", e=detail)


def _replay_one(
    name: str, replay: Callable[..., Awaitable[m.ReplayResult]], unsaid: str, notice: str
) -> Callable[[Request], Awaitable[Response]]:
    """The form ``name`` that replays the event of the page through ``replay`` (the
    use case), with the reason given or ``unsaid``; its notice is ``notice`` and the
    count."""

    async def replaying(request: Request, form: dict[str, str]) -> Notice:
        r = m.ReplayRequest(reason=form.get("reason") or unsaid)
        result = await replay(
            box_of(request), path_id(request), actor=actor_of(request), reason=r.reason
        )
        return notice, len(result.replayed)

    replaying.__name__ = name
    return action(replaying)


event_replay = _replay_one(
    "event_replay", ops.replay_event, "replayed from the dashboard", "replayed"
)


# -- dead letters ---------------------------------------------------------------


dead = _event_list("dead", m.DeadFilter, ops.dead_list)


dead_retry = _replay_one("dead_retry", ops.dead_retry, "retried from the dashboard", "retried")


@action
async def dead_retry_all(request: Request, form: dict[str, str]) -> Notice:
    fields = {k: v for k, v in form.items() if v and k in m.DeadRetryRequest.model_fields}
    fields.setdefault("reason", "retried from the dashboard (all matching)")
    result = await ops.dead_retry_many(
        box_of(request),
        m.DeadRetryRequest.model_validate(fields, context={"now": box_of(request).clock.now()}),
        actor=actor_of(request),
    )
    return "retried", len(result.replayed)


@action
async def dead_discard(request: Request, form: dict[str, str]) -> Notice:
    r = m.DiscardRequest.model_validate({"reason": form.get("reason", "")})
    inbox_id = path_id(request)
    await ops.dead_discard(box_of(request), inbox_id, actor=actor_of(request), reason=r.reason)
    return "discarded"


# -- quarantine -----------------------------------------------------------------


@page
async def quarantine(request: Request) -> Response:
    raw = dict(request.query_params)
    f = filters_of(request, m.QuarantineFilter)
    if raw.get("resolved") == "":
        f = f.model_copy(update={"resolved": None})
    result = await ops.quarantine_list(box_of(request), f)
    return await render(
        request,
        "quarantine.html",
        active="quarantine",
        f=f,
        page=result,
        next_url=next_url(request, result.next_cursor),
    )


def _side_by_side(detail: m.QuarantineDetail) -> Markup:
    left = pretty(None if detail.original is None else detail.original.payload).splitlines()
    right = pretty(detail.quarantined.payload).splitlines()
    table = difflib.HtmlDiff(tabsize=2, wrapcolumn=70).make_table(
        left, right, "original", "quarantined", context=False
    )
    return Markup(table)  # HtmlDiff escapes every line it renders


@page
async def quarantine_entry(request: Request) -> Response:
    detail = await ops.quarantine_get(box_of(request), path_id(request))
    return await render(
        request, "quarantine_entry.html", active="quarantine", q=detail, diff=_side_by_side(detail)
    )


@action
async def quarantine_resolve(request: Request, form: dict[str, str]) -> Notice:
    r = m.ResolveRequest.model_validate(
        {"resolution": form.get("resolution", ""), "reason": form.get("reason", "")}
    )
    qid = path_id(request)
    await ops.quarantine_resolve(
        box_of(request), qid, resolution=r.resolution, actor=actor_of(request), reason=r.reason
    )
    return "resolved"


INBOX_PAGES = (
    Route("/inbox", inbox, methods=["GET"]),
    Route("/inbox/{id}", event, methods=["GET"]),
    Route("/inbox/{id}/replay", event_replay, methods=["POST"]),
)
DEAD_PAGES = (
    Route("/dead", dead, methods=["GET"]),
    Route("/dead/retry", dead_retry_all, methods=["POST"]),
    Route("/dead/{id}/retry", dead_retry, methods=["POST"]),
    Route("/dead/{id}/discard", dead_discard, methods=["POST"]),
)
QUARANTINE_PAGES = (
    Route("/quarantine", quarantine, methods=["GET"]),
    Route("/quarantine/{id}", quarantine_entry, methods=["GET"]),
    Route("/quarantine/{id}/resolve", quarantine_resolve, methods=["POST"]),
)
