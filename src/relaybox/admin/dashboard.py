"""The operator dashboard: server-rendered pages (Jinja2), no JavaScript build, no
CDN, nothing fetched from outside the machine. Reads go through the same functions
as the JSON API (:mod:`relaybox.admin.ops`); every action is a POST form that carries
the session's CSRF token and answers with a redirect (post/redirect/get), so a reload
never repeats a retry.

A page that shows a pending event refreshes itself every second (``<meta refresh>``):
an operator who pressed Retry watches the worker pick it up without a script.
"""

from __future__ import annotations

import difflib
import hmac
import json
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from relaybox.admin import models as m
from relaybox.admin import ops
from relaybox.admin.auth import COOKIE, Session, issue_session, token_ok

if TYPE_CHECKING:
    from relaybox.app import Relaybox

__all__ = [
    "DEAD_PAGES",
    "INBOX_PAGES",
    "OVERVIEW_PAGES",
    "QUARANTINE_PAGES",
    "action",
    "actor_of",
    "box_of",
    "form_of",
    "login_page",
    "page",
    "render",
]

_env = Environment(
    loader=PackageLoader("relaybox.admin", "templates"),
    autoescape=select_autoescape(["html"]),
    trim_blocks=True,
    lstrip_blocks=True,
)


def _ts(value: float | None) -> str:
    if value is None:
        return "-"
    return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _pretty(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


_env.filters["ts"] = _ts
_env.filters["age"] = ops.age_text
_env.filters["pretty"] = _pretty


def box_of(request: Request) -> Relaybox:
    return request.app.state.box


def _base(request: Request) -> str:
    return str(request.scope.get("root_path", ""))


async def render(
    request: Request, template: str, *, status: int = 200, **context: Any
) -> HTMLResponse:
    """A page with the navigation of every available section and the session's CSRF
    token (``csrf``) for the page's forms."""
    session: Session | None = request.scope.get("state", {}).get("admin_session")
    nav = []
    for section in request.app.state.sections:
        if section.nav_path and not await request.app.state.tables.missing(section.requires_tables):
            nav.append((section.name, section.title, section.nav_path))
    html = _env.get_template(template).render(
        base=_base(request),
        nav=nav,
        csrf=session.csrf if session else "",
        notice=request.query_params.get("notice", ""),
        error=request.query_params.get("error", ""),
        **context,
    )
    return HTMLResponse(html, status_code=status)


async def login_page(request: Request, problem: str = "") -> Response:
    """The 401 every protected page answers without a session: the form itself."""
    nxt = request.url.path if request.method == "GET" else _base(request) + "/"
    return await render(request, "login.html", status=401, next=nxt, problem=problem)


async def form_of(request: Request) -> dict[str, str]:
    """An urlencoded form (the dashboard posts nothing else), last value wins."""
    parsed = parse_qs((await request.body()).decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[-1] for k, v in parsed.items()}


def _redirect(url: str, **query: str) -> RedirectResponse:
    query = {k: v for k, v in query.items() if v}
    return RedirectResponse(url + ("?" + urlencode(query) if query else ""), status_code=303)


def page(fn: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """Turn operator errors (unknown id, invalid filter) into a readable page."""

    async def wrapped(request: Request) -> Response:
        try:
            return await fn(request)
        except ops.OpsError as exc:
            return await render(request, "error.html", status=exc.status, message=exc.message)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            return await render(request, "error.html", status=400, message=problems)

    wrapped.__name__ = fn.__name__
    return wrapped


def action(
    fn: Callable[[Request, dict[str, str]], Awaitable[str]],
) -> Callable[[Request], Awaitable[Response]]:
    """A POST form handler: checks the CSRF token, runs ``fn`` (which returns the
    notice to show), and redirects to the form's ``back`` page."""

    async def wrapped(request: Request) -> Response:
        form = await form_of(request)
        session: Session | None = request.scope.get("state", {}).get("admin_session")
        if session is None or not hmac.compare_digest(form.get("csrf", ""), session.csrf):
            return await render(
                request, "error.html", status=403, message="the form expired: reload the page"
            )
        back = form.get("back", "")
        base = _base(request)
        if not back.startswith(base + "/") or "//" in back or "\\" in back:
            back = base + "/"
        try:
            notice = await fn(request, form)
        except ops.OpsError as exc:
            return _redirect(back, error=exc.message)
        except ValidationError as exc:
            return _redirect(back, error="; ".join(e["msg"] for e in exc.errors()))
        return _redirect(back, notice=notice)

    wrapped.__name__ = fn.__name__
    return wrapped


def _filters(request: Request, model: type[BaseModel]) -> Any:
    """Query string → filter model; empty form fields mean "no filter"."""
    raw = {k: v for k, v in request.query_params.items() if v != "" and k in model.model_fields}
    return model.model_validate(raw)


def _next_url(request: Request, cursor: str | None) -> str | None:
    if cursor is None:
        return None
    query = {k: v for k, v in request.query_params.items() if k not in ("cursor", "notice")}
    query["cursor"] = cursor
    return f"{request.url.path}?{urlencode(query)}"


def _path_id(request: Request) -> int:
    raw = request.path_params["id"]
    if not raw.isdigit() or len(raw) > 18:
        raise ops.NotFound(f"{raw!r} is not a known id")
    return int(raw)


def actor_of(request: Request) -> str:
    """Every dashboard user holds the same token, so the record says where, not who."""
    return "dashboard"


# -- login ----------------------------------------------------------------------


async def login(request: Request) -> Response:
    box = box_of(request)
    base = _base(request)
    if request.method == "GET":
        nxt = request.query_params.get("next", base + "/")
        return await render(request, "login.html", next=nxt, problem="")
    form = await form_of(request)
    nxt = form.get("next", base + "/")
    if not nxt.startswith(base + "/") or "//" in nxt or "\\" in nxt:
        nxt = base + "/"  # never redirect off the admin app (open redirect)
    if box.settings.admin_token is None:
        problem = "admin_token is not configured (set RELAYBOX_ADMIN_TOKEN): admin is closed"
        return await render(request, "login.html", status=401, next=nxt, problem=problem)
    if not token_ok(box, form.get("token", "")):
        return await render(request, "login.html", status=401, next=nxt, problem="wrong token")
    cookie, _ = issue_session(box)
    response = RedirectResponse(nxt, status_code=303)
    response.set_cookie(
        COOKIE,
        cookie,
        max_age=int(box.settings.admin.session_ttl),
        path=base or "/",
        httponly=True,
        samesite="strict",
        secure=box.settings.admin.secure_cookie,
    )
    return response


async def _logout(request: Request, form: dict[str, str]) -> str:
    return ""


async def logout(request: Request) -> Response:
    response = await action(_logout)(request)
    if response.status_code == 303:
        response = RedirectResponse(_base(request) + "/login", status_code=303)
        response.delete_cookie(COOKIE, path=_base(request) or "/")
    return response


# -- overview -------------------------------------------------------------------


def _chart(buckets: list[dict[str, Any]]) -> dict[str, Any]:
    """Stacked bars (one per minute) as SVG rectangles: no chart library needed."""
    width, height, pad = 600, 120, 2
    colors = {"done": "#2e7d32", "pending": "#f9a825", "dead": "#c62828", "ignored": "#90a4ae"}
    peak = max((b["total"] for b in buckets), default=0) or 1
    bar = width / max(len(buckets), 1)
    rects = []
    for i, b in enumerate(buckets):
        y = height
        minute = datetime.fromtimestamp(b["minute"] * 60, UTC).strftime("%H:%M")
        for status in ("done", "ignored", "pending", "dead"):
            n = b["by_status"].get(status, 0)
            if not n:
                continue
            h = max(1.0, n / peak * (height - pad))
            y -= h
            rects.append(
                {
                    "x": round(i * bar + 0.5, 2),
                    "y": round(y, 2),
                    "w": round(max(bar - 1, 1), 2),
                    "h": round(h, 2),
                    "color": colors[status],
                    "title": f"{minute} UTC: {n} {status}",
                }
            )
    total = sum(b["total"] for b in buckets)
    return {
        "width": width,
        "height": height,
        "rects": rects,
        "peak": peak,
        "total": total,
        "colors": colors,
    }


@page
async def overview(request: Request) -> Response:
    box = box_of(request)
    stats = await ops.stats(box)
    panels = []
    for section in request.app.state.sections:
        if section.overview is None:
            continue
        if await request.app.state.tables.missing(section.requires_tables):
            continue
        panel = await section.overview(box)
        if panel is not None:
            panels.append(panel)
    chart = _chart(await ops.throughput(box))
    return await render(
        request,
        "overview.html",
        active="overview",
        stats=stats,
        chart=chart,
        panels=panels,
        unregistered=await ops.unregistered_channels(box),
    )


# -- inbox ----------------------------------------------------------------------


@page
async def inbox(request: Request) -> Response:
    f = _filters(request, m.InboxFilter)
    result = await ops.inbox_list(box_of(request), f)
    return await render(
        request,
        "inbox.html",
        active="inbox",
        f=f,
        page=result,
        next_url=_next_url(request, result.next_cursor),
    )


@page
async def event(request: Request) -> Response:
    detail = await ops.event_get(box_of(request), _path_id(request))
    return await render(request, "event.html", active="inbox", e=detail)


@action
async def event_replay(request: Request, form: dict[str, str]) -> str:
    r = m.ReplayRequest(reason=form.get("reason") or "replayed from the dashboard")
    result = await ops.replay_event(
        box_of(request), _path_id(request), actor=actor_of(request), reason=r.reason
    )
    return result.message


# -- dead letters ---------------------------------------------------------------


@page
async def dead(request: Request) -> Response:
    f = _filters(request, m.DeadFilter)
    result = await ops.dead_list(box_of(request), f)
    return await render(
        request,
        "dead.html",
        active="dead",
        f=f,
        page=result,
        next_url=_next_url(request, result.next_cursor),
    )


@action
async def dead_retry(request: Request, form: dict[str, str]) -> str:
    r = m.ReplayRequest(reason=form.get("reason") or "retried from the dashboard")
    result = await ops.dead_retry(
        box_of(request), _path_id(request), actor=actor_of(request), reason=r.reason
    )
    return result.message


@action
async def dead_retry_all(request: Request, form: dict[str, str]) -> str:
    fields = {k: v for k, v in form.items() if v and k in m.DeadRetryRequest.model_fields}
    fields.setdefault("reason", "retried from the dashboard (all matching)")
    result = await ops.dead_retry_many(
        box_of(request), m.DeadRetryRequest.model_validate(fields), actor=actor_of(request)
    )
    return result.message


@action
async def dead_discard(request: Request, form: dict[str, str]) -> str:
    r = m.DiscardRequest.model_validate({"reason": form.get("reason", "")})
    inbox_id = _path_id(request)
    await ops.dead_discard(box_of(request), inbox_id, actor=actor_of(request), reason=r.reason)
    return f"event {inbox_id} discarded"


# -- quarantine -----------------------------------------------------------------


@page
async def quarantine(request: Request) -> Response:
    raw = dict(request.query_params)
    f = _filters(request, m.QuarantineFilter)
    if raw.get("resolved") == "":
        f = f.model_copy(update={"resolved": None})
    result = await ops.quarantine_list(box_of(request), f)
    return await render(
        request,
        "quarantine.html",
        active="quarantine",
        f=f,
        page=result,
        next_url=_next_url(request, result.next_cursor),
    )


def _side_by_side(detail: m.QuarantineDetail) -> Markup:
    left = _pretty(detail.original.payload).splitlines()
    right = _pretty(detail.quarantined.payload).splitlines()
    table = difflib.HtmlDiff(tabsize=2, wrapcolumn=70).make_table(
        left, right, "original", "quarantined", context=False
    )
    return Markup(table)  # HtmlDiff escapes every line it renders


@page
async def quarantine_entry(request: Request) -> Response:
    detail = await ops.quarantine_get(box_of(request), _path_id(request))
    return await render(
        request, "quarantine_entry.html", active="quarantine", q=detail, diff=_side_by_side(detail)
    )


@action
async def quarantine_resolve(request: Request, form: dict[str, str]) -> str:
    r = m.ResolveRequest.model_validate(
        {"resolution": form.get("resolution", ""), "reason": form.get("reason", "")}
    )
    qid = _path_id(request)
    await ops.quarantine_resolve(
        box_of(request), qid, resolution=r.resolution, actor=actor_of(request), reason=r.reason
    )
    return f"quarantine entry {qid} resolved ({r.resolution})"


OVERVIEW_PAGES = (
    Route("/", overview, methods=["GET"]),
    Route("/login", login, methods=["GET", "POST"]),
    Route("/logout", logout, methods=["POST"]),
)
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
