"""The admin app's operational events section and the endpoints' headers and
credentials.

* ``GET /operational-events`` and the dashboard page ``/operational-events``: the most
  recent operational events (:mod:`relaybox.outbound.announce`), newest first.
* ``PUT /endpoints/{id}/headers`` and ``PUT /endpoints/{id}/credentials``: what the
  tenant API's ``PATCH /endpoints/{id}`` and ``relaybox endpoints headers`` /
  ``credentials`` set; refused headers or credentials answer 422 ``invalid_endpoint``.
  Credentials are sealed and never shown: answers say which kind is set.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from relaybox.admin import html
from relaybox.admin.sections import Call, Operation, Section, register_section
from relaybox.errors import NotFound, OpsError
from relaybox.ops.inbound_models import RequestModel
from relaybox.outbound import endpoints
from relaybox.outbound.announce import operational_events
from relaybox.outbound.credentials import CredentialsSpec
from relaybox.outbound.endpoints import EndpointPatch, InvalidEndpoint
from relaybox.outbound.registry import outbound
from relaybox.outbound.vault import SecretsLocked

__all__ = ["OPERATIONS", "PAGES", "register"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InvalidEndpointSettings(OpsError):
    """Headers or credentials relaybox refuses (422)."""

    status = 422
    code = "invalid_endpoint"


class SecretsUnavailable(OpsError):
    """No key to seal credentials with (``outbound.secrets_key``; 503)."""

    status = 503
    code = "secrets_unavailable"


class EventFilter(RequestModel):
    limit: int = Field(50, ge=1, le=500)


class OperationalEvent(_Model):
    id: str
    event_type: str
    created_at: float
    data: Any = Field(
        description="the event's payload (docs/howto/operational-events.md lists each)"
    )


class OperationalEventList(_Model):
    tenant: str = Field(description="the operational tenant the events are published to")
    items: list[OperationalEvent]


class HeadersRequest(RequestModel):
    headers: dict[str, str] = Field(description="the endpoint's custom headers ({}: none)")


class CredentialsRequest(RequestModel):
    credentials: CredentialsSpec


class EndpointAccess(_Model):
    id: str
    tenant: str
    headers: dict[str, str]
    credentials: dict[str, Any] | None = Field(
        description='{"type": ..., "set": true}, or null; the credentials are never shown'
    )


async def _events(c: Call) -> OperationalEventList:
    return await _event_list(c.box, c.query.limit)


async def _event_list(box: Any, limit: int) -> OperationalEventList:
    found = await operational_events(box, limit=limit)
    items = [
        OperationalEvent(
            id=m.id, event_type=m.event_type, created_at=m.created_at, data=m.envelope["data"]
        )
        for m in found
    ]
    return OperationalEventList(tenant=outbound(box).settings.operational_tenant, items=items)


async def _change(c: Call, patch: EndpointPatch) -> EndpointAccess:
    found = await endpoints.get_endpoint(c.box, c.path["id"], None)
    if found is None:
        raise NotFound(f"no endpoint {c.path['id']}")
    try:
        updated = await endpoints.update_endpoint(c.box, found.id, found.tenant, patch)
    except InvalidEndpoint as exc:
        raise InvalidEndpointSettings(str(exc)) from None
    except SecretsLocked as exc:  # the operator's key is missing or wrong
        raise SecretsUnavailable(str(exc)) from None
    if updated is None:
        raise NotFound(f"no endpoint {c.path['id']}")
    shown = updated.to_json()
    return EndpointAccess(
        id=updated.id,
        tenant=updated.tenant,
        headers=shown["headers"],
        credentials=shown["credentials"],
    )


async def _headers(c: Call) -> EndpointAccess:
    return await _change(c, EndpointPatch(headers=c.body.headers))


async def _credentials(c: Call) -> EndpointAccess:
    return await _change(c, EndpointPatch(credentials=c.body.credentials))


OPERATIONS = (
    Operation(
        "GET",
        "/operational-events",
        "listOperationalEvents",
        "The most recent operational events, newest first",
        _events,
        OperationalEventList,
        query=EventFilter,
        errors=(400,),
        description="Messages of the operational tenant (`outbound.operational_tenant`): "
        "relaybox.message.attempt.exhausted, relaybox.endpoint.failing / recovered / "
        "disabled / enabled, relaybox.inbox.dead / quarantined.",
    ),
    Operation(
        "PUT",
        "/endpoints/{id:str}/headers",
        "setEndpointHeaders",
        "Replace an endpoint's custom request headers",
        _headers,
        EndpointAccess,
        body=HeadersRequest,
        errors=(400, 404, 422),
        description="No CR, LF or NUL; no hop-by-hop header, Host, Content-Length, "
        "Content-Type, Authorization or webhook-* signature header; count and size "
        "bounded by outbound.max_endpoint_headers / max_endpoint_headers_bytes. "
        "422 `invalid_endpoint` says which rule a header breaks.",
    ),
    Operation(
        "PUT",
        "/endpoints/{id:str}/credentials",
        "setEndpointCredentials",
        "Set or remove an endpoint's HTTP credentials (Basic, bearer, OAuth2)",
        _credentials,
        EndpointAccess,
        body=CredentialsRequest,
        errors=(400, 404, 422, 503),
        description='`{"type": "basic", "username", "password"}`, `{"type": "bearer", '
        '"token"}`, `{"type": "oauth2", "token_url", "client_id", "client_secret", '
        '"scope"}` or `{"type": "none"}`. Sealed like signing secrets; never shown again.',
    ),
)


@html.page
async def events_page(request: Request) -> Response:
    result = await _event_list(html.box_of(request), 100)
    rows = [(e, json.dumps(e.data, indent=1, sort_keys=True)) for e in result.items]
    return await html.render(
        request, "operational.html", active="operational", page=result, rows=rows
    )


PAGES = (Route("/operational-events", events_page, methods=["GET"]),)


def register() -> None:
    """Add the operational events section (after messages)."""
    register_section(
        Section(
            "operational",
            "Operational events",
            55,
            nav_path="/operational-events",
            operations=OPERATIONS,
            pages=PAGES,
            requires_tables=("relaybox_messages", "relaybox_endpoints"),
            tag_description="What relaybox tells operators about its own state; endpoint "
            "headers and credentials.",
        )
    )
