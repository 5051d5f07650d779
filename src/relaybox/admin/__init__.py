"""The operator surface mounted at ``/admin``: a JSON API (``/admin/api/v1``) and a
server-rendered dashboard, both built from the registered sections
(:mod:`relaybox.admin.sections`) and both behind ``admin_token``
(:mod:`relaybox.admin.auth`).

Built-in sections: overview, inbox, dead letters, quarantine; the outbound side
(endpoints, messages) registers itself from :mod:`relaybox.admin.outbound` and shows
up once its tables are migrated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route

from relaybox.admin import api, dashboard
from relaybox.admin.auth import AdminAuth, security_headers
from relaybox.admin.sections import (
    Call,
    Operation,
    OverviewPanel,
    Section,
    register_section,
    sections,
)
from relaybox.browser import ResponseHeaders
from relaybox.limits import FailureThrottle
from relaybox.metrics import read_ops_stats
from relaybox.outage import UnavailableAnswer

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = [
    "Call",
    "Operation",
    "OverviewPanel",
    "Section",
    "build_admin",
    "register_section",
    "registered_sections",
]


async def _sources_panel(box: Runtime) -> OverviewPanel | None:
    snap = await read_ops_stats(box.store, box.clock.now())
    rows = []
    for source in snap.sources("inbox"):
        age = snap.oldest_pending_age("inbox", source)
        dead = sum(
            g.count
            for g in snap.groups
            if g.queue == "inbox" and g.source == source and g.status == "dead" and not g.discarded
        )
        quarantined = snap.quarantined_by_source.get(source, 0)
        rows.append((source, snap.pending("inbox", source), age, dead, quarantined))
    if not rows:
        return None
    return OverviewPanel(
        title="Inbox by source",
        columns=("source", "pending", "oldest pending", "dead", "quarantined"),
        rows=rows,
        metric="sources",
    )


def _register_builtins() -> None:
    register_section(
        Section(
            "overview",
            "Overview",
            0,
            nav_path="/",
            operations=api.STATS_OPERATIONS,
            pages=dashboard.OVERVIEW_PAGES,
            tag_description="Queue numbers shared with /metrics and `relaybox stats`.",
        )
    )
    register_section(
        Section(
            "inbox",
            "Inbox",
            10,
            nav_path="/inbox",
            operations=api.INBOX_OPERATIONS,
            pages=dashboard.INBOX_PAGES,
            overview=_sources_panel,
            tag_description="Received events, their attempts and replay.",
        )
    )
    register_section(
        Section(
            "dead",
            "Dead letters",
            20,
            nav_path="/dead",
            operations=api.DEAD_OPERATIONS,
            pages=dashboard.DEAD_PAGES,
            tag_description="Events that will not be retried without an operator.",
        )
    )
    register_section(
        Section(
            "quarantine",
            "Quarantine",
            30,
            nav_path="/quarantine",
            operations=api.QUARANTINE_OPERATIONS,
            pages=dashboard.QUARANTINE_PAGES,
            tag_description="Deliveries that reused an accepted event id with other content.",
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
    from relaybox.admin import operational, outbound, retention

    retention.register()
    outbound.register()
    operational.register()


def _guarded(route: BaseRoute, section: Section) -> BaseRoute:
    """A page of a section whose tables may not exist yet: a readable 404 page
    instead of a database error until the migration runs."""
    assert isinstance(route, Route)
    endpoint = route.endpoint

    async def guarded(request: Request) -> Response:
        missing = await request.app.state.tables.missing(section.requires_tables)
        if missing:
            message = f"{section.title}: tables {', '.join(missing)} do not exist; run migrations"
            return await dashboard.render(request, "error.html", status=404, message=message)
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
            Middleware(AdminAuth, box=box, login_page=dashboard.login_page, tables=tables),
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
