"""The dashboard's sending views: the delivery log of every tenant (status, tenant,
event type, time in the CLI's grammar, message id or idempotency key) with a chart of
delivery attempts per minute by result (server-rendered SVG), each attempt's request
and response on a message's page, and endpoint create, edit, rotate and test event.

The delivery table and the attempt blocks are the tenant portal's templates
(``portal/templates/_deliveries.html``), rendered here for the dashboard's pages.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from importlib import resources
from typing import TYPE_CHECKING, Any

from jinja2 import FileSystemLoader
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from relaybox.admin import html
from relaybox.browser import page_environment
from relaybox.errors import Conflict, InvalidRequest, InvalidTimeSpec, NotFound
from relaybox.ops.delivery_log import LogFilter, delivery_log, message_view
from relaybox.outbound import endpoints
from relaybox.outbound.catalog import InvalidMessage
from relaybox.outbound.endpoints import EndpointPatch, EndpointSpec, InvalidEndpoint
from relaybox.outbound.publish import publish
from relaybox.timespec import TIME_FORMS, parse_time_or_none

if TYPE_CHECKING:
    from relaybox.runtime import Runtime
    from relaybox.store.outbox_rows import Endpoint

__all__ = ["PAGES", "attempts_html", "chart_svg"]

_PORTAL_TEMPLATES = resources.files("relaybox").joinpath("portal/templates")
_SHARED = page_environment(FileSystemLoader(str(_PORTAL_TEMPLATES)))


def _pretty(value: Any) -> str:
    try:
        return json.dumps(json.loads(value), indent=2, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


_SHARED.filters["pretty"] = _pretty

# The dashboard shows notices by code from its table; these are the sending views'.
html.NOTICES.setdefault("endpoint_saved", "The endpoint was saved.")
html.ERRORS.setdefault("invalid_endpoint", "The endpoint was refused: check its URL.")

_STATUSES = ("pending", "sent", "dead", "held")
_KINDS = (("sent", "var(--ok)"), ("failed", "var(--bad)"), ("other", "var(--muted)"))
_FAILED = {"retry", "failed", "gone", "blocked"}


def _macro(name: str, *args: Any) -> Markup:
    module = _SHARED.get_template("_deliveries.html").module
    return Markup(getattr(module, name)(*args))  # rendered by autoescaping templates


async def attempts_html(request: Request, message_id: str) -> Markup:
    """The message's attempts as the portal shows them: request (headers, body) and
    response (status, headers, first bytes)."""
    found = await message_view(html.box_of(request), message_id, None)
    if found is None:
        return Markup("")
    return Markup("").join(_macro("attempt_block", a) for a in found["attempts"])


def chart_svg(counts: list[tuple[float, str, int]], start: float, minutes: int) -> Markup:
    """Stacked bars, one per minute from ``start``: attempts sent, failed (retry,
    failed, gone, blocked) and other (uncertain, fenced)."""
    per: dict[int, dict[str, int]] = {}
    for minute, outcome, n in counts:
        slot = int((minute - start) // 60)
        if not 0 <= slot < minutes:
            continue
        kind = "sent" if outcome == "sent" else "failed" if outcome in _FAILED else "other"
        bucket = per.setdefault(slot, {})
        bucket[kind] = bucket.get(kind, 0) + n
    top = max((sum(b.values()) for b in per.values()), default=0) or 1
    width, height, bar = minutes * 12, 120, 10
    parts = [
        f'<svg class="chart" role="img" width="{width}" height="{height + 20}" '
        f'viewBox="0 0 {width} {height + 20}" data-peak="{top}">',
        f"<title>Delivery attempts per minute (peak {top})</title>",
    ]
    for slot, bucket in sorted(per.items()):
        y = float(height)
        for kind, color in _KINDS:
            n = bucket.get(kind, 0)
            if not n:
                continue
            h = n / top * height
            y -= h
            parts.append(
                f'<rect x="{slot * 12}" y="{y:.1f}" width="{bar}" height="{h:.1f}" '
                f'fill="{color}" data-kind="{kind}" data-n="{n}"><title>{kind}: {n}</title></rect>'
            )
    label = datetime.fromtimestamp(start, UTC).strftime("%H:%M")
    parts.append(f'<text x="0" y="{height + 14}" font-size="10">{label} UTC</text>')
    parts.append(f'<text x="{width - 30}" y="{height + 14}" font-size="10">now</text></svg>')
    return Markup("".join(parts))  # numbers and fixed words only


@html.page
async def deliveries_page(request: Request) -> Response:
    box, q = html.box_of(request), request.query_params
    now = box.clock.now()
    try:
        since = parse_time_or_none(q.get("since"), now)
        until = parse_time_or_none(q.get("until"), now)
    except InvalidTimeSpec as exc:
        raise InvalidRequest(f"{exc.message} (since and until take {TIME_FORMS})") from None
    status = q.get("status", "")
    if status and status not in _STATUSES:
        raise InvalidRequest(f"status is one of {', '.join(_STATUSES)}")
    log = LogFilter(
        status=status,
        event_type=q.get("type", "").strip(),
        since=since,
        until=until,
    )
    tenant = q.get("tenant", "").strip() or None
    rows = await _search(box, tenant, log, q.get("q", ""))
    start = (now // 60 - 59) * 60
    chart = chart_svg(await box.store.outbox.attempt_minutes(start), start, 60)
    table = _macro("delivery_table", rows, _base(request), True)
    return await html.render(
        request,
        "deliveries.html",
        active="deliveries",
        table=table,
        chart=chart,
        q=q,
        statuses=_STATUSES,
        time_forms=TIME_FORMS,
    )


async def _search(
    box: Runtime, tenant: str | None, log: LogFilter, search: str
) -> list[dict[str, Any]]:
    """The log under the one search box, "message id or idempotency key": a value that
    looks like a message id (``msg_…``, spaces around it ignored) is looked up as one;
    when that finds nothing, and for any other value, it is an idempotency key matched
    exactly as typed (case and spaces too), as the portal and the tenant API match
    keys — so a key that itself starts with ``msg_`` is found as well."""
    if not search:
        return await delivery_log(box, tenant, log, limit=100)
    as_id = search.strip()
    if as_id.startswith("msg_"):
        rows = await delivery_log(box, tenant, replace(log, message_id=as_id), limit=100)
        if rows:
            return rows
    return await delivery_log(box, tenant, replace(log, idempotency_key=search), limit=100)


def _base(request: Request) -> str:
    return str(request.scope.get("root_path", ""))


def _patterns(raw: str) -> list[str] | None:
    found = [p for p in raw.replace(",", " ").split() if p]
    return found or None


async def _secret_page(request: Request, endpoint_id: str, secret: str, what: str) -> Response:
    return await html.render(
        request,
        "endpoint_secret.html",
        active="endpoints",
        endpoint_id=endpoint_id,
        secret=secret,
        what=what,
    )


@html.form_page
async def endpoint_create(request: Request, form: dict[str, str]) -> Response:
    box = html.box_of(request)
    tenant = form.get("tenant", "").strip()
    try:
        if not tenant or len(tenant) > 200:
            raise InvalidRequest("tenant is required (1-200 characters)")
        spec = EndpointSpec(
            url=form.get("url", "").strip(),
            description=form.get("description", "").strip() or None,
            event_types=_patterns(form.get("event_types", "")),
        )
        created, secret = await endpoints.create_endpoint(box, tenant, spec)
    except (InvalidEndpoint, InvalidRequest, ValueError) as exc:
        message = getattr(exc, "message", None) or str(exc)
        return await html.render(request, "error.html", status=422, message=message[:500])
    return await _secret_page(request, created.id, secret, "created")


async def _endpoint(request: Request) -> Endpoint:
    """The endpoint the address names (:class:`NotFound` when there is none)."""
    found = await endpoints.get_endpoint(html.box_of(request), _id(request), None)
    if found is None:
        raise NotFound("no such endpoint")
    return found


def _id(request: Request) -> str:
    return str(request.path_params["id"])


@html.form_page
async def endpoint_rotate(request: Request, form: dict[str, str]) -> Response:
    secret = await endpoints.rotate_secret(html.box_of(request), _id(request), None)
    if secret is None:
        raise NotFound("no such endpoint")
    return await _secret_page(request, _id(request), secret, "rotated")


@html.action
async def endpoint_edit(request: Request, form: dict[str, str]) -> html.Notice:
    box = html.box_of(request)
    found = await _endpoint(request)
    patch = EndpointPatch(
        url=form.get("url", "").strip() or None,
        description=form.get("description", "").strip(),
        event_types=_patterns(form.get("event_types", "")),
    )
    try:
        await endpoints.update_endpoint(box, found.id, found.tenant, patch)
    except InvalidEndpoint as exc:
        raise InvalidRequest(str(exc), hint="invalid_endpoint") from None
    return "endpoint_saved"


@html.form_page
async def endpoint_test(request: Request, form: dict[str, str]) -> Response:
    box = html.box_of(request)
    found = await _endpoint(request)
    if found.status != "enabled":
        raise Conflict("the endpoint is disabled: enable it first")
    try:
        async with box.store.transaction() as conn:
            message_id = (
                await publish(
                    box,
                    conn,
                    "relaybox.test",
                    {"message": "relaybox test event"},
                    tenant=found.tenant,
                    endpoint_ids=[found.id],
                )
            ).id
    except InvalidMessage as exc:
        return await html.render(request, "error.html", status=422, message=str(exc))
    return RedirectResponse(f"{_base(request)}/messages/{message_id}", status_code=303)


PAGES = (
    Route("/deliveries", deliveries_page, methods=["GET"]),
    Route("/endpoints/new", endpoint_create, methods=["POST"]),
    Route("/endpoints/{id:str}/edit", endpoint_edit, methods=["POST"]),
    Route("/endpoints/{id:str}/rotate", endpoint_rotate, methods=["POST"]),
    Route("/endpoints/{id:str}/test", endpoint_test, methods=["POST"]),
)
