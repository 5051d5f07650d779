"""The ASGI application ``relaybox serve`` runs (:meth:`relaybox.Relaybox.asgi`): the
receiver, the tenant API and portal, the admin app, ``/healthz`` and ``/metrics``, and a
lifespan that starts the background roles."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from relaybox.config import BACKGROUND_ROLES
from relaybox.errors import TABLES_MISSING
from relaybox.outage import UNAVAILABLE_MESSAGE

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from relaybox.app import Relaybox

__all__ = ["build_asgi"]


def build_asgi(box: Relaybox, roles: tuple[str, ...]) -> Starlette:
    """``box``'s app with the HTTP ``roles`` mounted and the background ones started by
    its lifespan."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import BaseRoute, Mount, Route

    async def healthz(_: Request) -> Response:
        try:
            applied, latest = await box.store.schema_version()
        except Exception:
            down = {"status": "unavailable", "message": UNAVAILABLE_MESSAGE}
            return JSONResponse(down, status_code=503, headers={"Retry-After": "5"})
        ok = applied == latest
        body: dict[str, Any] = {
            "status": "ok" if ok else "migrations_pending",
            "schema": applied,
        }
        if applied == 0:
            body["message"] = TABLES_MISSING
        return JSONResponse(body, status_code=200 if ok else 503)

    async def metrics(_: Request) -> Response:
        body = await box.metrics.scrape(box)
        return Response(body, media_type="text/plain; version=0.0.4")

    background = tuple(r for r in roles if r in BACKGROUND_ROLES)

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> Any:
        if "api" in roles or "dispatcher" in roles:
            # A broken key file stops the start with its message (KeyFileError),
            # rather than every endpoint's deliveries and secrets failing later.
            box.outbound.vault.check()
        async with box.running(background, receiver="receiver" in roles):
            yield {"relaybox": box}

    routes: list[BaseRoute] = [
        Route("/healthz", healthz),
        Route("/metrics", metrics),
    ]
    if "receiver" in roles:
        routes.append(Mount("/webhooks", app=box.receiver))
    if "api" in roles:
        from relaybox.outbound.api import build_api

        routes.append(Mount("/api/v1", app=build_api(box)))
        from relaybox.portal import build_portal

        routes.append(Mount("/portal", app=build_portal(box)))
    if "admin" in roles:
        from relaybox.admin import build_admin

        routes.append(Mount("/admin", app=build_admin(box)))

    async def no_route(request: Request, exc: Exception) -> Response:
        # An address no mount matches (one with a newline, say) answers in the
        # tenant API's JSON error shape under /api/, as the API's own 404s do.
        status = getattr(exc, "status_code", 404)
        if request.url.path.startswith("/api/"):
            body = {"error": "not_found", "message": "no such route"}
            return JSONResponse(body, status_code=status)
        return Response("Not Found", status_code=status, media_type="text/plain")

    return Starlette(routes=routes, lifespan=lifespan, exception_handlers={404: no_route})
