"""What counts as the database out of reach (503) and what stays a bug (500), and the
middleware's answer: only before the response started, JSON or a page."""

from __future__ import annotations

import errno
import json
import sqlite3
from typing import Any

import asyncpg
import pytest
import sqlalchemy.exc

from relaybox.errors import StoreUnavailable
from relaybox.outage import UnavailableAnswer, database_unavailable


def chained(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer from exc
    except BaseException as exc:
        return exc


OUTAGES = [
    StoreUnavailable("commit outcome unknown"),
    ConnectionRefusedError(errno.ECONNREFUSED, "refused"),
    ConnectionResetError(errno.ECONNRESET, "reset"),
    TimeoutError(),
    OSError(errno.EHOSTUNREACH, "no route to host"),
    sqlite3.OperationalError("database is locked"),
    sqlite3.OperationalError("unable to open database file"),
    sqlalchemy.exc.TimeoutError("QueuePool limit of size 1 overflow 0 reached"),
    asyncpg.exceptions.CannotConnectNowError("the database system is starting up"),
    asyncpg.exceptions.TooManyConnectionsError("too many clients"),
    asyncpg.exceptions.AdminShutdownError("terminating connection"),
    asyncpg.exceptions.IdleInTransactionSessionTimeoutError("idle-in-transaction timeout"),
    asyncpg.InterfaceError("connection is closed"),
    chained(RuntimeError("while listing endpoints"), ConnectionResetError("reset")),
]

BUGS = [
    ValueError("bad value"),
    KeyError("missing"),
    OSError(errno.ENOENT, "no such file"),
    sqlite3.OperationalError("no such column: nope"),
    sqlite3.IntegrityError("UNIQUE constraint failed"),
    asyncpg.exceptions.UniqueViolationError("duplicate key"),
    asyncpg.exceptions.UndefinedColumnError("column does not exist"),
    asyncpg.InterfaceError("cannot use Connection.transaction() in a manually started one"),
]


@pytest.mark.parametrize("exc", OUTAGES, ids=lambda e: f"{type(e).__name__}: {e}"[:60])
def test_an_outage_is_recognised(exc: BaseException) -> None:
    assert database_unavailable(exc)


@pytest.mark.parametrize("exc", BUGS, ids=lambda e: f"{type(e).__name__}: {e}"[:60])
def test_a_bug_is_not_an_outage(exc: BaseException) -> None:
    assert not database_unavailable(exc)


async def call(app: Any, path: str = "/api/v1/x") -> tuple[list[dict[str, Any]], Exception | None]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        sent.append(dict(message))

    scope = {"type": "http", "path": path, "root_path": "", "method": "GET", "headers": []}
    try:
        await app(scope, receive, send)
    except Exception as exc:
        return sent, exc
    return sent, None


async def test_the_middleware_answers_503_only_for_an_outage_before_the_response() -> None:
    async def down(scope: Any, receive: Any, send: Any) -> None:
        raise ConnectionRefusedError(errno.ECONNREFUSED, "refused")

    sent, raised = await call(UnavailableAnswer(down))
    assert raised is None and sent[0]["status"] == 503
    headers = dict(sent[0]["headers"])
    assert headers[b"content-type"] == b"application/json" and headers[b"retry-after"] == b"5"
    assert json.loads(sent[1]["body"])["error"] == "unavailable"

    sent, raised = await call(UnavailableAnswer(down, json_for=lambda path: False), "/page")
    assert raised is None and sent[0]["status"] == 503
    assert dict(sent[0]["headers"])[b"content-type"].startswith(b"text/html")

    async def bug(scope: Any, receive: Any, send: Any) -> None:
        raise ValueError("a bug")

    sent, raised = await call(UnavailableAnswer(bug))
    assert isinstance(raised, ValueError) and sent == []  # Starlette's 500, as before

    async def midway(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise ConnectionResetError(errno.ECONNRESET, "reset")

    sent, raised = await call(UnavailableAnswer(midway))
    assert isinstance(raised, ConnectionResetError) and len(sent) == 1  # too late for a 503
