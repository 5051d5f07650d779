"""The admin JSON API (``/admin/api/v1``), for operators and their scripts: how the
registered sections' operations become routes, and the erasures, which span both
sides. The receiving side's operations (inbox, replay, dead letters, quarantine,
stats) are in :mod:`relaybox.admin.inbound.api`, the sending side's in
:mod:`relaybox.admin.outbound.api`. Kept apart from the tenant-facing ``/api/v1``: a
different audience, token and blast radius.

Each operation is an :class:`~relaybox.admin.sections.Operation`; :func:`build_api`
turns the registered ones into routes that validate the request with the operation's
models, call its handler, and answer JSON. Every error is ``{"error", "message"}``
(400 invalid request, 401 no token, 404 unknown, 409 the row is not in the state the
action needs, 413 a body over ``admin.api_max_body``, refused before it is read);
authentication happens before routing (:mod:`relaybox.admin.auth`). A NUL character
or a lone surrogate in a query value or anywhere in a body is a 400: no database
column stores them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import structlog
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from relaybox.admin.sections import Call, Operation, Section
from relaybox.errors import OpsError
from relaybox.ops import erasure as erasures
from relaybox.ops import inbound as ops
from relaybox.outage import UnavailableAnswer
from relaybox.wire import (
    BodyTooLarge,
    JSONAnswer,
    NotJsonNumber,
    parse_json,
    read_body,
    text_problem,
)

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = [
    "ERASURE_OPERATIONS",
    "TablesCheck",
    "build_api",
    "error_response",
]

log = structlog.get_logger("relaybox.admin")


def error_response(status: int, code: str, message: str, details: Any = None) -> Response:
    body: dict[str, Any] = {"error": code, "message": message}
    if details is not None:
        body["details"] = details
    return JSONAnswer(body, status_code=status)


# -- erasures (both sides) -----------------------------------------------------


async def _erasure_request(c: Call) -> BaseModel:
    return await erasures.erasure_request(c.box, c.body, actor=c.actor)


async def _erasure_get(c: Call) -> BaseModel:
    return await erasures.erasure_get(c.box, c.path["id"])


async def _erasure_list(c: Call) -> BaseModel:
    return await erasures.erasure_list(c.box)


ERASURE_OPERATIONS = (
    Operation(
        "POST",
        "/erasures",
        "eraseSubject",
        "Erase every payload relaybox holds of a subject or a tenant",
        _erasure_request,
        erasures.ErasureRecord,
        body=erasures.ErasureRequest,
        status=202,
        errors=(400,),
        description="Records the erasure and answers 202 at once; its rows are emptied "
        "in batches by this process (poll GET /erasures/{id}). Keys, fingerprints, "
        "statuses and outcomes stay. Rows still pending wait (status waiting) and are "
        "emptied by the maintenance job once they finish. Asking again for a subject "
        "whose erasure still waits answers that erasure.",
    ),
    Operation(
        "GET",
        "/erasures",
        "listErasures",
        "The latest 100 erasures, newest first",
        _erasure_list,
        erasures.ErasureList,
    ),
    Operation(
        "GET",
        "/erasures/{id}",
        "getErasure",
        "One erasure: who asked, when, what, and the rows it emptied by kind",
        _erasure_get,
        erasures.ErasureRecord,
        errors=(404,),
    ),
)


# -- plumbing -------------------------------------------------------------------


class TablesCheck:
    """Whether a section's tables exist. A yes is remembered; a no is re-checked
    after a few seconds, so running the migration brings the section up without a
    restart."""

    def __init__(self, box: Runtime, retry_after: float = 5.0) -> None:
        self.box = box
        self.retry_after = retry_after
        self._present: set[str] = set()
        self._missing_until: dict[str, float] = {}

    async def missing(self, tables: Sequence[str]) -> list[str]:
        out = []
        for table in tables:
            if table in self._present:
                continue
            if self._missing_until.get(table, 0) > time.monotonic():
                out.append(table)
            elif await ops.table_exists(self.box, table):
                self._present.add(table)
            else:
                self._missing_until[table] = time.monotonic() + self.retry_after
                out.append(table)
        return out


def _details(exc: ValidationError) -> list[dict[str, Any]]:
    return [
        {"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]}
        for e in exc.errors(include_url=False, include_context=False, include_input=False)
    ]


def _endpoint(box: Runtime, op: Operation, section: Section, tables: TablesCheck) -> Any:
    async def endpoint(request: Request) -> Response:
        missing = await tables.missing(section.requires_tables)
        if missing:
            return error_response(
                404, "not_migrated", f"tables {', '.join(missing)} do not exist: run migrations"
            )
        path: dict[str, Any] = {}
        for name, kind in op.path_params:
            raw = str(request.path_params[name])
            bad_int = kind == "int" and (not raw.isdigit() or len(raw) > 18)
            if bad_int or "\x00" in raw or len(raw) > 200:
                return error_response(404, "not_found", f"{name} {raw[:40]!r} is not a known id")
            path[name] = int(raw) if kind == "int" else raw
        raw_query = dict(request.query_params)
        if problem := text_problem(raw_query, "query"):
            return error_response(400, "invalid_request", problem)
        try:
            # A time's relative form (since=2h) counts back from the box's clock.
            context = {"now": box.clock.now()}
            query = op.query.model_validate(raw_query, context=context) if op.query else None
            if op.query is None and request.query_params:
                return error_response(400, "invalid_request", "this operation takes no query")
            body = None
            if op.body is not None:
                try:
                    raw_body = await read_body(request, box.settings.admin.api_max_body)
                except BodyTooLarge as exc:
                    return error_response(413, "too_large", str(exc))
                try:
                    data = parse_json(raw_body or b"null")
                except NotJsonNumber as exc:
                    return error_response(400, "invalid_request", f"the body is not JSON: {exc}")
                except (ValueError, RecursionError):
                    return error_response(400, "invalid_request", "the body is not JSON")
                if problem := text_problem(data):
                    return error_response(400, "invalid_request", problem)
                body = op.body.model_validate(data, context=context)
        except ValidationError as exc:
            return error_response(400, "invalid_request", "invalid request", _details(exc))
        actor = getattr(body, "actor", None) or "admin-api"
        try:
            result = await op.handler(Call(box, path, query, body, actor))
        except OpsError as exc:
            return error_response(exc.status, exc.code, exc.message)
        if op.method != "GET":
            log.info("admin_action", operation=op.operation_id, actor=actor, path=path)
        # JSONAnswer: a payload may hold a lone surrogate its provider escaped.
        return JSONAnswer(result.model_dump(mode="json", by_alias=True), status_code=op.status)

    endpoint.__name__ = op.operation_id
    return endpoint


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    return error_response(exc.status_code, code, str(exc.detail))


def build_api(box: Runtime, sections: Sequence[Section]) -> Starlette:
    """The routes of every section's operations (mounted at ``/api/v1``)."""
    tables = TablesCheck(box)
    routes = [
        Route(op.path, _endpoint(box, op, section, tables), methods=[op.method])
        for section in sections
        for op in section.operations
    ]
    return Starlette(
        routes=routes,
        exception_handlers={HTTPException: _http_error},
        # The database out of reach (or its pool's wait timed out): 503, not 500.
        middleware=[Middleware(UnavailableAnswer)],
    )
