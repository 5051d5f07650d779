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
It is a job (:mod:`relaybox.outbound.replays`) that a dispatcher runs in bounded
batches; :func:`replay_missing` queues one and runs it to its end in the caller's
process. A job queues at most ``outbound.replay_max`` deliveries and reads at most
``outbound.replay_scan_max`` messages; its result says where to go on from.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import structlog

from relaybox.errors import Conflict
from relaybox.outbound.endpoints import get_endpoint
from relaybox.outbound.replays import run_replay, start_replay
from relaybox.store.outbox_flow import ReplayJob

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = ["Replayed", "pause_endpoint", "replay_missing", "resume_endpoint"]

log = structlog.get_logger("relaybox.outbound")


@dataclass(frozen=True, slots=True)
class Replayed:
    """What a replay-missing job did. ``queued``: deliveries it created; ``scanned``:
    messages without a delivery it read; ``complete``: it reached the newest message.
    When not complete, ``resume_since`` is the time to pass to the next call (the
    publish time of the last message it read; what it read again there is skipped)."""

    endpoint_id: str
    since: float
    queued: int
    scanned: int
    complete: bool
    resume_since: float | None

    @classmethod
    def of(cls, job: ReplayJob) -> Replayed:
        """What the finished ``job`` did."""
        complete = job.resume_since is None
        resume = None if complete else job.resume_since
        return cls(job.endpoint_id, job.since, job.queued, job.scanned, complete, resume)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


async def pause_endpoint(box: Runtime, endpoint_id: str, *, tenant: str | None) -> bool:
    """Pause the endpoint: its deliveries wait until :func:`resume_endpoint`.
    ``False``: no such endpoint (pausing a paused endpoint is no change)."""
    return await _set_paused(box, endpoint_id, tenant, paused=True)


async def resume_endpoint(box: Runtime, endpoint_id: str, *, tenant: str | None) -> bool:
    """Resume a paused endpoint: its waiting deliveries go out, oldest first.
    ``False``: no such endpoint."""
    return await _set_paused(box, endpoint_id, tenant, paused=False)


async def _set_paused(box: Runtime, endpoint_id: str, tenant: str | None, *, paused: bool) -> bool:
    if await get_endpoint(box, endpoint_id, tenant) is None:
        return False
    now = box.clock.now()
    if await box.store.flow.endpoint_pause(endpoint_id, tenant, paused=paused, now=now):
        log.info("endpoint_paused" if paused else "endpoint_resumed", endpoint_id=endpoint_id)
    return True


async def replay_missing(
    box: Runtime,
    endpoint_id: str,
    *,
    since: float,
    tenant: str | None,
    limit: int | None = None,
) -> Replayed | None:
    """Queue a replay-missing job (:func:`relaybox.outbound.replays.start_replay`) and
    run it here to its end (waiting instead when a dispatcher took it on): a delivery
    to the endpoint of each message published from ``since`` until now that its
    subscription matches and that it has no delivery of, in publish order, at most
    ``limit`` (and ``outbound.replay_max``). ``None``: no such endpoint;
    :class:`~relaybox.errors.Conflict` ``endpoint_disabled`` when it is disabled (its
    deliveries would die: enable it first), ``replay_running``
    (:class:`~relaybox.outbound.replays.ReplayRunning`) when a job of the endpoint is
    queued or running."""
    job = await start_replay(box, endpoint_id, since=since, tenant=tenant, limit=limit)
    if job is None:
        return None
    done = await run_replay(box, job.id)
    if done.status == "failed":
        raise Conflict(f"replay of {endpoint_id} failed: {done.error}", code="replay_failed")
    return Replayed.of(done)
