"""The admin API's ordered-delivery actions on an endpoint: its ordering settings
(``ordered``, ``on_dead``) and the release of a key its dead deliveries hold back
(:mod:`relaybox.ops.outbound_ordered`, shared with the CLI)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel

from relaybox.admin.sections import Call, Operation
from relaybox.errors import Conflict, InvalidRequest, NotFound
from relaybox.ops.outbound_models import (
    OrderingRequest,
    OrderingResult,
    ReleaseKeyRequest,
    ReleaseKeyResult,
)

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = ["ORDERED_OPERATIONS", "endpoint_ordering", "endpoint_release_key"]


async def endpoint_ordering(
    box: Runtime, endpoint_id: str, body: OrderingRequest, *, actor: str
) -> OrderingResult:
    from relaybox.ops.outbound_ordered import log, set_ordering

    if body.ordered is None and body.on_dead is None:
        raise InvalidRequest("give ordered, on_dead or both", hint="nothing_to_change")
    after = await set_ordering(box, endpoint_id, ordered=body.ordered, on_dead=body.on_dead)
    if after is None:
        raise NotFound(f"no endpoint {endpoint_id}")
    log.info(
        "endpoint_action",
        action="ordering",
        endpoint_id=endpoint_id,
        ordered=after.ordered,
        on_dead=after.on_dead,
        actor=actor,
        reason=body.reason,
    )
    state = "ordered per key" if after.ordered else "not ordered"
    return OrderingResult(
        endpoint_id=endpoint_id,
        ordered=after.ordered,
        on_dead=after.on_dead,
        message=f"endpoint {endpoint_id}: {state}; on_dead = {after.on_dead}",
    )


async def endpoint_release_key(
    box: Runtime, endpoint_id: str, body: ReleaseKeyRequest, *, actor: str
) -> ReleaseKeyResult:
    from relaybox.ops.outbound_ordered import release_key
    from relaybox.outbound.endpoints import get_endpoint

    if await get_endpoint(box, endpoint_id, None) is None:
        raise NotFound(f"no endpoint {endpoint_id}")
    n = await release_key(box, endpoint_id, body.ordering_key, actor=actor, reason=body.reason)
    if n == 0:
        raise Conflict(
            f"no dead delivery of {endpoint_id} holds the key {body.ordering_key!r}",
            code="key_not_held",
        )
    return ReleaseKeyResult(
        endpoint_id=endpoint_id,
        ordering_key=body.ordering_key,
        released=n,
        message=f"key {body.ordering_key!r} of {endpoint_id} released: its later deliveries "
        f"go; the {n} dead one(s) stay dead letters (recover them to send them again)",
    )


async def _ordering(c: Call) -> BaseModel:
    return await endpoint_ordering(c.box, c.path["id"], c.body, actor=c.actor)


async def _release_key(c: Call) -> BaseModel:
    return await endpoint_release_key(c.box, c.path["id"], c.body, actor=c.actor)


ORDERED_OPERATIONS = (
    Operation(
        "POST",
        "/endpoints/{id:str}/ordering",
        "setEndpointOrdering",
        "Switch ordered delivery per key on or off, and what a dead head does",
        _ordering,
        OrderingResult,
        body=OrderingRequest,
        errors=(400, 404),
        description="`ordered`: a delivery waits while an earlier one of its ordering key "
        "to this endpoint is pending (or dead, with `on_dead` `hold`). `on_dead` `skip`: "
        "a dead delivery no longer holds its key. The same as the tenant API's `PATCH` "
        "and `relaybox endpoints ordering`.",
    ),
    Operation(
        "POST",
        "/endpoints/{id:str}/release-key",
        "releaseOrderingKey",
        "Let an ordering key's later deliveries go past its dead ones",
        _release_key,
        ReleaseKeyResult,
        body=ReleaseKeyRequest,
        errors=(400, 404, 409),
        description="The dead deliveries stay dead letters (recover or redeliver them to "
        "send them again). 409 `key_not_held`: no dead delivery holds that key.",
    ),
)
