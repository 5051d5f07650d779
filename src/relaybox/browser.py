"""Browser protections on every answer of an HTML app (the admin app, the portal):
one ASGI middleware that sets a fixed list of response headers, and the framing
headers both apps derive from their ``frame_ancestors`` setting."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from starlette.datastructures import MutableHeaders

__all__ = ["ResponseHeaders", "framing"]


def framing(ancestors: str) -> list[tuple[str, str]]:
    """``X-Frame-Options: DENY`` when no one may frame the app (``'none'``), for the
    browsers that predate CSP ``frame-ancestors``; nothing otherwise."""
    return [("x-frame-options", "DENY")] if ancestors.strip() == "'none'" else []


class ResponseHeaders:
    """ASGI middleware: ``headers`` set on every HTTP answer of ``app`` (pages,
    forms, errors and JSON alike), replacing any the app set under the same names."""

    def __init__(
        self, app: Callable[..., Awaitable[None]], headers: Sequence[tuple[str, str]]
    ) -> None:
        self.app = app
        self.headers = list(headers)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in self.headers:
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)
