"""Who may use ``/admin``: one operator token from the settings (``admin_token``).

* The JSON API takes it as ``Authorization: Bearer <token>``.
* The dashboard asks for it once in a login form and keeps a signed session cookie
  (HttpOnly, SameSite=Strict, scoped to the admin path). Every state-changing form
  carries a CSRF token derived from that session.

The check wraps the whole admin app (:class:`AdminAuth`), before routing, so a route
added later is refused by default rather than public by mistake. Tokens are compared
in constant time. The session cookie is signed (an HMAC keyed by a hash of the
token), so changing ``admin_token`` logs every browser out. A logout revokes its
session in the database (``relaybox_admin_revoked_sessions``), which every process
checks on every page: several processes behind one load balancer share nothing but
the database, so that is where a revocation must live for all of them to see it at
once (a per-process list would leave the cookie valid on the other processes).

:func:`security_headers` lists the browser protections of every admin answer:
framing refused (``X-Frame-Options``, CSP ``frame-ancestors``), no MIME sniffing,
no referrer sent off the admin app.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from relaybox.browser import framing

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = [
    "COOKIE",
    "SESSIONS_TABLE",
    "AdminAuth",
    "Session",
    "bearer_ok",
    "issue_session",
    "read_session",
    "revoke_session",
    "route_path",
    "security_headers",
    "session_revoked",
    "token_ok",
]

COOKIE = "relaybox_admin"
SESSIONS_TABLE = "relaybox_admin_revoked_sessions"
_PUBLIC = frozenset({("GET", "/login"), ("POST", "/login")})


@dataclass(frozen=True)
class Session:
    issued_at: float
    nonce: str
    csrf: str


def route_path(scope: dict[str, Any]) -> str:
    """The path relative to where the admin app is mounted."""
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    return path or "/"


def _token(box: Runtime) -> bytes | None:
    secret: Any = box.settings.admin_token
    if secret is None:
        return None
    # A plain string arrives when settings were copied with model_copy(update=…),
    # which skips validation; the empty string is "not configured", as in config.py.
    value = secret.get_secret_value() if hasattr(secret, "get_secret_value") else str(secret)
    return value.encode() or None


def token_ok(box: Runtime, presented: str) -> bool:
    """Constant-time comparison: the answer's timing says nothing about the token."""
    token = _token(box)
    return token is not None and hmac.compare_digest(presented.encode(), token)


def bearer_ok(box: Runtime, header: str | None) -> bool:
    if not header:
        return False
    scheme, _, value = header.partition(" ")
    return scheme.lower() == "bearer" and token_ok(box, value.strip())


def _key(token: bytes) -> bytes:
    return hashlib.sha256(b"relaybox-admin-session\0" + token).digest()


def _sign(key: bytes, message: str) -> str:
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


def issue_session(box: Runtime) -> tuple[str, Session]:
    """A new session cookie value (call only after the token was checked)."""
    token = _token(box)
    assert token is not None
    key = _key(token)
    issued = int(box.clock.now())
    nonce = secrets.token_urlsafe(16)
    body = f"{issued}.{nonce}"
    return f"{body}.{_sign(key, body)}", Session(issued, nonce, _sign(key, "csrf." + nonce))


def read_session(box: Runtime, cookie: str | None) -> Session | None:
    """The session a cookie proves, or ``None`` (forged, expired, or the token changed)."""
    token = _token(box)
    if token is None or not cookie or cookie.count(".") != 2:
        return None
    issued_text, nonce, signature = cookie.split(".")
    key = _key(token)
    if not hmac.compare_digest(signature, _sign(key, f"{issued_text}.{nonce}")):
        return None
    try:
        issued = int(issued_text)
    except ValueError:
        return None
    age = box.clock.now() - issued
    if age < -60 or age > box.settings.admin.session_ttl:
        return None
    return Session(issued, nonce, _sign(key, "csrf." + nonce))


def _session_id(session: Session) -> str:
    return hashlib.sha256(b"relaybox-admin-session-id\0" + session.nonce.encode()).hexdigest()


async def revoke_session(box: Runtime, session: Session) -> None:
    """End ``session`` for every process (logout); rows of sessions that have expired
    anyway are dropped in the same transaction."""
    expires = session.issued_at + box.settings.admin.session_ttl + 60
    await box.store.sessions.admin_session_revoke(
        _session_id(session), expires_at=expires, purge_before=box.clock.now() - 60
    )


async def session_revoked(box: Runtime, session: Session) -> bool:
    return await box.store.sessions.admin_session_revoked(_session_id(session))


def _unauthorized_json(message: str) -> Response:
    body = json.dumps({"error": "unauthorized", "message": message}).encode()
    return Response(
        body,
        status_code=401,
        media_type="application/json",
        headers={"WWW-Authenticate": 'Bearer realm="relaybox-admin"'},
    )


@dataclass(eq=False)
class AdminAuth:
    """ASGI middleware: API requests need the bearer token, pages a valid session;
    the login form is the only public route. ``login_page`` renders the 401 a
    browser sees (the form, pointing back at the page it asked for)."""

    app: Callable[..., Awaitable[None]]
    box: Runtime
    login_page: Callable[[Request, str], Awaitable[Response]]
    tables: Any

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = route_path(scope)
        request = Request(scope, receive)
        configured = self.box.settings.admin_token is not None
        why = (
            "admin access needs a token"
            if configured
            else "admin_token is not configured (set RELAYBOX_ADMIN_TOKEN): admin is closed"
        )
        if path == "/api" or path.startswith("/api/"):
            if not bearer_ok(self.box, request.headers.get("authorization")):
                await _unauthorized_json(why + ": send Authorization: Bearer <token>")(
                    scope, receive, send
                )
                return
        elif (request.method, path) not in _PUBLIC:
            session = read_session(self.box, request.cookies.get(COOKIE))
            # Without the table (a database not migrated yet) no logout can have
            # been recorded, so no session is revoked; logout says it cannot revoke.
            if (
                session is not None
                and not await self.tables.missing((SESSIONS_TABLE,))
                and await session_revoked(self.box, session)
            ):
                session = None
            if session is None:
                response = await self.login_page(request, "" if configured else why)
                await response(scope, receive, send)
                return
            scope.setdefault("state", {})["admin_session"] = session
        await self.app(scope, receive, send)


def security_headers(box: Runtime) -> list[tuple[str, str]]:
    """The browser protections on every answer of the admin app (pages, the login
    form, errors and the JSON API alike), set by :class:`relaybox.browser.ResponseHeaders`.
    ``admin.frame_ancestors`` is the CSP source list of who may frame the dashboard;
    ``'none'`` (the default) also sends ``X-Frame-Options: DENY``."""
    ancestors = box.settings.admin.frame_ancestors.strip()
    return [
        ("content-security-policy", f"frame-ancestors {ancestors}"),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "same-origin"),
        *framing(ancestors),
    ]
