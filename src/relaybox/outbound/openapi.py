"""The OpenAPI 3.1 document of the tenant API (``/api/v1``, :mod:`relaybox.outbound.api`).

Request bodies are the pydantic models the API validates with; answers are described
by the models below, which mirror what the handlers send (``to_json`` of endpoints,
messages and event types, the store's delivery and attempt rows). The committed copy,
``docs/tenant-openapi.json``, is checked to be current by a test, and the API is
exercised against it by schemathesis (tests/integration/test_tenant_openapi.py). Regenerate:

    python -m relaybox.outbound.openapi --write docs/tenant-openapi.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import models_json_schema

from relaybox.outbound.api import (
    NewMessage,
    PortalRequest,
    Recovery,
    Redelivery,
    ReplayMissing,
    Rotation,
    TestEvent,
)
from relaybox.outbound.endpoints import EndpointPatch, EndpointSpec

__all__ = [
    "REGENERATE",
    "document_command",
    "document_text",
    "main",
    "openapi_document",
    "render",
]

REGENERATE = "python -m relaybox.outbound.openapi --write docs/tenant-openapi.json"
_REF = "#/components/schemas/{model}"


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorBody(_Out):
    error: str = Field(description="a stable code, e.g. not_found, invalid_request")
    message: str
    id: str | None = Field(
        None, description="replay_running: the endpoint's replay-missing job queued or running"
    )


class EndpointCredentials(_Out):
    type: str
    set: bool


class ReplayMissingJob(_Out):
    id: str = Field(description="the job's id (rpl_…)")
    endpoint_id: str
    status: Literal["queued", "running", "done", "failed"]
    since: float
    until: float = Field(description="messages published up to this time (the request's)")
    limit: int = Field(description="deliveries the job queues at most")
    queued: int = Field(description="deliveries created so far")
    scanned: int = Field(description="messages without a delivery read so far")
    complete: bool = Field(
        description="done, and every message up to until was read; done and false: a limit "
        "was reached, start another replay from resume_since"
    )
    resume_since: float | None
    error: str | None = Field(description="why it failed (the endpoint deleted or disabled)")
    created_at: float
    started_at: float | None
    finished_at: float | None
    url: str = Field(description="where to follow the job (GET)")


class Endpoint(_Out):
    id: str
    url: str
    description: str
    event_types: list[str]
    enabled: bool
    disabled_reason: str | None
    signature: str
    timeout: float | None
    schedule: list[float] | None
    max_in_flight: int
    rate_limit: float | None
    ordered: bool = Field(description="ordered delivery per ordering key")
    on_dead: str = Field(description="a dead head of a key: hold the key, or skip it")
    trace_context: bool = Field(
        description="its requests carry the W3C traceparent while tracing is on"
    )
    failing_since: float | None
    created_at: float
    updated_at: float
    filter: dict[str, Any] | None = Field(description="the payload filter, if any")
    paused: bool
    paused_at: float | None
    headers: dict[str, str] = Field(description="custom request headers")
    credentials: EndpointCredentials | None = Field(
        description="which credentials are set (never the credentials themselves)"
    )


class CreatedEndpoint(Endpoint):
    secret: str = Field(description="the signing secret (whsec_…, or whpk_… for ed25519)")


class Endpoints(_Out):
    data: list[Endpoint]


class Secret(_Out):
    secret: str
    created_at: float
    expires_at: float | None


class Secrets(_Out):
    data: list[Secret]


class NewSecret(_Out):
    secret: str


class Webhook(_Out):
    id: str
    url: str
    events: list[str]


class CreatedWebhook(Webhook):
    secret: str


class Webhooks(_Out):
    data: list[Webhook]


class Message(_Out):
    id: str
    event_type: str
    idempotency_key: str | None
    ordering_key: str | None = Field(description="its ordering key, if published with one")
    sequence: int | None = Field(description="its number within its ordering key")
    created_at: float
    payload: dict[str, Any] = Field(description="the envelope sent: type, timestamp, data")


class Messages(_Out):
    data: list[Message]


class DeliveryRow(_Out):
    id: int | str
    message_id: str | None
    endpoint_id: str | None
    channel: str | None = Field(
        description=(
            "the channel that delivers it: 'webhook' for an endpoint's deliveries, the "
            "destination's name for an endpoint routed to 'broker:<name>'"
        )
    )
    kind: str | None = Field(
        description=(
            "what that channel is: webhook, rabbitmq, nats, redis, email, http or "
            "custom (null: not known to this server)"
        )
    )
    key: str | None = Field(
        description=(
            "stable across attempts; an endpoint's delivery: '<message id>:<endpoint id>', "
            "the message id on a broker (a webhook's webhook-id is the message id)"
        )
    )
    tenant: str | None
    status: str = Field(description="pending, sent, dead or held")
    dead_reason: str | None
    attempts: int
    next_attempt_at: float | None
    last_error: str | None
    last_status: int | None
    created_at: float
    updated_at: float | None
    sent_at: float | None
    event_type: str | None


class Deliveries(_Out):
    data: list[DeliveryRow]


class MessageWithDeliveries(Message):
    deliveries: list[DeliveryRow]


class AttemptHeaders(_Out):
    request: list[list[str]] = Field(description="[name, value] pairs sent")
    response: list[list[str]] = Field(description="[name, value] pairs received")


class Attempt(_Out):
    outbox_id: int | str
    endpoint_id: str | None
    attempt: int
    started_at: float
    duration: float | None
    outcome: str
    status_code: int | None
    error: str | None
    response: str | None = Field(description="the first bytes of the answer")
    headers: AttemptHeaders | None = Field(
        description="the request's and the answer's header fields, where recorded (HTTP)"
    )


class Attempts(_Out):
    data: list[Attempt]


class EventType(_Out):
    name: str
    description: str
    schema_: dict[str, Any] | None = Field(alias="schema")


class EventTypes(_Out):
    data: list[EventType]


class Count(_Out):
    redelivered: int


class Recovered(_Out):
    recovered: int


class PortalLink(_Out):
    url: str = Field(description="open it in the tenant's browser (or an iframe)")
    expires_at: str = Field(description="ISO 8601 time after which the link is refused")
    single_use: bool = Field(description="true: the link opens one session only")


_ERRORS = {
    400: "The body is not valid JSON",
    401: "No or wrong API key (Authorization: Bearer rbk_…)",
    404: "No such endpoint or message for this tenant",
    409: "The endpoint is not in the state this call needs, or the quota is reached",
    413: "The body (or the message) is too large",
    422: "A value is not valid",
    429: "Over the publish rate: retry after Retry-After seconds",
    503: "The endpoint secrets key is missing or wrong (a server configuration problem)",
}

Op = tuple[str, str, str, str, type[BaseModel] | None, int, type[BaseModel] | None, set[int]]
"""(method, path, operation id, summary, body, status, answer, extra errors)."""

_SECRETS = {503}
_PUBLISH = {409, 413, 429, 503}
OPERATIONS: list[Op] = [
    ("get", "/endpoints", "listEndpoints", "List endpoints", None, 200, Endpoints, set()),
    ("post", "/endpoints", "createEndpoint", "Create an endpoint (answers its secret)",
     EndpointSpec, 201, CreatedEndpoint, {409} | _SECRETS),
    ("get", "/endpoints/{id}", "getEndpoint", "One endpoint", None, 200, Endpoint, set()),
    ("patch", "/endpoints/{id}", "updateEndpoint", "Change an endpoint", EndpointPatch, 200,
     Endpoint, _SECRETS),
    ("delete", "/endpoints/{id}", "deleteEndpoint", "Delete an endpoint", None, 204, None,
     set()),
    ("get", "/endpoints/{id}/secret", "getEndpointSecret", "The active signing secrets",
     None, 200, Secrets, _SECRETS),
    ("post", "/endpoints/{id}/secret/rotate", "rotateEndpointSecret",
     "A new secret; the current ones keep signing for the grace", Rotation, 201, NewSecret,
     _SECRETS),
    ("post", "/endpoints/{id}/test", "sendTestEvent", "Send a test event to this endpoint",
     TestEvent, 202, Message, _PUBLISH),
    ("post", "/endpoints/{id}/recover", "recoverEndpoint",
     "Retry dead deliveries created since a time", Recovery, 202, Recovered, set()),
    ("get", "/endpoints/{id}/deliveries", "listEndpointDeliveries", "The endpoint's deliveries",
     None, 200, Deliveries, set()),
    ("post", "/endpoints/{id}/pause", "pauseEndpoint",
     "Pause: deliveries wait (never dead) until resumed", None, 200, Endpoint, set()),
    ("post", "/endpoints/{id}/resume", "resumeEndpoint",
     "Resume: waiting deliveries go out, oldest first", None, 200, Endpoint, set()),
    ("post", "/endpoints/{id}/replay-missing", "replayMissing",
     "Start a job sending, once, every message since a time it matched but never got "
     "(409 replay_running while one is queued or running)", ReplayMissing, 202,
     ReplayMissingJob, {409, 429}),
    ("get", "/endpoints/{id}/replay-missing/{job}", "getReplayMissing",
     "A replay-missing job: its status and what it queued so far", None, 200,
     ReplayMissingJob, set()),
    ("post", "/webhooks", "createWebhook", "Register a webhook: {url, events}", EndpointSpec,
     201, CreatedWebhook, {409} | _SECRETS),
    ("get", "/webhooks", "listWebhooks", "Registered webhooks", None, 200, Webhooks, set()),
    ("post", "/messages", "publishMessage",
     "Publish (202; 200 when the idempotency key was seen)", NewMessage, 202, Message, _PUBLISH),
    ("get", "/messages", "listMessages", "Messages, newest first", None, 200, Messages, set()),
    ("get", "/messages/{id}", "getMessage", "A message with its deliveries", None, 200,
     MessageWithDeliveries, set()),
    ("get", "/messages/{id}/attempts", "listAttempts", "A message's delivery attempts", None,
     200, Attempts, set()),
    ("post", "/messages/{id}/redeliver", "redeliverMessage", "Send a message again",
     Redelivery, 202, Count, {429}),
    ("get", "/undelivered", "listUndelivered", "Pending, dead and held deliveries", None, 200,
     Deliveries, set()),
    ("get", "/event-types", "listEventTypes", "The event-type catalog", None, 200, EventTypes,
     set()),
    ("post", "/portal/sessions", "createPortalSession",
     "A short-lived signed link to this tenant's portal", PortalRequest, 201, PortalLink,
     _SECRETS),
]  # fmt: skip

_LIMIT = {"/endpoints": 500, "/webhooks": 500, "/messages": 500, "/undelivered": 1000}
_QUERY: dict[tuple[str, str], list[dict[str, Any]]] = {
    ("get", "/messages"): [
        {"name": "event_type", "in": "query", "schema": {"type": "string", "maxLength": 1000}},
        {"name": "before", "in": "query", "description": "the id of the last message seen",
         "schema": {"type": "string", "maxLength": 1000}},
        {"name": "idempotency_key", "in": "query",
         "description": "the message published with exactly this key (case and spaces too)",
         "schema": {"type": "string", "maxLength": 1000}},
    ],
    ("get", "/undelivered"): [
        {"name": "endpoint_id", "in": "query", "schema": {"type": "string", "maxLength": 1000}},
    ],
    ("get", "/endpoints/{id}/deliveries"): [
        {"name": "undelivered", "in": "query", "description": "1 or true: only those not sent",
         "schema": {"type": "string", "maxLength": 1000}},
    ],
    ("post", "/messages"): [
        {"name": "Idempotency-Key", "in": "header", "description": "as idempotency_key",
         "schema": {"type": "string", "maxLength": 256}},
    ],
}  # fmt: skip


def openapi_document() -> dict[str, Any]:
    models: list[tuple[type[BaseModel], Any]] = [(ErrorBody, "serialization")]
    for _, _, _, _, body, _, answer, _ in OPERATIONS:
        if body is not None:
            models.append((body, "validation"))
        if answer is not None:
            models.append((answer, "serialization"))
    keys, top = models_json_schema(list(dict.fromkeys(models)), ref_template=_REF)
    schemas: dict[str, Any] = top.get("$defs", {})
    paths: dict[str, dict[str, Any]] = {}
    for method, path, op_id, summary, body, status, answer, extra in OPERATIONS:
        params: list[dict[str, Any]] = []
        if "{id}" in path:
            params.append(
                {"name": "id", "in": "path", "required": True,
                 "schema": {"type": "string", "maxLength": 200}}
            )  # fmt: skip
        if "{job}" in path:
            params.append(
                {"name": "job", "in": "path", "required": True,
                 "schema": {"type": "string", "maxLength": 200}}
            )  # fmt: skip
        if method == "get" and path in _LIMIT:
            params.append(
                {"name": "limit", "in": "query", "required": False,
                 "schema": {"type": "integer", "minimum": 1, "maximum": _LIMIT[path]}}
            )  # fmt: skip
        if method == "get" and path == "/endpoints/{id}/deliveries":
            params.append(
                {"name": "limit", "in": "query", "required": False,
                 "schema": {"type": "integer", "minimum": 1, "maximum": 1000}}
            )  # fmt: skip
        params.extend(_QUERY.get((method, path), []))
        errors = {401, 422, *extra}
        if "{id}" in path or (method, path) == ("get", "/messages"):
            errors.add(404)
        if body is not None:
            errors |= {400, 413}
        responses: dict[str, Any] = {}
        if answer is None:
            responses[str(status)] = {"description": "Done"}
        else:
            content = {"application/json": {"schema": keys[(answer, "serialization")]}}
            responses[str(status)] = {"description": "OK", "content": content}
            if op_id == "publishMessage":
                responses["200"] = {"description": "Published before", "content": content}
            if op_id == "replayMissing":
                responses[str(status)]["headers"] = {
                    "Location": {"schema": {"type": "string"}, "required": True}
                }
        error = {"application/json": {"schema": keys[(ErrorBody, "serialization")]}}
        for code in sorted(errors):
            responses[str(code)] = {"description": _ERRORS[code], "content": error}
        if 429 in errors:
            responses["429"]["headers"] = {
                "Retry-After": {"schema": {"type": "string"}, "required": True}
            }
        operation: dict[str, Any] = {
            "operationId": op_id,
            "summary": summary,
            "responses": responses,
        }
        if params:
            operation["parameters"] = params
        if body is not None:
            operation["requestBody"] = {
                "required": False,
                "content": {"application/json": {"schema": keys[(body, "validation")]}},
            }
        paths.setdefault(path, {})[method] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "relaybox tenant API",
            "version": "1",
            "description": "What a tenant of the application uses to manage its webhook "
            "endpoints and follow its deliveries. Every call needs `Authorization: Bearer "
            "rbk_…` (a tenant API key); another tenant's ids answer 404. Times are epoch "
            "seconds.",
        },
        "servers": [{"url": "/api/v1"}],
        "security": [{"bearer": []}],
        "paths": dict(sorted(paths.items())),
        "components": {
            "schemas": dict(sorted(schemas.items())),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def document_text(document: dict[str, Any]) -> str:
    """Stable text (sorted keys, two-space indent, final newline): a diff is a change."""
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def render(document: dict[str, Any] | None = None) -> str:
    """This document (or ``document``) as :func:`document_text`."""
    return document_text(document or openapi_document())


def document_command(render: Callable[[], str], api: str, argv: Sequence[str] | None) -> int:
    """``python -m …openapi [--write PATH]``: print the ``api`` OpenAPI document
    ``render`` makes, or write it to ``PATH``."""
    parser = argparse.ArgumentParser(description=f"Print or write the {api} OpenAPI document.")
    parser.add_argument("--write", metavar="PATH", help="write it to PATH instead of stdout")
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        Path(args.write).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return document_command(render, "tenant", argv)


if __name__ == "__main__":
    raise SystemExit(main())
