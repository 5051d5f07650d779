"""The admin API's operations of the endpoints and messages sections."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel

from relaybox.admin.sections import Call, Operation
from relaybox.ops.outbound import (
    endpoint_disable,
    endpoint_enable,
    endpoint_get,
    endpoint_list,
    endpoint_recover,
    event_type_define,
    event_types,
    message_get,
    message_list,
    message_redeliver,
)
from relaybox.ops.outbound_models import (
    EndpointActionRequest,
    EndpointActionResult,
    EndpointDetail,
    EndpointFilter,
    EndpointList,
    EventTypeDefinition,
    EventTypeInfo,
    EventTypeList,
    MessageDetail,
    MessageFilter,
    MessagePage,
    RecoverRequest,
    RecoverResult,
    RedeliverRequest,
    RedeliverResult,
)

if TYPE_CHECKING:
    pass


# -- API --------------------------------------------------------------------------


async def _endpoint_list(c: Call) -> BaseModel:
    return await endpoint_list(c.box, c.query)


async def _endpoint_get(c: Call) -> BaseModel:
    return await endpoint_get(c.box, c.path["id"])


async def _message_list(c: Call) -> BaseModel:
    return await message_list(c.box, c.query)


async def _message_get(c: Call) -> BaseModel:
    return await message_get(c.box, c.path["id"])


async def _event_types(c: Call) -> BaseModel:
    return await event_types(c.box)


async def _event_type_define(c: Call) -> BaseModel:
    return await event_type_define(c.box, c.path["name"], c.body)


async def _message_redeliver(c: Call) -> BaseModel:
    return await message_redeliver(c.box, c.path["id"], endpoint_id=c.body.endpoint_id)


async def _endpoint_disable(c: Call) -> BaseModel:
    return await endpoint_disable(c.box, c.path["id"], actor=c.actor, reason=c.body.reason)


async def _endpoint_enable(c: Call) -> BaseModel:
    return await endpoint_enable(c.box, c.path["id"], actor=c.actor, reason=c.body.reason)


async def _endpoint_recover(c: Call) -> BaseModel:
    b = c.body
    return await endpoint_recover(
        c.box, c.path["id"], since=b.since, until=b.until, actor=c.actor, reason=b.reason
    )


ENDPOINT_OPERATIONS = (
    Operation(
        "GET",
        "/endpoints",
        "listEndpoints",
        "Webhook endpoints of every tenant, with their health",
        _endpoint_list,
        EndpointList,
        query=EndpointFilter,
        errors=(400,),
    ),
    Operation(
        "GET",
        "/endpoints/{id:str}",
        "getEndpoint",
        "One endpoint with its health and most recent attempts",
        _endpoint_get,
        EndpointDetail,
        errors=(404,),
    ),
    Operation(
        "POST",
        "/endpoints/{id:str}/disable",
        "disableEndpoint",
        "Switch an endpoint off; its waiting deliveries become dead letters",
        _endpoint_disable,
        EndpointActionResult,
        body=EndpointActionRequest,
        errors=(400, 404, 409),
        description="The same as `relaybox endpoints disable` and the tenant API's "
        "`PATCH {enabled: false}`: waiting deliveries become dead letters "
        "(`endpoint_disabled`) and `relaybox.endpoint.disabled` is published. The "
        "disabled reason records the actor and the reason. 409 `already_disabled`.",
    ),
    Operation(
        "POST",
        "/endpoints/{id:str}/enable",
        "enableEndpoint",
        "Switch an endpoint back on (its dead letters stay dead: recover them)",
        _endpoint_enable,
        EndpointActionResult,
        body=EndpointActionRequest,
        errors=(400, 404, 409),
        description="409 `already_enabled`.",
    ),
    Operation(
        "POST",
        "/endpoints/{id:str}/recover",
        "recoverEndpoint",
        "Retry the endpoint's dead deliveries created in a time window",
        _endpoint_recover,
        RecoverResult,
        body=RecoverRequest,
        errors=(400, 404, 409),
        description="Every dead delivery created in [since, until) goes back to pending "
        "with a fresh attempt budget and the same webhook-id. 409 `endpoint_disabled`: "
        "enable the endpoint first.",
    ),
)
MESSAGE_OPERATIONS = (
    Operation(
        "GET",
        "/messages",
        "listMessages",
        "Published messages, newest first",
        _message_list,
        MessagePage,
        query=MessageFilter,
        errors=(400,),
    ),
    Operation(
        "GET",
        "/messages/{id:str}",
        "getMessage",
        "One message with its deliveries and attempts",
        _message_get,
        MessageDetail,
        errors=(404,),
    ),
    Operation(
        "GET",
        "/event-types",
        "listEventTypes",
        "The event-type catalog tenants subscribe to",
        _event_types,
        EventTypeList,
    ),
    Operation(
        "PUT",
        "/event-types/{name:str}",
        "defineEventType",
        "Add or replace an event type of the catalog",
        _event_type_define,
        EventTypeInfo,
        body=EventTypeDefinition,
        errors=(400, 422),
        description="`schema`: published data must match it. `subject`: where its "
        "messages name their subject (a dotted path into the envelope, "
        "`data.customer.id`): every publish of the type without its own subject is "
        "indexed under the value there, for erasure. 422 `invalid_schema`, "
        "`invalid_subject_path`, `invalid_event_type` for what the catalog refuses.",
    ),
    Operation(
        "POST",
        "/messages/{id:str}/redeliver",
        "redeliverMessage",
        "Send a message again to every endpoint whose delivery finished",
        _message_redeliver,
        RedeliverResult,
        body=RedeliverRequest,
        errors=(400, 404, 409),
        description="Reuses the delivery row and so the webhook-id: a receiver that "
        "already processed the message recognises it. 409 `payload_purged` once retention "
        "dropped the body.",
    ),
)
OPERATIONS = ENDPOINT_OPERATIONS + MESSAGE_OPERATIONS
