"""The portal's ASGI app (:func:`build_portal`): its pages behind the browser
protections, a 503 page while the database is out of reach."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.applications import Starlette
from starlette.middleware import Middleware

from relaybox.browser import ResponseHeaders
from relaybox.outage import UnavailableAnswer
from relaybox.portal.pages import routes
from relaybox.portal.web import security_headers

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = ["build_portal"]


def build_portal(box: Runtime) -> Starlette:
    """The ASGI app ``relaybox serve`` mounts at ``/portal`` with the ``api`` role."""
    headers = Middleware(ResponseHeaders, headers=security_headers(box))
    # The database out of reach: a 503 page (inside the security headers), not a 500.
    unavailable = Middleware(UnavailableAnswer, json_for=lambda _: False)
    app = Starlette(routes=routes(box), middleware=[headers, unavailable])
    app.state.box = box
    return app
