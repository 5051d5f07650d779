"""The portal's plumbing: templates, the session taken from the address, forms with
their CSRF token, error pages, and the browser protections of every answer.

Every page handler receives a :class:`Page`: the request, the box, the tenant the
session proves, and helpers to render and redirect. Whatever goes wrong for the
request becomes a page with a 4xx status: a session that is forged or expired (401),
an id the tenant does not own (404, the same as an id that does not exist), a form
without the session's CSRF token (403), a form over ``portal.form_max_body`` (413),
a value relaybox refuses (422), a test event or resend over the tenant's publish rate
(429, with ``Retry-After``: the bucket the tenant API draws from).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlencode

from jinja2 import ChoiceLoader, PackageLoader
from markupsafe import Markup
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from relaybox.browser import framing, notice_text, page_environment
from relaybox.errors import RelayboxError
from relaybox.outbound.catalog import InvalidMessage
from relaybox.outbound.endpoints import InvalidEndpoint
from relaybox.outbound.filters import InvalidFilter
from relaybox.outbound.portal_links import PortalSession, TokenRefused, check_session, csrf_token
from relaybox.outbound.registry import PublishLimited, outbound
from relaybox.outbound.vault import SecretsLocked
from relaybox.wire import BodyTooLarge, read_body, text_problem

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = [
    "ENV",
    "NOTICES",
    "Page",
    "PageError",
    "handler",
    "security_headers",
    "spend_publish_token",
    "theme_css",
]

ENV = page_environment(ChoiceLoader([PackageLoader("relaybox.portal", "templates")]))


def _pretty(value: Any) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return str(value)
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(", ", ": "))


ENV.filters["pretty"] = _pretty
ENV.filters["compact"] = _compact

NOTICES: dict[str, str] = {
    "saved": "The endpoint was saved.",
    "enabled": "The endpoint was enabled.",
    "disabled": "The endpoint was disabled: its waiting deliveries stop until it is enabled.",
    "paused": "The endpoint was paused: its deliveries wait, none is dropped, until it is resumed.",
    "resumed": "The endpoint was resumed: waiting deliveries go out, oldest first.",
    "deleted": "The endpoint was deleted.",
    "resent": "The message was sent again ({n} deliver(ies)).",
    "nothing_to_resend": "Nothing to resend: its deliveries are still on their way, or "
    "their endpoints are disabled.",
    "test_sent": "A test event is on its way.",
}
"""What ``?notice=<code>`` shows: fixed texts, never text from the address."""


class PageError(RelayboxError):
    """A request the portal refuses: its status and the text the page shows;
    ``retry_after`` (seconds) becomes the answer's ``Retry-After``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        retry_after: int | None = None,
        title: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.retry_after = status, message, retry_after
        self.title = title


_TITLES = {"expired": "Session expired", "ended": "Session ended"}
"""The heading of a refused session's page, by :attr:`TokenRefused.reason`."""


def not_found(what: str) -> PageError:
    return PageError(404, f"There is no such {what}.")


def theme_css(theme: dict[str, str]) -> Markup:
    """``:root`` overrides for the configured theme. The values were checked to be
    plain CSS values when the settings were read (no ``;``, braces or ``<``)."""
    if not theme:
        return Markup("")
    body = "".join(f"--rb-{name}:{value};" for name, value in sorted(theme.items()))
    return Markup(":root{" + body + "}")


@dataclass
class Page:
    request: Request
    box: Runtime
    session: PortalSession
    form: dict[str, str] = field(default_factory=dict)

    @property
    def tenant(self) -> str:
        return self.session.tenant

    @property
    def base(self) -> str:
        """The session's address prefix: ``…/portal/s/<token>``."""
        root = str(self.request.scope.get("root_path", ""))
        return f"{root}/s/{self.session.token}"

    def param(self, name: str) -> str:
        return str(self.request.path_params[name])

    def query(self, name: str, default: str = "") -> str:
        return self.request.query_params.get(name, default).strip()

    def render(self, template: str, *, status: int = 200, **context: Any) -> HTMLResponse:
        settings = self.box.settings.portal
        notice = notice_text(NOTICES, self.query("notice"), self.query("n"))
        html = ENV.get_template(template).render(
            base=self.base,
            tenant=self.tenant,
            csrf=csrf_token(self.box, self.session),
            expires_at=self.session.expires_at,
            notice=notice,
            theme=theme_css(settings.theme),
            **context,
        )
        return HTMLResponse(html, status_code=status)

    def redirect(self, path: str, **query: str) -> RedirectResponse:
        query = {k: v for k, v in query.items() if v}
        url = self.base + path + ("?" + urlencode(query) if query else "")
        return RedirectResponse(url, status_code=303)


Handler = Callable[[Page], Awaitable[Response]]


def error_page(
    request: Request, box: Runtime, refusal: PageError, *, page: Page | None = None
) -> HTMLResponse:
    """The page of a ``refusal``: its status, text, heading (by default one for the
    status) and ``Retry-After``; within a valid session (``page``) with the portal's
    tabs and its logout button, so the tenant goes on from there."""
    context: dict[str, Any] = {}
    if page is not None:
        context = {"base": page.base, "csrf": csrf_token(box, page.session)}
    html = ENV.get_template("error.html").render(
        message=refusal.message,
        status=refusal.status,
        title=refusal.title,
        theme=theme_css(box.settings.portal.theme),
        **context,
    )
    response = HTMLResponse(html, status_code=refusal.status)
    if refusal.retry_after is not None:
        response.headers["Retry-After"] = str(refusal.retry_after)
    return response


def spend_publish_token(page: Page) -> None:
    """Take a token of the tenant's publish bucket (:meth:`relaybox.outbound.registry.
    Outbound.spend_publish_token`, the one the tenant API draws from) before a test
    event or a resend writes anything; past the rate, a 429 page with ``Retry-After``."""
    try:
        outbound(page.box).spend_publish_token(page.tenant)
    except PublishLimited as exc:
        raise PageError(
            429,
            f"Too many messages: at most {exc.rate:g} per second may be sent. Nothing "
            f"was sent; try again in {exc.retry_after} s.",
            retry_after=exc.retry_after,
        ) from None


async def _form(request: Request, limit: int) -> dict[str, str]:
    try:
        raw = await read_body(request, limit)
    except BodyTooLarge as exc:
        raise PageError(413, f"The form is {exc}.") from None
    parsed = parse_qs(raw.decode("utf-8", "replace"), keep_blank_values=True)
    form = {k: v[-1] for k, v in parsed.items()}
    if problem := text_problem(form, "form"):
        raise PageError(422, problem)
    return form


def handler(box: Runtime, fn: Handler) -> Callable[[Request], Awaitable[Response]]:
    """A portal page or action: the session from the address, then (for a POST) the
    form and its CSRF token, then ``fn``; refusals become error pages."""

    async def endpoint(request: Request) -> Response:
        page: Page | None = None
        try:
            for name, value in request.path_params.items():
                if len(str(value)) > 600 or text_problem(str(value)):
                    raise PageError(404, f"There is no such {name}.")
            if problem := text_problem(dict(request.query_params), "query"):
                raise PageError(422, problem)
            if any(len(v) > 1000 for v in request.query_params.values()):
                raise PageError(422, "A search value is longer than 1000 characters.")
            try:  # signed, not expired, not logged out of, its API key not revoked
                session = await check_session(box, request.path_params["session"])
            except TokenRefused as exc:
                raise PageError(401, str(exc), title=_TITLES.get(exc.reason)) from None
            page = Page(request, box, session)
            if request.method == "POST":
                page.form = await _form(request, box.settings.portal.form_max_body)
                expected = csrf_token(box, session)
                if not hmac.compare_digest(page.form.get("csrf", ""), expected):
                    raise PageError(403, "The form expired: reload the page and try again.")
            return await fn(page)
        except PageError as exc:
            return error_page(request, box, exc, page=page)
        except (InvalidEndpoint, InvalidMessage, InvalidFilter) as exc:
            return error_page(request, box, PageError(422, str(exc)), page=page)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'form'}: {e['msg']}" for e in exc.errors()
            )
            return error_page(request, box, PageError(422, problems), page=page)
        except SecretsLocked as exc:
            return error_page(request, box, PageError(503, str(exc)), page=page)

    endpoint.__name__ = fn.__name__
    return endpoint


def security_headers(box: Runtime) -> list[tuple[str, str]]:
    """The browser protections on every portal answer, set by
    :class:`relaybox.browser.ResponseHeaders`: who may frame it
    (``portal.frame_ancestors``), nothing loaded from elsewhere, no referrer sent (the
    address holds the session), nothing cached."""
    ancestors = box.settings.portal.frame_ancestors.strip()
    csp = (
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
        f"form-action 'self'; base-uri 'none'; frame-ancestors {ancestors}"
    )
    return [
        ("content-security-policy", csp),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "no-referrer"),
        ("cache-control", "no-store"),
        *framing(ancestors),
    ]
