"""The dashboard's toolkit: how its pages are made (server-rendered Jinja2, no
JavaScript build, no CDN, nothing fetched from outside the machine), read and guarded,
and its login. The pages themselves live with their side: :mod:`relaybox.admin.overview`,
:mod:`relaybox.admin.inbound.pages`, :mod:`relaybox.admin.outbound.pages`. Reads go
through the same operator use cases as the JSON API (:mod:`relaybox.ops`); every
action is a POST form that carries the session's CSRF token and answers with a
redirect (post/redirect/get), so a reload never repeats a retry.

A page that shows a pending event refreshes itself every second (``<meta refresh>``):
an operator who pressed Retry watches the worker pick it up without a script.

After an action the page shows what happened from ``?notice=<code>`` or
``?error=<code>``: codes of two fixed tables (:data:`NOTICES`, :data:`ERRORS`), never
text from the address, so a link cannot make the dashboard say something it did not
(an unknown code shows nothing). Forms are read with a size limit before anything
else (``admin.login_max_body``, ``admin.form_max_body``), and logins are throttled
per client address and overall (``admin.login_failures_*``).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import parse_qs, urlencode

from jinja2 import PackageLoader
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from relaybox.admin.auth import (
    COOKIE,
    SESSIONS_TABLE,
    Session,
    issue_session,
    revoke_session,
    token_ok,
)
from relaybox.browser import notice_text, page_environment
from relaybox.errors import InvalidRequest, NotFound, OpsError
from relaybox.limits import FailureThrottle
from relaybox.ops import inbound as ops
from relaybox.wire import BodyTooLarge, HTMLAnswer, read_body, text_problem

if TYPE_CHECKING:
    from relaybox.app import Relaybox

__all__ = [
    "ERRORS",
    "NOTICES",
    "SESSION_PAGES",
    "Notice",
    "action",
    "actor_of",
    "box_of",
    "checked_form",
    "filters_of",
    "form_of",
    "form_page",
    "login_page",
    "next_url",
    "page",
    "path_id",
    "pretty",
    "render",
    "text_id",
]

_env = page_environment(PackageLoader("relaybox.admin", "templates"))


def pretty(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


_env.filters["age"] = ops.age_text
_env.filters["pretty"] = pretty


NOTICES: dict[str, str] = {
    "replayed": "{n} event(s) back to pending: the worker runs them again.",
    "retried": "{n} event(s) back to pending.",
    "discarded": "The dead letter was discarded.",
    "resolved": "The quarantine entry was resolved.",
    "redelivered": "{n} deliver(ies) sent again.",
    "endpoint_disabled": "The endpoint was disabled: its waiting deliveries are dead "
    "letters until it is enabled and they are recovered.",
    "endpoint_enabled": "The endpoint was enabled.",
    "recovered": "{n} dead deliver(ies) queued again.",
    "endpoint_paused": "The endpoint was paused: its {n} waiting deliveries (and new ones) "
    "wait until it is resumed.",
    "endpoint_resumed": "The endpoint was resumed: its {n} waiting deliveries go out.",
    "replay_started": "Replay missing started: a dispatcher queues the missing deliveries; "
    "this page shows its progress.",
    "retention_set": "The tenant's retention was saved: the next purge applies it.",
    "retention_cleared": "The tenant's retention set here was removed: the configuration "
    "file's ages (or the default ones) apply again.",
}
"""What ``?notice=<code>`` shows; ``{n}`` is the count from ``?n=`` (digits only)."""

ERRORS: dict[str, str] = {
    "invalid_request": "A value in the form is not valid.",
    "invalid_form": "A field of the form is missing or not valid (a discard or a "
    "resolution needs a reason).",
    "not_found": "There is no such row (any more).",
    "conflict": "The row is not in the state this action needs.",
    "pending": "The event is pending: it is already on its way.",
    "payload_purged": "Retention dropped the payload: it cannot be run again.",
    "not_dead": "The event is not a dead letter (any more).",
    "resolved": "The quarantine entry is already resolved.",
    "nothing_to_redeliver": "This message has nothing to redeliver.",
    "already_disabled": "The endpoint is already disabled.",
    "already_enabled": "The endpoint is already enabled.",
    "endpoint_disabled": "The endpoint is disabled: enable it first, or the recovered "
    "deliveries would only wait.",
    "bad_time": "since and until take 24h (that long ago), an ISO 8601 time "
    "(2026-03-13T00:00:00Z) or epoch seconds.",
    "since_required": "since is required: 24h, 2026-03-13T00:00:00Z or epoch seconds.",
    "until_before_since": "until must be after since.",
    "already_paused": "The endpoint is already paused.",
    "not_paused": "The endpoint is not paused.",
    "replay_running": "A replay of this endpoint is already queued or running: wait for it "
    "to finish (this page shows it).",
    "bad_age": "An age takes 7d, 12h, 90m or seconds, from one minute to ten years.",
    "invalid_policy": "Give a tenant id (1 to 128 characters) and at least one age; to go "
    "back to the configuration's ages, remove the tenant's retention instead.",
    "too_many_policies": "retention.max_tenant_policies tenants have a retention policy "
    "already: remove one first.",
}
"""What ``?error=<code>`` shows: the dashboard's own messages for the codes its
actions fail with."""


def _flash(query: Any) -> tuple[str, str]:
    """(notice, error) for a page's query string: table entries only."""
    notice = notice_text(NOTICES, query.get("notice", ""), query.get("n", ""))
    return notice, ERRORS.get(query.get("error", ""), "")


def box_of(request: Request) -> Relaybox:
    return cast("Relaybox", request.app.state.box)


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
    notice, error = _flash(request.query_params)
    html = _env.get_template(template).render(
        base=_base(request),
        nav=nav,
        csrf=session.csrf if session else "",
        notice=notice,
        error=error,
        **context,
    )
    # HTMLAnswer: a payload may hold a lone surrogate its provider escaped.
    return HTMLAnswer(html, status_code=status)


async def login_page(request: Request, problem: str = "") -> Response:
    """The 401 every protected page answers without a session: the form itself."""
    nxt = request.url.path if request.method == "GET" else _base(request) + "/"
    return await render(request, "login.html", status=401, next=nxt, problem=problem)


async def form_of(request: Request, limit: int | None = None) -> dict[str, str]:
    """An urlencoded form (the dashboard posts nothing else), last value wins, read
    with a size limit (default ``admin.form_max_body``; :class:`BodyTooLarge` above
    it). A value with a NUL character is an :class:`InvalidRequest`."""
    if limit is None:
        limit = box_of(request).settings.admin.form_max_body
    raw = await read_body(request, limit)
    parsed = parse_qs(raw.decode("utf-8", "replace"), keep_blank_values=True)
    form = {k: v[-1] for k, v in parsed.items()}
    problem = text_problem(form, "form")
    if problem:
        raise InvalidRequest(problem)
    return form


def _redirect(url: str, **query: str) -> RedirectResponse:
    query = {k: v for k, v in query.items() if v}
    return RedirectResponse(url + ("?" + urlencode(query) if query else ""), status_code=303)


async def _too_large(request: Request, exc: BodyTooLarge) -> Response:
    return await render(request, "error.html", status=413, message=f"the form is {exc}"[:200])


Notice = str | tuple[str, int]
"""What an action returns: a code of :data:`NOTICES`, with a count when it has ``{n}``."""


def page(fn: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """Turn operator errors (unknown id, invalid filter) into a readable page."""

    async def wrapped(request: Request) -> Response:
        problem = text_problem(dict(request.query_params), "query")
        if problem:
            return await render(request, "error.html", status=400, message=problem)
        try:
            return await fn(request)
        except OpsError as exc:
            return await render(request, "error.html", status=exc.status, message=exc.message)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            return await render(request, "error.html", status=400, message=problems)

    wrapped.__name__ = fn.__name__
    return wrapped


async def checked_form(request: Request) -> dict[str, str] | Response:
    """The form of a POST from one of the session's pages, or the page that refuses
    it (too large, text no database stores, CSRF token missing or wrong)."""
    try:
        form = await form_of(request)
    except BodyTooLarge as exc:
        return await _too_large(request, exc)
    except OpsError as exc:
        return await render(request, "error.html", status=exc.status, message=exc.message)
    session: Session | None = request.scope.get("state", {}).get("admin_session")
    if session is None or not hmac.compare_digest(form.get("csrf", ""), session.csrf):
        return await render(
            request, "error.html", status=403, message="the form expired: reload the page"
        )
    return form


def form_page(
    fn: Callable[[Request, dict[str, str]], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """A POST form handler answering with a page of its own: runs ``fn(request,
    form)`` once the form passed :func:`checked_form`, else answers with the page that
    refuses it; an operator error ``fn`` raises is the error page, as :func:`page`'s."""

    async def wrapped(request: Request) -> Response:
        form = await checked_form(request)
        if isinstance(form, Response):
            return form
        try:
            return await fn(request, form)
        except OpsError as exc:
            return await render(request, "error.html", status=exc.status, message=exc.message)

    wrapped.__name__ = fn.__name__
    return wrapped


def action(
    fn: Callable[[Request, dict[str, str]], Awaitable[Notice]],
) -> Callable[[Request], Awaitable[Response]]:
    """A POST form handler (:func:`form_page`) that runs ``fn`` (which returns the
    notice's code), and redirects to the form's ``back`` page with that code, or with
    the error's code when it failed."""

    async def act(request: Request, form: dict[str, str]) -> Response:
        back = form.get("back", "")
        base = _base(request)
        if not back.startswith(base + "/") or "//" in back or "\\" in back:
            back = base + "/"
        try:
            notice = await fn(request, form)
        except OpsError as exc:
            code = exc.hint or exc.code
            return _redirect(back, error=code if code in ERRORS else "invalid_request")
        except ValidationError:
            return _redirect(back, error="invalid_form")
        if isinstance(notice, tuple):
            return _redirect(back, notice=notice[0], n=str(notice[1]))
        return _redirect(back, notice=notice)

    act.__name__ = fn.__name__
    return form_page(act)


def filters_of(request: Request, model: type[BaseModel]) -> Any:
    """Query string → filter model; empty form fields mean "no filter"."""
    raw = {k: v for k, v in request.query_params.items() if v != "" and k in model.model_fields}
    return model.model_validate(raw, context={"now": box_of(request).clock.now()})


def next_url(request: Request, cursor: str | None) -> str | None:
    if cursor is None:
        return None
    query = {k: v for k, v in request.query_params.items() if k not in ("cursor", "notice")}
    query["cursor"] = cursor
    return f"{request.url.path}?{urlencode(query)}"


def path_id(request: Request) -> int:
    raw = request.path_params["id"]
    if not raw.isdigit() or len(raw) > 18:
        raise NotFound(f"{raw!r} is not a known id")
    return int(raw)


def text_id(request: Request) -> str:
    """The text id in the address (``{id:str}``: an endpoint's, a message's)."""
    raw = str(request.path_params["id"])
    if "\x00" in raw or len(raw) > 200:
        raise NotFound(f"{raw[:40]!r} is not a known id")
    return raw


def actor_of(request: Request) -> str:
    """Every dashboard user holds the same token, so the record says where, not who."""
    return "dashboard"


# -- login ----------------------------------------------------------------------


def _safe_next(nxt: str, base: str) -> str:
    if not nxt.startswith(base + "/") or "//" in nxt or "\\" in nxt or "\x00" in nxt:
        return base + "/"  # never redirect off the admin app (open redirect)
    return nxt[:2000]


async def login(request: Request) -> Response:
    box = box_of(request)
    base = _base(request)
    if request.method == "GET":
        nxt = _safe_next(request.query_params.get("next", base + "/"), base)
        return await render(request, "login.html", next=nxt, problem="")
    throttle: FailureThrottle = request.app.state.login_throttle
    address = request.client.host if request.client else "unknown"
    wait = throttle.blocked(address)
    if wait:
        # Before the body is read or the token compared: a guess made now is not
        # even looked at, right or wrong.
        problem = f"too many wrong tokens: try again in {wait:.0f} s"
        refused = await render(request, "login.html", status=429, next=base + "/", problem=problem)
        refused.headers["Retry-After"] = f"{wait:.0f}"
        return refused
    try:
        form = await form_of(request, box.settings.admin.login_max_body)
    except BodyTooLarge as exc:
        problem = f"the login form is {exc}"
        return await render(request, "login.html", status=413, next=base + "/", problem=problem)
    except OpsError as exc:
        return await render(request, "login.html", status=400, next=base + "/", problem=exc.message)
    nxt = _safe_next(form.get("next", base + "/"), base)
    if box.settings.admin_token is None:
        problem = "admin_token is not configured (set RELAYBOX_ADMIN_TOKEN): admin is closed"
        return await render(request, "login.html", status=401, next=nxt, problem=problem)
    if not token_ok(box, form.get("token", "")):
        throttle.failed(address)
        return await render(request, "login.html", status=401, next=nxt, problem="wrong token")
    throttle.succeeded(address)
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


@form_page
async def logout(request: Request, form: dict[str, str]) -> Response:
    """End the session for every process (revoked in the database), then forget the
    cookie. On a database without the sessions table the cookie is forgotten here
    but stays valid until it expires: the page says so."""
    base = _base(request)
    response: Response
    if await request.app.state.tables.missing((SESSIONS_TABLE,)):
        message = (
            f"Logged out in this browser only: table {SESSIONS_TABLE} does not exist, "
            "so the session could not be revoked and a copy of its cookie works until "
            "it expires. Run migrations (relaybox migrate)."
        )
        response = await render(request, "error.html", status=503, message=message)
    else:
        await revoke_session(box_of(request), request.scope["state"]["admin_session"])
        response = RedirectResponse(base + "/login", status_code=303)
    response.delete_cookie(COOKIE, path=base or "/")
    return response


SESSION_PAGES = (
    Route("/login", login, methods=["GET", "POST"]),
    Route("/logout", logout, methods=["POST"]),
)
