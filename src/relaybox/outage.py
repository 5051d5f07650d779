"""The database out of reach, as every HTTP surface answers it: 503 with a body that
says so and ``Retry-After``, never a 500 or a traceback.

:func:`database_unavailable` tells an outage (the server unreachable or gone, a
connection cut, the pool's wait for a connection timed out, SQLite's file that cannot
be opened or stays locked) from a bug; :class:`UnavailableAnswer` is the ASGI
middleware that the tenant API, the portal and the admin app put inside their
Starlette app, so that what their routes raise for an outage becomes a 503 before
Starlette's error handler turns it into a 500. The receiver answers its own 503s
(:mod:`relaybox.inbound.receiver`), ``/healthz`` its own.
"""

from __future__ import annotations

import errno
import html
import json
import socket
import sqlite3
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import structlog

from relaybox.errors import StoreUnavailable

__all__ = ["UNAVAILABLE_MESSAGE", "UnavailableAnswer", "database_unavailable"]

UNAVAILABLE_MESSAGE = "the database is unavailable; retry later"
"""What a 503 for an outage says."""

RETRY_AFTER = "5"

log = structlog.get_logger("relaybox.http")

_NETWORK_ERRNOS = frozenset(
    {
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.EPIPE,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ENETDOWN,
        errno.ETIMEDOUT,
    }
)

_SQLITE_OUTAGE = (
    "database is locked",
    "unable to open database file",
    "disk i/o error",
    "database or disk is full",
    "attempt to write a readonly database",
    "database disk image is malformed",
    "file is not a database",
)

# asyncpg's errors that say the server or the connection is gone or refusing work:
# class 08 (connection exception), 53 (insufficient resources: too many connections,
# out of memory or disk), 57P01-57P03 (shutdown, crash, cannot connect now), 25P03 and
# 57P05 (the session ended for sitting idle: in a transaction, or at all).
_PG_OUTAGE_STATES = ("08", "53", "57P01", "57P02", "57P03", "57P05", "25P03")
_PG_CLOSED = ("connection is closed", "underlying connection is closed", "connection was closed")


def database_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) says that the database is
    out of reach rather than that a request or the code is wrong."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _outage(current):
            return True
        current = current.__cause__ or current.__context__
    return False


def _outage(exc: BaseException) -> bool:
    if isinstance(exc, StoreUnavailable | ConnectionError | TimeoutError | socket.gaierror):
        return True
    if isinstance(exc, OSError) and exc.errno in _NETWORK_ERRNOS:
        return True
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc).lower()
        return any(words in text for words in _SQLITE_OUTAGE)
    # Modules looked up, not imported: an error of a driver never loaded cannot occur.
    sa_exc = sys.modules.get("sqlalchemy.exc")
    if sa_exc is not None:
        if isinstance(exc, sa_exc.TimeoutError):  # the pool's wait for a connection
            return True
        if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
            return True
        if isinstance(exc, sa_exc.InterfaceError) and _closed(exc):
            return True
    asyncpg = sys.modules.get("asyncpg")
    if asyncpg is not None:
        if isinstance(exc, asyncpg.PostgresError):
            state = str(getattr(exc, "sqlstate", "") or "")
            return state.startswith(_PG_OUTAGE_STATES)
        if isinstance(exc, asyncpg.InterfaceError):
            return _closed(exc)
    return False


def _closed(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(words in text for words in _PG_CLOSED)


Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class UnavailableAnswer:
    """ASGI middleware: an outage (:func:`database_unavailable`) raised before the
    response started answers 503 with ``Retry-After`` — JSON ``{"error":
    "unavailable", "message": …}`` where ``json_for`` says so for the request's path
    (the app's own, under its mount), else a short HTML page. Any other exception,
    or one raised once the response started, goes on as it came."""

    def __init__(self, app: ASGIApp, json_for: Callable[[str], bool] = lambda _: True) -> None:
        self.app = app
        self.json_for = json_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watched(message: MutableMapping[str, Any]) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watched)
        except Exception as exc:
            if started or not database_unavailable(exc):
                raise
            log.warning(
                "database_unavailable",
                path=scope.get("path"),
                error=f"{type(exc).__name__}: {exc}".split("\n", 1)[0][:300],
            )
            path = scope.get("path", "")
            root = scope.get("root_path", "")
            own = path[len(root) :] if root and path.startswith(root) else path
            await _answer(send, self.json_for(own))


async def _answer(send: Send, as_json: bool) -> None:
    if as_json:
        body = json.dumps({"error": "unavailable", "message": UNAVAILABLE_MESSAGE}).encode()
        content_type = b"application/json"
    else:
        text = html.escape(UNAVAILABLE_MESSAGE[0].upper() + UNAVAILABLE_MESSAGE[1:])
        body = (
            "<!doctype html><meta charset=utf-8><title>503 Service Unavailable</title>"
            f"<h1>Service unavailable</h1><p>{text}.</p>"
        ).encode()
        content_type = b"text/html; charset=utf-8"
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", content_type),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", RETRY_AFTER.encode()),
                (b"cache-control", b"no-store"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
