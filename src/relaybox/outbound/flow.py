"""An endpoint's flow: pause and resume, and replay missing; shared by the tenant API,
the admin API and the CLI.

Pausing is not disabling. A paused endpoint still receives deliveries when messages
are published (its subscription holds), but no dispatcher leases them: they wait,
pending, never dead-lettered, and on resume go out oldest first (publish order;
attempts in flight when it was paused finish). Disabling stops the subscription and
turns waiting deliveries into dead letters.

Replay missing gives an endpoint a delivery of every message published since a time
that its subscription (event types and payload filter) matches and that it has no
delivery of: messages published while it was disabled, before it existed, or before
its filter was widened. Each message gets at most one delivery per endpoint whatever
runs at once (the delivery key is UNIQUE), so running it twice queues nothing twice.
A call queues at most ``outbound.replay_max`` deliveries and reads at most
``outbound.replay_scan_max`` messages; its result says where to go on from.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from relaybox.errors import Conflict
from relaybox.outbound.endpoints import get_endpoint
from relaybox.outbound.filters import compile_filter
from relaybox.outbound.publish import wants
from relaybox.outbound.registry import outbound

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = ["Replayed", "pause_endpoint", "paused_backlog", "replay_missing", "resume_endpoint"]

log = structlog.get_logger("relaybox.outbound")

_PAGE = 500
"""Messages read per transaction by replay missing."""


@dataclass(frozen=True, slots=True)
class Replayed:
    """What a replay-missing call did. ``queued``: deliveries it created; ``scanned``:
    messages without a delivery it read; ``complete``: it reached the newest message.
    When not complete, ``resume_since`` is the time to pass to the next call (the
    publish time of the last message it read; what it read again there is skipped)."""

    endpoint_id: str
    since: float
    queued: int
    scanned: int
    complete: bool
    resume_since: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "endpoint_id": self.endpoint_id,
            "since": self.since,
            "queued": self.queued,
            "scanned": self.scanned,
            "complete": self.complete,
            "resume_since": self.resume_since,
        }


async def pause_endpoint(box: Runtime, endpoint_id: str, *, tenant: str | None) -> bool:
    """Pause the endpoint: its deliveries wait until :func:`resume_endpoint`.
    ``False``: no such endpoint (pausing a paused endpoint is no change)."""
    if await get_endpoint(box, endpoint_id, tenant) is None:
        return False
    now = box.clock.now()
    if await box.store.endpoint_pause(endpoint_id, tenant, paused=True, now=now):
        log.info("endpoint_paused", endpoint_id=endpoint_id)
    return True


async def resume_endpoint(box: Runtime, endpoint_id: str, *, tenant: str | None) -> bool:
    """Resume a paused endpoint: its waiting deliveries go out, oldest first.
    ``False``: no such endpoint."""
    if await get_endpoint(box, endpoint_id, tenant) is None:
        return False
    now = box.clock.now()
    if await box.store.endpoint_pause(endpoint_id, tenant, paused=False, now=now):
        log.info("endpoint_resumed", endpoint_id=endpoint_id)
    return True


async def paused_backlog(box: Runtime) -> dict[str, int]:
    """Per paused endpoint id, how many deliveries wait for its resume."""
    return await box.store.endpoint_paused_backlog()


async def replay_missing(
    box: Runtime,
    endpoint_id: str,
    *,
    since: float,
    tenant: str | None,
    limit: int | None = None,
) -> Replayed | None:
    """Queue a delivery to the endpoint of each message published at or after
    ``since`` that its subscription matches and that it has no delivery of, in publish
    order, at most ``limit`` (and ``outbound.replay_max``). ``None``: no such endpoint;
    :class:`~relaybox.errors.Conflict` (``endpoint_disabled``) when it is disabled
    (its deliveries would die: enable it first)."""
    endpoint = await get_endpoint(box, endpoint_id, tenant)
    if endpoint is None:
        return None
    if endpoint.status != "enabled":
        raise Conflict(
            f"endpoint {endpoint_id} is disabled: enable it first", code="endpoint_disabled"
        )
    settings, store = outbound(box).settings, box.store
    most = settings.replay_max if limit is None else max(1, min(limit, settings.replay_max))
    flt = None if endpoint.payload_filter is None else compile_filter(endpoint.payload_filter)
    queued = scanned = 0
    after: tuple[float, str] | None = None
    complete = False
    while queued < most and scanned < settings.replay_scan_max:
        size = min(_PAGE, settings.replay_scan_max - scanned)
        async with store.transaction() as conn:
            page = await store.message_missing_page(
                conn, endpoint.tenant, endpoint_id, since=since, after=after, limit=size
            )
            chosen: list[str] = []
            for m in page:
                scanned += 1
                after = (m.created_at, m.id)
                if wants(
                    m.event_type,
                    functools.partial(json.loads, m.body),
                    endpoint.event_types,
                    flt,
                ):
                    chosen.append(m.id)
                    if queued + len(chosen) >= most:
                        break
            queued += await store.delivery_insert_missing(
                conn, endpoint_id, endpoint.tenant, chosen, now=box.clock.now()
            )
        if len(page) < size and (not page or after == (page[-1].created_at, page[-1].id)):
            complete = True
            break
    resume = None if complete else (after[0] if after else since)
    log.info(
        "endpoint_replayed_missing",
        endpoint_id=endpoint_id,
        since=since,
        queued=queued,
        scanned=scanned,
        complete=complete,
    )
    return Replayed(endpoint_id, since, queued, scanned, complete, resume)
