"""The admin ASGI app (:func:`build_admin`): the JSON API and the dashboard of every
registered section (:mod:`relaybox.admin.sections`) behind ``admin_token``
(:mod:`relaybox.admin.auth`); importing it registers the built-in sections."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route

from relaybox.admin import api, html
from relaybox.admin.auth import AdminAuth, security_headers
from relaybox.admin.inbound.api import STATS_OPERATIONS
from relaybox.admin.overview import OVERVIEW_PAGES
from relaybox.admin.sections import Section, register_section, sections
from relaybox.browser import ResponseHeaders
from relaybox.limits import FailureThrottle
from relaybox.outage import UnavailableAnswer

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = ["build_admin", "registered_sections"]


def _register_builtins() -> None:
    register_section(
        Section(
            "overview",
            "Overview",
            0,
            nav_path="/",
            operations=STATS_OPERATIONS,
            pages=OVERVIEW_PAGES + html.SESSION_PAGES,
            tag_description="Queue numbers shared with /metrics and `relaybox stats`.",
        )
    )
    register_section(
        Section(
            "erasures",
            "Erasures",
            35,
            operations=api.ERASURE_OPERATIONS,
            requires_tables=("relaybox_erasures",),
            tag_description="Erasing one subject (data-protection requests): every payload, "
            "header and response excerpt of it goes; keys and outcomes stay.",
        )
    )
    from relaybox.admin import inbound, outbound, retention
    from relaybox.admin.outbound import announcements

    retention.register()
    inbound.register()
    outbound.register()
    announcements.register()


def _guarded(route: BaseRoute, section: Section) -> BaseRoute:
    """A page of a section whose tables may not exist yet: a readable 404 page
    instead of a database error until the migration runs."""
    assert isinstance(route, Route)
    endpoint = route.endpoint

    async def guarded(request: Request) -> Response:
        missing = await request.app.state.tables.missing(section.requires_tables)
        if missing:
            message = f"{section.title}: tables {', '.join(missing)} do not exist; run migrations"
            return await html.render(request, "error.html", status=404, message=message)
        return cast(Response, await endpoint(request))

    methods = sorted(route.methods - {"HEAD"}) if route.methods else None
    return Route(route.path, guarded, methods=methods, name=route.name)


def registered_sections() -> list[Section]:
    return sections()


def _api_path(path: str) -> bool:
    return path == "/api" or path.startswith("/api/")


def build_admin(box: Runtime) -> Starlette:
    """The ASGI app ``relaybox serve`` mounts at ``/admin`` when the admin role is on."""
    current = sections()
    routes: list[BaseRoute] = [Mount("/api/v1", app=api.build_api(box, current))]
    for section in current:
        if section.requires_tables:
            routes.extend(_guarded(route, section) for route in section.pages)
        else:
            routes.extend(section.pages)
    tables = api.TablesCheck(box)
    app = Starlette(
        routes=routes,
        middleware=[
            Middleware(ResponseHeaders, headers=security_headers(box)),
            # The database out of reach: 503 (JSON for the API, a page otherwise).
            Middleware(UnavailableAnswer, json_for=_api_path),
            Middleware(AdminAuth, box=box, login_page=html.login_page, tables=tables),
        ],
    )
    app.state.box = box
    app.state.sections = current
    app.state.tables = tables
    app.state.login_throttle = FailureThrottle(
        box.settings.admin.login_failures_per_address,
        box.settings.admin.login_failures_total,
        box.settings.admin.login_window,
    )
    return app


_register_builtins()
