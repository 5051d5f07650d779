"""Helpers for applications that embed relaybox (FastAPI, Starlette, Litestar).

app = FastAPI(lifespan=box.lifespan)
app.mount("/webhooks", box.receiver)
document_webhooks(app, box)           # the event catalog in the OpenAPI "webhooks"

@app.post("/orders/{order_id}/complete")
async def complete(order_id: str, box: Annotated[Relaybox, Depends(get_box)]): ...
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, cast

from starlette.requests import HTTPConnection

from relaybox.errors import ConfigurationError

if TYPE_CHECKING:
    from relaybox.app import Relaybox
    from relaybox.outbound.catalog import EventType

__all__ = ["document_webhooks", "get_box", "openapi_webhooks"]


def get_box(request: HTTPConnection) -> Relaybox:
    """The :class:`Relaybox` whose ``lifespan`` runs the application, for a request:
    a FastAPI dependency (``Annotated[Relaybox, Depends(get_box)]``) or a call in
    any Starlette endpoint."""
    box = getattr(request.state, "relaybox", None)
    if box is None:
        raise ConfigurationError(
            "no relaybox in the lifespan state: build the app with lifespan=box.lifespan"
        )
    return cast("Relaybox", box)


def openapi_webhooks(event_types: list[EventType], *, api_version: str) -> dict[str, Any]:
    """The OpenAPI 3.1 ``webhooks`` section for the event catalog: one operation per
    event type, whose request body is the envelope relaybox sends (``id``, ``type``,
    ``timestamp``, ``apiVersion`` and ``data``, with the type's JSON Schema)."""
    webhooks: dict[str, Any] = {}
    for et in sorted(event_types, key=lambda e: e.name):
        data_schema: dict[str, Any] = dict(et.schema) if et.schema else {}
        data_schema.pop("$schema", None)  # OpenAPI 3.1 schemas are JSON Schema 2020-12
        envelope = {
            "type": "object",
            "required": ["id", "type", "timestamp", "data"],
            "properties": {
                "id": {"type": "string", "description": "message id (webhook-id header)"},
                "type": {"type": "string", "const": et.name},
                "timestamp": {"type": "string", "format": "date-time"},
                "apiVersion": {"type": "string", "example": api_version},
                "data": data_schema,
            },
        }
        webhooks[et.name] = {
            "post": {
                "summary": et.description or et.name,
                "operationId": f"webhook_{et.name}",
                "parameters": [
                    {"name": name, "in": "header", "required": True, "schema": {"type": "string"}}
                    for name in ("webhook-id", "webhook-timestamp", "webhook-signature")
                ],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": envelope}},
                },
                "responses": {
                    "2XX": {"description": "received: any 2xx ends the retries"},
                    "410": {"description": "gone: relaybox disables the endpoint"},
                },
            }
        }
    return webhooks


def document_webhooks(app: Any, box: Relaybox) -> None:
    """Add the event catalog to a FastAPI app's OpenAPI document as its ``webhooks``
    section (FastAPI's ``/docs`` then shows what the application sends). The catalog
    is read from the database when the lifespan starts and after every
    ``box.define_event_type``; ``await box.refresh_webhooks()`` reads it again."""
    original = app.openapi

    def openapi() -> dict[str, Any]:
        schema: dict[str, Any] = copy.copy(original())
        if box.webhooks_doc:
            schema["webhooks"] = {**schema.get("webhooks", {}), **box.webhooks_doc}
        return schema

    app.openapi = openapi
