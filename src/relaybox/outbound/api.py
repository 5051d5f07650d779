"""The tenant-facing API, mounted at ``/api/v1`` (``serve`` role ``api``).

Every request carries ``Authorization: Bearer rbk_…``; the key decides the tenant,
and every query is scoped to it (another tenant's ids answer 404). Answers are JSON;
errors are ``{"error": code, "message": text}``.

What comes in is checked before it reaches the database: a body over
``outbound.api_max_body`` is a 413 before it is read, a path id or query value with a
NUL (or longer than any id) a 404 / 422, a lone surrogate anywhere in a body, or a NUL
outside published ``data``, a 422 ``invalid_text``. Sending a message (``POST
/messages``, ``POST /endpoints/{id}/test``, ``POST /messages/{id}/redeliver``) is
limited per tenant and per process by a token bucket (``outbound.publish_rate``,
``outbound.publish_burst``) that the portal's test events and resends draw from too
(:meth:`relaybox.outbound.registry.Outbound.spend_publish_token`): past it, 429 with
``Retry-After``.

    GET/POST          /endpoints                 list, create (201, with the secret)
    GET/PATCH/DELETE  /endpoints/{id}
    GET               /endpoints/{id}/secret     active secrets (rotation: several)
    POST              /endpoints/{id}/secret/rotate
    POST              /endpoints/{id}/test       send a test event to this endpoint
    POST              /endpoints/{id}/recover    retry dead deliveries since a time
    POST              /endpoints/{id}/pause      deliveries wait until resume
    POST              /endpoints/{id}/resume     waiting deliveries go out, oldest first
    POST              /endpoints/{id}/replay-missing   deliver what it never got since a time
                      (a job: 202 with its id and url; 409 while one runs; 429 past the
                      tenant's outbound.replay_jobs_per_hour)
    GET               /endpoints/{id}/replay-missing/{job}   the job's status and counts
    GET               /endpoints/{id}/deliveries
    POST/GET          /webhooks                  the simple registration API: {"url", "events"}
    POST/GET          /messages                  publish (202) / list
    GET               /messages/{id}             with its deliveries
    GET               /messages/{id}/attempts
    POST              /messages/{id}/redeliver
    GET               /undelivered               pending, dead and held deliveries
    GET               /event-types               the catalog, with JSON Schemas
    POST              /portal/sessions           a signed link to the tenant's portal
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from relaybox.errors import Conflict, RelayboxError
from relaybox.outage import UnavailableAnswer
from relaybox.outbound import apikeys, deliveries, endpoints, flow, replays
from relaybox.outbound.catalog import InvalidMessage, list_event_types
from relaybox.outbound.endpoints import (
    EndpointPatch,
    EndpointQuotaExceeded,
    EndpointSpec,
    InvalidEndpoint,
)
from relaybox.outbound.filters import InvalidFilter
from relaybox.outbound.portal_links import portal_link
from relaybox.outbound.publish import publish
from relaybox.outbound.registry import PublishLimited, outbound
from relaybox.outbound.signing import SecretKind
from relaybox.outbound.vault import SecretsLocked
from relaybox.sources.base import MAX_SUBJECT_CHARS
from relaybox.store.outbox_rows import Endpoint, Message
from relaybox.timespec import TimeSpec
from relaybox.wire import BodyTooLarge, NotJsonNumber, parse_json, read_body, text_problem

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = ["build_api"]

Handler = Callable[[Request, str], Awaitable[Response]]


_MAX_ID = 200
_MAX_QUERY_VALUE = 1000
_DATA = frozenset({"data"})


class ApiError(RelayboxError):
    """A refused request: the HTTP status, error code and message the API answers."""

    def __init__(
        self, status: int, code: str, message: str, *, retry_after: int | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.retry_after = retry_after


class NewMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    event_type: str
    data: Any = None
    idempotency_key: str | None = Field(None, max_length=256)
    ordering_key: str | None = Field(None, min_length=1, max_length=256)
    subject: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_SUBJECT_CHARS,
        description="whom the message is about (a customer id): the message is indexed "
        "under it (a digest, never the text) so that erasing the subject empties it and "
        "its deliveries; without it, the value at the event type's subject path",
    )


class Rotation(BaseModel):
    model_config = ConfigDict(extra="forbid")

    grace_seconds: float | None = Field(None, ge=0, le=7 * 24 * 3600)
    secret_type: SecretKind | None = None


class TestEvent(BaseModel):
    model_config = ConfigDict(extra="forbid")

    event_type: str = "relaybox.test"
    data: Any = None


class Recovery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    since: TimeSpec
    until: TimeSpec | None = None


class ReplayMissing(BaseModel):
    model_config = ConfigDict(extra="forbid")

    since: TimeSpec
    limit: int | None = Field(None, ge=1)


class PortalRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ttl: float | None = Field(None, gt=0, description="seconds the link is valid")
    single_use: bool | None = Field(
        None,
        description="the link opens one session only; opened again it answers 410 "
        "(default: the server's portal.single_use_links, false unless set)",
    )


class Redelivery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    endpoint_id: str | None = Field(None, max_length=_MAX_ID)


M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


def _strict(model: type[M], data: Any, *, now: float | None = None) -> M:
    """``data`` (parsed JSON) as ``model``, in pydantic's strict JSON mode: a JSON
    ``false`` is not the number 0 nor ``"5"`` the number 5, as the document says.
    A time (:data:`~relaybox.timespec.TimeSpec`) takes a number or any form of the
    time grammar, ``2h`` meaning two hours before ``now``."""
    return model.model_validate_json(json.dumps(data), strict=True, context={"now": now})


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": code, "message": message}, status_code=status)


def _not_found(what: str) -> ApiError:
    return ApiError(404, "not_found", f"no such {what}")


def _found(value: T | None, what: str) -> T:
    """``value``, or the 404 naming ``what`` when there is none."""
    if value is None:
        raise _not_found(what)
    return value


def _check_params(request: Request) -> None:
    """Path ids and query values are looked up in the database: one that no column
    can hold (NUL, a lone surrogate) or that no id is as long as is refused here."""
    for name, value in request.path_params.items():
        raw = str(value)
        if len(raw) > _MAX_ID or text_problem(raw):
            raise ApiError(404, "not_found", f"no such {name}: {raw[:40]!r} is not a known id")
    for name, value in request.query_params.multi_items():
        if len(value) > _MAX_QUERY_VALUE:
            raise ApiError(422, "invalid_request", f"{name}: longer than {_MAX_QUERY_VALUE}")
        if problem := text_problem(value, name):
            raise ApiError(422, "invalid_request", problem)


def build_api(box: Runtime) -> Starlette:
    """The ``/api/v1`` Starlette app for ``box``."""
    settings = outbound(box).settings
    max_body = settings.api_max_body or settings.max_payload + 64 * 1024

    def route(path: str, fn: Handler, methods: list[str]) -> Route:
        async def endpoint(request: Request) -> Response:
            try:
                tenant = await _tenant(request)
                _check_params(request)
                return await fn(request, tenant)
            except ApiError as exc:
                response = _error(exc.status, exc.code, exc.message)
                if exc.retry_after is not None:
                    response.headers["Retry-After"] = str(exc.retry_after)
                return response
            except ValidationError as exc:
                problems = "; ".join(
                    f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}"
                    for e in exc.errors()
                )
                return _error(422, "invalid_request", problems)
            except InvalidFilter as exc:
                return _error(422, "invalid_filter", str(exc))
            except EndpointQuotaExceeded as exc:
                return _error(409, "endpoint_quota_exceeded", str(exc))
            except InvalidEndpoint as exc:
                return _error(422, "invalid_endpoint", str(exc))
            except InvalidMessage as exc:
                status = 413 if exc.code == "too_large" else 422
                return _error(status, f"invalid_{exc.code}", str(exc))
            except SecretsLocked as exc:  # the operator's key is missing or wrong
                # A server configuration problem (no key on PostgreSQL, a broken key
                # file, a key that opens nothing), not the tenant's: 503 with its code.
                return _error(503, exc.code, str(exc))

        return Route(path, endpoint, methods=methods)

    async def _tenant(request: Request) -> str:
        """The key's tenant; the key's id goes to ``request.state.api_key_id`` (the
        portal links it asks for end with it)."""
        scheme, _, key = request.headers.get("authorization", "").partition(" ")
        found = None
        if scheme.lower() == "bearer":
            found = await apikeys.authenticate_key(box, key.strip())
        if found is None:
            raise ApiError(401, "unauthorized", "a valid API key is required (Bearer rbk_…)")
        request.state.api_key_id, tenant = found
        return tenant

    async def body(request: Request, free: frozenset[str] = frozenset()) -> Any:
        """The JSON body, read with the size limit. No string in it may hold a lone
        surrogate, nor a NUL outside the top-level fields in ``free`` (published
        data: it is stored as JSON text, where a NUL is escaped)."""
        try:
            raw = await read_body(request, max_body)
        except BodyTooLarge as exc:
            raise ApiError(413, "too_large", str(exc)) from None
        if not raw:
            return {}
        try:
            data = parse_json(raw)
        except NotJsonNumber as exc:  # Python reads NaN, Infinity and 1e999: JSON does not
            raise ApiError(400, "malformed_json", f"the body is not valid JSON: {exc}") from None
        except (ValueError, RecursionError):
            raise ApiError(400, "malformed_json", "the body is not valid JSON") from None
        if problem := text_problem(data, nul_ok_under=free):
            raise ApiError(422, "invalid_text", problem)
        return data

    def rate_limited(tenant: str) -> None:
        """Spend a token of the tenant's one publish bucket, shared with the portal."""
        try:
            outbound(box).spend_publish_token(tenant)
        except PublishLimited as exc:
            raise ApiError(429, "rate_limited", str(exc), retry_after=exc.retry_after) from None

    async def endpoint_of(request: Request, tenant: str) -> Endpoint:
        found = await endpoints.get_endpoint(box, request.path_params["id"], tenant)
        return _found(found, "endpoint")

    # -- endpoints -------------------------------------------------------------------

    async def list_endpoints(request: Request, tenant: str) -> Response:
        found = await endpoints.list_endpoints(box, tenant, limit=_limit(request, 100, 500))
        return JSONResponse({"data": [e.to_json() for e in found]})

    async def create_endpoint(request: Request, tenant: str) -> Response:
        spec = _strict(EndpointSpec, await body(request))
        created, secret = await endpoints.create_endpoint(box, tenant, spec)
        return JSONResponse({**created.to_json(), "secret": secret}, status_code=201)

    async def get_endpoint(request: Request, tenant: str) -> Response:
        return JSONResponse((await endpoint_of(request, tenant)).to_json())

    async def patch_endpoint(request: Request, tenant: str) -> Response:
        patch = _strict(EndpointPatch, await body(request))
        updated = await endpoints.update_endpoint(box, request.path_params["id"], tenant, patch)
        return JSONResponse(_found(updated, "endpoint").to_json())

    async def delete_endpoint(request: Request, tenant: str) -> Response:
        if not await endpoints.delete_endpoint(box, request.path_params["id"], tenant):
            raise _not_found("endpoint")
        return Response(status_code=204)

    async def get_secret(request: Request, tenant: str) -> Response:
        found = await endpoints.endpoint_secrets(box, request.path_params["id"], tenant)
        return JSONResponse({"data": _found(found, "endpoint")})

    async def rotate_secret(request: Request, tenant: str) -> Response:
        rotation = _strict(Rotation, await body(request))
        secret = await endpoints.rotate_secret(
            box,
            request.path_params["id"],
            tenant,
            grace=rotation.grace_seconds,
            kind=rotation.secret_type,
        )
        return JSONResponse({"secret": _found(secret, "endpoint")}, status_code=201)

    async def send_test(request: Request, tenant: str) -> Response:
        found = await endpoint_of(request, tenant)
        if found.status != "enabled":
            raise ApiError(409, "endpoint_disabled", "enable the endpoint first")
        test = _strict(TestEvent, await body(request, _DATA))
        rate_limited(tenant)
        data = test.data if test.data is not None else {"message": "relaybox test event"}
        async with box.store.transaction() as conn:
            message = await publish(
                box, conn, test.event_type, data, tenant=tenant, endpoint_ids=[found.id]
            )
        return JSONResponse(message.to_json(), status_code=202)

    async def recover(request: Request, tenant: str) -> Response:
        recovery = _strict(Recovery, await body(request), now=box.clock.now())
        count = await deliveries.recover(
            box,
            request.path_params["id"],
            since=recovery.since,
            until=recovery.until,
            tenant=tenant,
        )
        return JSONResponse({"recovered": _found(count, "endpoint")}, status_code=202)

    async def pause(request: Request, tenant: str) -> Response:
        found = await endpoint_of(request, tenant)
        await flow.pause_endpoint(box, found.id, tenant=tenant)
        return JSONResponse((await endpoint_of(request, tenant)).to_json())

    async def resume(request: Request, tenant: str) -> Response:
        found = await endpoint_of(request, tenant)
        await flow.resume_endpoint(box, found.id, tenant=tenant)
        return JSONResponse((await endpoint_of(request, tenant)).to_json())

    async def replay_missing(request: Request, tenant: str) -> Response:
        found = await endpoint_of(request, tenant)
        if found.status != "enabled":
            raise ApiError(409, "endpoint_disabled", "enable the endpoint first")
        replay = _strict(ReplayMissing, await body(request), now=box.clock.now())
        try:
            job = await replays.start_replay(
                box,
                found.id,
                since=replay.since,
                tenant=tenant,
                limit=replay.limit,
                rate_limited=True,
            )
        except replays.ReplayRunning as exc:
            return JSONResponse(
                {"error": exc.code, "message": exc.message, "id": exc.job_id}, status_code=409
            )
        except replays.ReplayLimited as exc:
            raise ApiError(429, "rate_limited", str(exc), retry_after=exc.retry_after) from None
        except Conflict as exc:  # disabled meanwhile
            raise ApiError(exc.status, exc.code, exc.message) from None
        if job is None:
            raise _not_found("endpoint")
        url = f"{str(request.url).split('?')[0].rstrip('/')}/{job.id}"
        return JSONResponse(
            {**replays.job_json(job), "url": url}, status_code=202, headers={"Location": url}
        )

    async def replay_job(request: Request, tenant: str) -> Response:
        found = await endpoint_of(request, tenant)
        job = await replays.get_replay(
            box, request.path_params["job"], tenant=tenant, endpoint_id=found.id
        )
        url = str(request.url).split("?")[0]
        return JSONResponse({**replays.job_json(_found(job, "replay job")), "url": url})

    async def endpoint_deliveries(request: Request, tenant: str) -> Response:
        found = await endpoint_of(request, tenant)
        rows = await deliveries.list_deliveries(
            box,
            tenant,
            endpoint_id=found.id,
            undelivered=request.query_params.get("undelivered") in ("1", "true"),
            limit=_limit(request, 100, 1000),
        )
        return JSONResponse({"data": rows})

    # -- the simple registration API ------------------------------------------------

    async def create_webhook(request: Request, tenant: str) -> Response:
        spec = _strict(EndpointSpec, await body(request))
        created, secret = await endpoints.create_endpoint(box, tenant, spec)
        answer = {"id": created.id, "url": created.url, "events": created.event_types}
        return JSONResponse({**answer, "secret": secret}, status_code=201)

    async def list_webhooks(request: Request, tenant: str) -> Response:
        found = await endpoints.list_endpoints(box, tenant, limit=_limit(request, 100, 500))
        return JSONResponse(
            {"data": [{"id": e.id, "url": e.url, "events": e.event_types} for e in found]}
        )

    # -- messages --------------------------------------------------------------------

    async def create_message(request: Request, tenant: str) -> Response:
        rate_limited(tenant)
        new = _strict(NewMessage, await body(request, _DATA))
        key = new.idempotency_key or request.headers.get("idempotency-key")
        async with box.store.transaction() as conn:
            message = await publish(
                box,
                conn,
                new.event_type,
                new.data,
                tenant=tenant,
                idempotency_key=key,
                ordering_key=new.ordering_key,
                json_data=True,  # parsed from the body's JSON text
                subject=new.subject,
            )
        return JSONResponse(message.to_json(), status_code=202 if message.created else 200)

    async def list_messages(request: Request, tenant: str) -> Response:
        before = None
        if cursor := request.query_params.get("before"):
            last = _found(await deliveries.get_message(box, cursor, tenant), "message")
            before = (last.created_at, last.id)
        found = await deliveries.list_messages(
            box,
            tenant,
            event_type=request.query_params.get("event_type"),
            before=before,
            limit=_limit(request, 50, 500),
            # Exactly as given (not stripped): the key publish told messages apart by.
            idempotency_key=request.query_params.get("idempotency_key") or None,
        )
        return JSONResponse({"data": [m.to_json() for m in found]})

    async def message_of(request: Request, tenant: str) -> Message:
        found = await deliveries.get_message(box, request.path_params["id"], tenant)
        return _found(found, "message")

    async def get_message(request: Request, tenant: str) -> Response:
        message = await message_of(request, tenant)
        rows = await deliveries.list_deliveries(box, tenant, message_id=message.id)
        return JSONResponse({**message.to_json(), "deliveries": rows})

    async def get_attempts(request: Request, tenant: str) -> Response:
        message = await message_of(request, tenant)
        return JSONResponse({"data": await deliveries.list_attempts(box, message.id, tenant)})

    async def redeliver(request: Request, tenant: str) -> Response:
        message = await message_of(request, tenant)
        which = _strict(Redelivery, await body(request))
        rate_limited(tenant)  # the message goes out again: as a publish would
        count = await deliveries.redeliver(
            box, message.id, tenant=tenant, endpoint_id=which.endpoint_id
        )
        return JSONResponse({"redelivered": count}, status_code=202)

    async def undelivered(request: Request, tenant: str) -> Response:
        rows = await deliveries.list_deliveries(
            box,
            tenant,
            endpoint_id=request.query_params.get("endpoint_id"),
            undelivered=True,
            limit=_limit(request, 100, 1000),
        )
        return JSONResponse({"data": rows})

    async def event_types(request: Request, tenant: str) -> Response:
        return JSONResponse({"data": [t.to_json() for t in await list_event_types(box)]})

    async def portal_session(request: Request, tenant: str) -> Response:
        asked = _strict(PortalRequest, await body(request))
        most = box.settings.portal.max_link_ttl
        if asked.ttl is not None and asked.ttl > most:
            raise ApiError(422, "invalid_request", f"ttl: at most {most:g} s")
        base = box.settings.portal.public_url or str(request.base_url).rstrip("/")
        root = str(request.scope.get("root_path", ""))
        if not box.settings.portal.public_url and root.endswith("/api/v1"):
            base = base[: -len("/api/v1")] if base.endswith("/api/v1") else base
        link = portal_link(
            box,
            tenant,
            ttl=asked.ttl,
            base_url=base,
            single_use=asked.single_use,
            key_id=request.state.api_key_id,  # revoking the key ends the link's sessions
        )
        return JSONResponse(link.to_json(), status_code=201)

    return Starlette(
        routes=[
            route("/endpoints", list_endpoints, ["GET"]),
            route("/endpoints", create_endpoint, ["POST"]),
            route("/endpoints/{id}", get_endpoint, ["GET"]),
            route("/endpoints/{id}", patch_endpoint, ["PATCH"]),
            route("/endpoints/{id}", delete_endpoint, ["DELETE"]),
            route("/endpoints/{id}/secret", get_secret, ["GET"]),
            route("/endpoints/{id}/secret/rotate", rotate_secret, ["POST"]),
            route("/endpoints/{id}/test", send_test, ["POST"]),
            route("/endpoints/{id}/recover", recover, ["POST"]),
            route("/endpoints/{id}/deliveries", endpoint_deliveries, ["GET"]),
            route("/endpoints/{id}/pause", pause, ["POST"]),
            route("/endpoints/{id}/resume", resume, ["POST"]),
            route("/endpoints/{id}/replay-missing", replay_missing, ["POST"]),
            route("/endpoints/{id}/replay-missing/{job}", replay_job, ["GET"]),
            route("/webhooks", create_webhook, ["POST"]),
            route("/webhooks", list_webhooks, ["GET"]),
            route("/messages", create_message, ["POST"]),
            route("/messages", list_messages, ["GET"]),
            route("/messages/{id}", get_message, ["GET"]),
            route("/messages/{id}/attempts", get_attempts, ["GET"]),
            route("/messages/{id}/redeliver", redeliver, ["POST"]),
            route("/undelivered", undelivered, ["GET"]),
            route("/event-types", event_types, ["GET"]),
            route("/portal/sessions", portal_session, ["POST"]),
        ],
        exception_handlers={404: _no_route, 405: _no_route},
        # The database out of reach (or its pool's wait timed out): 503, not 500.
        middleware=[Middleware(UnavailableAnswer)],
    )


async def _no_route(request: Request, exc: Exception) -> Response:
    """An address or method no route serves answers in the API's JSON error shape."""
    status = getattr(exc, "status_code", 404)
    if status == 405:
        return _error(405, "method_not_allowed", f"{request.method} is not allowed here")
    return _error(404, "not_found", "no such route")


def _limit(request: Request, default: int, most: int) -> int:
    raw = request.query_params.get("limit")
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise ApiError(422, "invalid_request", f"limit is an integer from 1 to {most}")
    return int(raw)
