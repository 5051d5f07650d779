"""The admin app's operational events section and the endpoints' headers and
credentials: the routes and the page; the reads and actions are
:mod:`relaybox.ops.outbound`'s, their models :mod:`relaybox.ops.outbound_models`'.

* ``GET /operational-events`` and the dashboard page ``/operational-events``: the most
  recent operational events (:mod:`relaybox.outbound.announce`), newest first.
* ``PUT /endpoints/{id}/headers`` and ``PUT /endpoints/{id}/credentials``: what the
  tenant API's ``PATCH /endpoints/{id}`` and ``relaybox endpoints headers`` /
  ``credentials`` set; refused headers or credentials answer 422 ``invalid_endpoint``.
  Credentials are sealed and never shown: answers say which kind is set.
"""

from __future__ import annotations

import json

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from relaybox.admin import html
from relaybox.admin.sections import Call, Operation, Section, register_section
from relaybox.ops import outbound as ops
from relaybox.ops.outbound_models import (
    CredentialsRequest,
    EndpointAccess,
    EventFilter,
    HeadersRequest,
    OperationalEventList,
)

__all__ = ["OPERATIONS", "PAGES", "register"]


async def _events(c: Call) -> OperationalEventList:
    return await ops.operational_event_list(c.box, limit=c.query.limit)


async def _headers(c: Call) -> EndpointAccess:
    return await ops.endpoint_set_headers(c.box, c.path["id"], c.body.headers)


async def _credentials(c: Call) -> EndpointAccess:
    return await ops.endpoint_set_credentials(c.box, c.path["id"], c.body.credentials)


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
    result = await ops.operational_event_list(html.box_of(request), limit=100)
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
