"""Ordered delivery per key, the operator's side (docs/howto/ordered-delivery.md):
an endpoint's ordering settings, the keys dead deliveries hold back, and their release.
Shared by the admin API, the dashboard and the CLI.

The hold itself is in the dispatcher's lease statement (``outbox_lease``, both
backends): a delivery to an endpoint with ``ordered`` is not leased while an earlier
delivery of its ordering key to that endpoint is pending, or dead with ``on_dead``
``hold``. Several dispatchers share nothing else to keep it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import structlog

from relaybox.outbound.endpoints import EndpointPatch, get_endpoint, update_endpoint
from relaybox.store.outbox_rows import BlockedKey, Endpoint

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = ["blocked_keys", "release_key", "set_ordering"]

log = structlog.get_logger("relaybox.outbound")


async def blocked_keys(
    box: Runtime, *, endpoint_id: str | None = None, tenant: str | None = None, limit: int = 100
) -> list[BlockedKey]:
    """Keys dead deliveries hold back (endpoints with ``on_dead`` ``hold``), by
    endpoint and key; ``tenant`` ``None``: every tenant's."""
    return await box.store.outbox.ordering_blocked_keys(
        endpoint_id=endpoint_id, tenant=tenant, limit=limit
    )


async def release_key(
    box: Runtime, endpoint_id: str, ordering_key: str, *, actor: str, reason: str
) -> int:
    """Let the endpoint's later deliveries of ``ordering_key`` go past its dead ones,
    which stay dead letters (recover or redeliver them to send them again, after the
    others). Returns how many dead deliveries held the key (0: it was not held)."""
    n = await box.store.outbox.ordering_key_release(endpoint_id, ordering_key, now=box.clock.now())
    log.info(
        "ordering_key_released",
        endpoint_id=endpoint_id,
        ordering_key=ordering_key,
        dead=n,
        actor=actor,
        reason=reason,
    )
    return n


async def set_ordering(
    box: Runtime,
    endpoint_id: str,
    *,
    ordered: bool | None,
    on_dead: Literal["hold", "skip"] | None,
    tenant: str | None = None,
) -> Endpoint | None:
    """Switch ordered delivery on or off and set the dead-head policy of any tenant's
    endpoint (``tenant`` ``None``: an operator); ``None``: no such endpoint. Messages
    published before ``ordered`` was switched on carry no key on this endpoint."""
    current = await get_endpoint(box, endpoint_id, tenant)
    if current is None:
        return None
    patch = EndpointPatch(ordered=ordered, on_dead=on_dead)
    return await update_endpoint(box, endpoint_id, current.tenant, patch)
