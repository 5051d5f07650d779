"""What the HTML apps (the admin app, the portal) share: the browser protections on
every answer (one ASGI middleware that sets a fixed list of response headers, and the
framing headers both apps derive from their ``frame_ancestors`` setting), how
their templates are loaded (:func:`page_environment`), and what a page says after an
action (:func:`notice_text`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from jinja2 import BaseLoader, Environment, select_autoescape
from starlette.datastructures import MutableHeaders

__all__ = ["ResponseHeaders", "framing", "notice_text", "page_environment", "timestamp_text"]


def timestamp_text(value: float | None) -> str:
    """A Unix time as pages show it (``2027-01-15 08:00:00 UTC``; ``-`` for none)."""
    if value is None:
        return "-"
    return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def page_environment(loader: BaseLoader) -> Environment:
    """A Jinja2 environment for an HTML app's templates from ``loader``: HTML
    autoescaped, block tags trimmed, and the ``ts`` filter (:func:`timestamp_text`)."""
    env = Environment(
        loader=loader,
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["ts"] = timestamp_text
    return env


def notice_text(notices: dict[str, str], code: str, n: str) -> str:
    """What a page shows for ``?notice=<code>&n=<n>``: the text ``notices`` holds for
    the code (nothing for an unknown one, never text from the address), its ``{n}``
    the count when that is digits only (nothing otherwise)."""
    notice = notices.get(code, "")
    if "{n}" in notice:
        notice = notice.format(n=n) if n.isdigit() and len(n) <= 9 else ""
    return notice


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
