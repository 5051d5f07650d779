"""The portal's pages and actions, every one scoped to the session's tenant: an id of
another tenant's endpoint or message answers 404, as an id that does not exist.

    GET   /enter/<link>                         start a session, go to the endpoints
                                                (a single-use link: once)
    GET   /logged-out                           what a logout leaves: no session
    GET   /s/<session>/                         the endpoints
    GET   /s/<session>/endpoints                list, and the form that creates one
    POST  /s/<session>/endpoints                create (the page shows its secret once)
    GET   /s/<session>/endpoints/<id>           edit, disable/enable, delete, secret, test
    POST  /s/<session>/endpoints/<id>           save the edit
    POST  /s/<session>/endpoints/<id>/enable | disable | pause | resume | delete | test
    POST  /s/<session>/endpoints/<id>/secret           reveal the active secrets
    POST  /s/<session>/endpoints/<id>/secret/rotate    a new secret; the old one
                                                       keeps signing for the grace
    GET   /s/<session>/event-types              the catalog, schemas, examples
    GET   /s/<session>/subscriptions            which endpoint receives which type, and
                                                its payload filter
    GET   /s/<session>/messages                 the delivery log (filters, search)
    GET   /s/<session>/messages/<id>            deliveries, attempts: request, response
    POST  /s/<session>/messages/<id>/resend
    POST  /s/<session>/logout                   end the session (every page's button)
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from relaybox.ops.delivery_log import (
    STATUSES,
    LogFilter,
    delivery_log,
    example_for,
    message_view,
    subscribed,
)
from relaybox.outbound import deliveries, endpoints, flow
from relaybox.outbound.catalog import list_event_types
from relaybox.outbound.endpoints import EndpointPatch, EndpointSpec
from relaybox.outbound.filters import InvalidFilter
from relaybox.outbound.filters import parse as parse_filter
from relaybox.outbound.portal_links import TokenRefused, end_session, open_link
from relaybox.outbound.publish import publish
from relaybox.outbound.registry import outbound
from relaybox.outbound.vault import SecretsLocked
from relaybox.portal.web import (
    ENV,
    Page,
    PageError,
    error_page,
    handler,
    not_found,
    spend_publish_token,
    theme_css,
)
from relaybox.store.outbox_rows import Endpoint

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = ["routes"]

_SPLIT = re.compile(r"[\s,]+")
_TEST_TYPE = "relaybox.test"


def _patterns(raw: str) -> list[str] | None:
    found = [p for p in _SPLIT.split(raw.strip()) if p]
    return found or None


def _number(form: dict[str, str], name: str) -> float | None:
    raw = form.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise PageError(422, f"{name}: {raw[:40]!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise PageError(422, f"{name}: not a finite number")
    return value


def _payload_filter(page: Page, *, empty: dict[str, Any] | None) -> dict[str, Any] | None:
    """The form's ``filter`` (a JSON text) read and checked by the same rule as the
    tenant API (:func:`relaybox.outbound.filters.parse` with the settings' bounds);
    ``None`` when the form has no such field, ``empty`` when it is blank. Raises
    :class:`InvalidFilter`."""
    if "filter" not in page.form:
        return None
    raw = page.form["filter"].strip()
    if not raw:
        return empty
    s = outbound(page.box).settings
    spec: dict[str, Any] = parse_filter(
        raw, max_depth=s.filter_max_depth, max_bytes=s.filter_max_bytes
    )
    return spec


async def _endpoint(page: Page) -> Endpoint:
    found = await endpoints.get_endpoint(page.box, page.param("id"), page.tenant)
    if found is None:
        raise not_found("endpoint")
    return found


async def _catalog(box: Runtime) -> list[dict[str, Any]]:
    return [
        {**t.to_json(), "example": json.dumps(example_for(t.schema), indent=2, sort_keys=True)}
        for t in await list_event_types(box)
    ]


# -- endpoints ------------------------------------------------------------------------


async def list_endpoints(page: Page, *, status: int = 200, error: str = "") -> Response:
    """The endpoints and the form that creates one; after a refused filter (``error``),
    the form again with what the tenant typed."""
    limit = page.box.settings.portal.page_size
    found = await endpoints.list_endpoints(page.box, page.tenant, limit=limit)
    catalog = await _catalog(page.box)
    return page.render(
        "endpoints.html",
        status=status,
        active="endpoints",
        endpoints=found,
        catalog=catalog,
        error=error,
        form=page.form if error else {},
    )


async def create_endpoint(page: Page) -> Response:
    form = page.form
    try:
        spec = EndpointSpec(
            url=form.get("url", "").strip(),
            description=form.get("description", "").strip() or None,
            event_types=_patterns(form.get("event_types", "")),
            rate_limit=_number(form, "rate_limit"),
            filter=_payload_filter(page, empty=None),
        )
        created, _ = await endpoints.create_endpoint(page.box, page.tenant, spec)
    except InvalidFilter as exc:  # nothing was stored: the form again, with the problem
        return await list_endpoints(page, status=422, error=str(exc))
    return await _show_secrets(page, created, created=True)


async def show_endpoint(page: Page) -> Response:
    return await _endpoint_page(page, await _endpoint(page))


async def _endpoint_page(
    page: Page, found: Endpoint, *, status: int = 200, error: str = ""
) -> Response:
    """An endpoint's page; after a refused filter (``error``), the edit form again with
    what the tenant typed."""
    rows = await deliveries.list_deliveries(
        page.box, page.tenant, endpoint_id=found.id, limit=page.box.settings.portal.page_size
    )
    catalog = await _catalog(page.box)
    test_types = [_TEST_TYPE] + [
        t["name"] for t in catalog if subscribed(t["name"], found.event_types)
    ]
    if error:
        filter_text = page.form.get("filter", "")
    elif found.payload_filter is not None:
        filter_text = json.dumps(found.payload_filter, indent=2, ensure_ascii=False)
    else:
        filter_text = ""
    return page.render(
        "endpoint.html",
        status=status,
        active="endpoints",
        endpoint=found,
        deliveries=rows,
        test_types=test_types,
        grace=outbound(page.box).settings.rotation_grace,
        error=error,
        typed=page.form if error else None,
        filter_text=filter_text,
    )


async def edit_endpoint(page: Page) -> Response:
    found = await _endpoint(page)
    form = page.form
    try:
        patch = EndpointPatch(
            url=form.get("url", "").strip() or None,
            description=form.get("description", "").strip(),
            event_types=_patterns(form.get("event_types", "")),
            rate_limit=_number(form, "rate_limit"),
            filter=_payload_filter(page, empty={}),  # blank: no filter (every message)
        )
        await endpoints.update_endpoint(page.box, found.id, page.tenant, patch)
    except InvalidFilter as exc:  # nothing was stored: the form again, with the problem
        return await _endpoint_page(page, found, status=422, error=str(exc))
    return page.redirect(f"/endpoints/{found.id}", notice="saved")


async def enable_endpoint(page: Page) -> Response:
    found = await _endpoint(page)
    await endpoints.enable_endpoint(page.box, found.id, tenant=page.tenant, reason="portal")
    return page.redirect(f"/endpoints/{found.id}", notice="enabled")


async def disable_endpoint(page: Page) -> Response:
    found = await _endpoint(page)
    await endpoints.disable_endpoint(page.box, found.id, tenant=page.tenant, reason="portal")
    return page.redirect(f"/endpoints/{found.id}", notice="disabled")


async def pause_endpoint(page: Page) -> Response:
    found = await _endpoint(page)
    await flow.pause_endpoint(page.box, found.id, tenant=page.tenant)
    return page.redirect(f"/endpoints/{found.id}", notice="paused")


async def resume_endpoint(page: Page) -> Response:
    found = await _endpoint(page)
    await flow.resume_endpoint(page.box, found.id, tenant=page.tenant)
    return page.redirect(f"/endpoints/{found.id}", notice="resumed")


async def delete_endpoint(page: Page) -> Response:
    found = await _endpoint(page)
    await endpoints.delete_endpoint(page.box, found.id, page.tenant)
    return page.redirect("/endpoints", notice="deleted")


async def _show_secrets(
    page: Page, endpoint: Endpoint, *, created: bool = False, rotated: bool = False
) -> Response:
    """The secret page: each signing secret is shown here once (it is marked revealed
    as it is shown); one shown before is not shown again, rotation makes a new one."""
    revealed = await endpoints.reveal_secrets(page.box, endpoint.id, page.tenant)
    if revealed is None:
        raise not_found("endpoint")
    fresh, shown_before = revealed
    return page.render(
        "secret.html",
        active="endpoints",
        endpoint=endpoint,
        secrets=[s["secret"] for s in fresh],
        expiries=[s["expires_at"] for s in fresh],
        shown_before=shown_before,
        grace=outbound(page.box).settings.rotation_grace,
        created=created,
        rotated=rotated,
    )


async def reveal_secret(page: Page) -> Response:
    return await _show_secrets(page, await _endpoint(page))


async def rotate_secret(page: Page) -> Response:
    found = await _endpoint(page)
    hours = _number(page.form, "grace_hours")
    if hours is not None and not 0 <= hours <= 7 * 24:
        raise PageError(422, "grace_hours: between 0 and 168 hours")
    grace = None if hours is None else hours * 3600
    if await endpoints.rotate_secret(page.box, found.id, page.tenant, grace=grace) is None:
        raise not_found("endpoint")
    return await _show_secrets(page, found, rotated=True)


async def send_test(page: Page) -> Response:
    found = await _endpoint(page)
    if found.status != "enabled":
        raise PageError(409, "The endpoint is disabled: enable it first.")
    event_type = page.form.get("event_type", "").strip() or _TEST_TYPE
    data: Any = {"message": "relaybox test event"}
    if event_type != _TEST_TYPE:
        types = {t["name"]: t for t in await _catalog(page.box)}
        if event_type not in types:
            raise PageError(422, f"{event_type[:60]!r} is not an event type of the catalog")
        data = example_for(types[event_type]["schema"])
    spend_publish_token(page)  # the tenant API's bucket: one rate, however it publishes
    async with page.box.store.transaction() as conn:
        message = await publish(
            page.box, conn, event_type, data, tenant=page.tenant, endpoint_ids=[found.id]
        )
    return page.redirect(f"/messages/{message.id}", notice="test_sent")


# -- catalog, subscriptions -------------------------------------------------------------


async def event_types(page: Page) -> Response:
    return page.render("event_types.html", active="event_types", catalog=await _catalog(page.box))


async def subscriptions(page: Page) -> Response:
    limit = page.box.settings.portal.page_size
    found = await endpoints.list_endpoints(page.box, page.tenant, limit=limit)
    catalog = await _catalog(page.box)
    rows = [
        {
            "endpoint": e,
            "types": [t["name"] for t in catalog if subscribed(t["name"], e.event_types)],
        }
        for e in found
    ]
    return page.render("subscriptions.html", active="subscriptions", rows=rows, catalog=catalog)


# -- the delivery log ---------------------------------------------------------------------


async def messages(page: Page) -> Response:
    log = LogFilter(
        status=page.query("status"),
        event_type=page.query("event_type"),
        message_id=page.query("message_id"),
        # As typed, not stripped: a key matches exactly (case and spaces too), as the
        # tenant API's idempotency keys do (" k", "k" and "K" are three messages).
        idempotency_key=page.request.query_params.get("idempotency_key", ""),
    )
    rows = await delivery_log(page.box, page.tenant, log, limit=page.box.settings.portal.page_size)
    return page.render("messages.html", active="messages", rows=rows, log=log, statuses=STATUSES)


async def show_message(page: Page) -> Response:
    found = await message_view(page.box, page.param("id"), page.tenant)
    if found is None:
        raise not_found("message")
    waiting = any(d["status"] == "pending" for d in found["deliveries"])
    return page.render("message.html", active="messages", m=found, refresh=2 if waiting else 0)


async def resend(page: Page) -> Response:
    found = await deliveries.get_message(page.box, page.param("id"), page.tenant)
    if found is None:
        raise not_found("message")
    spend_publish_token(page)  # the message goes out again, as the API's redeliver
    count = await deliveries.redeliver(page.box, found.id, tenant=page.tenant)
    if not count:
        return page.redirect(f"/messages/{found.id}", notice="nothing_to_resend")
    return page.redirect(f"/messages/{found.id}", notice="resent", n=str(count))


async def home(page: Page) -> Response:
    return page.redirect("/endpoints")


async def logout(page: Page) -> Response:
    """End the session for every process; its address opens nothing from now on."""
    await end_session(page.box, page.session)
    root = str(page.request.scope.get("root_path", ""))
    return RedirectResponse(f"{root}/logged-out", status_code=303)


_LINK_TITLES = {"expired": "Link expired", "used": "Link used", "ended": "Link ended"}


def routes(box: Runtime) -> list[BaseRoute]:
    async def enter(request: Request) -> Response:
        token = str(request.path_params["token"])
        try:
            session = await open_link(box, token)
        except TokenRefused as exc:
            refusal = PageError(exc.status, str(exc), title=_LINK_TITLES.get(exc.reason))
            return error_page(request, box, refusal)
        except SecretsLocked as exc:  # no key to check links with: the server's problem
            return error_page(request, box, PageError(503, str(exc)))
        root = str(request.scope.get("root_path", ""))
        return RedirectResponse(f"{root}/s/{session.token}/endpoints", status_code=303)

    async def logged_out(request: Request) -> Response:
        html = ENV.get_template("logged_out.html").render(
            theme=theme_css(box.settings.portal.theme)
        )
        return HTMLResponse(html)

    s = "/s/{session}"
    table: list[tuple[str, Any, str]] = [
        ("", home, "GET"),
        ("/", home, "GET"),
        ("/endpoints", list_endpoints, "GET"),
        ("/endpoints", create_endpoint, "POST"),
        ("/endpoints/{id}", show_endpoint, "GET"),
        ("/endpoints/{id}", edit_endpoint, "POST"),
        ("/endpoints/{id}/enable", enable_endpoint, "POST"),
        ("/endpoints/{id}/disable", disable_endpoint, "POST"),
        ("/endpoints/{id}/pause", pause_endpoint, "POST"),
        ("/endpoints/{id}/resume", resume_endpoint, "POST"),
        ("/endpoints/{id}/delete", delete_endpoint, "POST"),
        ("/endpoints/{id}/secret", reveal_secret, "POST"),
        ("/endpoints/{id}/secret/rotate", rotate_secret, "POST"),
        ("/endpoints/{id}/test", send_test, "POST"),
        ("/event-types", event_types, "GET"),
        ("/subscriptions", subscriptions, "GET"),
        ("/messages", messages, "GET"),
        ("/messages/{id}", show_message, "GET"),
        ("/messages/{id}/resend", resend, "POST"),
        ("/logout", logout, "POST"),
    ]
    out: list[BaseRoute] = [
        Route("/enter/{token}", enter, methods=["GET"]),
        Route("/logged-out", logged_out, methods=["GET"]),
    ]
    for path, fn, method in table:
        out.append(Route(s + path, handler(box, fn), methods=[method]))
    return out
