"""Replay-missing jobs: asked for by a request, run by a dispatcher.

A replay-missing request (the tenant API, the admin API, the dashboard, the CLI,
:func:`start_replay`) reads nothing: it checks the endpoint and queues a job
(``relaybox_replay_jobs``), at most one queued or running per endpoint (409
``replay_running`` otherwise) and, through the tenant API, at most
``outbound.replay_jobs_per_hour`` per tenant (429). The job covers the messages
published from ``since`` up to the request (later ones get their deliveries when
published).

A :class:`ReplayRunner` (every dispatcher runs one beside its deliveries) claims the
oldest waiting job under a lease (``outbound.lease_ttl``) and runs it in steps of
``outbound.replay_batch`` messages: one short transaction reads the page, the
subscription (event types and payload filter) is checked in a worker thread, never on
the event loop (a filter parses each message's body), and one short transaction
inserts the chosen deliveries and saves the job's progress (its keyset cursor and
counters) while the lease is still its own. A dispatcher that is killed leaves its job
leased; once the lease runs out another claims it and goes on after the last step
committed: nothing is skipped, and nothing is enqueued twice (a step's deliveries and
its progress commit together, and the delivery key is UNIQUE anyway). A stopping
dispatcher gives its job back at once.

A job queues at most its ``limit`` (and ``outbound.replay_max``) deliveries and reads
at most ``outbound.replay_scan_max`` messages; past either it ends ``done`` with
``resume_since``, the time a next replay goes on from.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import gc
import json
import math
import os
import secrets
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from relaybox.errors import Conflict, InvalidRequest, RelayboxError
from relaybox.log import short_error
from relaybox.outage import database_unavailable
from relaybox.outbound.endpoints import get_endpoint
from relaybox.outbound.filters import CompiledFilter, compile_filter
from relaybox.outbound.publish import wants
from relaybox.outbound.registry import outbound
from relaybox.store.outbox_flow import MissingMessage, ReplayJob
from relaybox.store.outbox_rows import new_id

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = [
    "ReplayLimited",
    "ReplayRunner",
    "ReplayRunning",
    "get_replay",
    "job_json",
    "run_replay",
    "start_replay",
]

log = structlog.get_logger("relaybox.outbound")

FINISHED = frozenset({"done", "failed"})


class ReplayRunning(Conflict):
    """The endpoint has a replay-missing job queued or running (409
    ``replay_running``); ``job_id`` is that job's."""

    def __init__(self, endpoint_id: str, job_id: str) -> None:
        super().__init__(
            f"endpoint {endpoint_id} has a replay-missing job running ({job_id}): "
            "wait for it to finish",
            code="replay_running",
        )
        self.job_id = job_id


class ReplayLimited(RelayboxError):
    """The tenant started ``outbound.replay_jobs_per_hour`` replay jobs in the last
    hour (the tenant API answers 429 with ``Retry-After``)."""

    def __init__(self, per_hour: int, retry_after: float) -> None:
        super().__init__(
            f"at most {per_hour} replay-missing jobs an hour: try again in {retry_after:.0f} s"
        )
        self.retry_after = math.ceil(retry_after)


def job_json(job: ReplayJob) -> dict[str, Any]:
    """A job as the APIs show it (``complete``: it read every message up to ``until``;
    when done and not complete, ``resume_since`` is where a next replay goes on)."""
    return {
        "id": job.id,
        "endpoint_id": job.endpoint_id,
        "status": job.status,
        "since": job.since,
        "until": job.until,
        "limit": job.max_queued,
        "queued": job.queued,
        "scanned": job.scanned,
        "complete": job.status == "done" and job.resume_since is None,
        "resume_since": job.resume_since,
        "error": job.error,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
    }


async def start_replay(
    box: Runtime,
    endpoint_id: str,
    *,
    since: float,
    tenant: str | None,
    limit: int | None = None,
    rate_limited: bool = False,
) -> ReplayJob | None:
    """Queue a replay-missing job for the endpoint: the messages published from
    ``since`` until now that its subscription matches and that it has no delivery of
    get one, at most ``limit`` (and ``outbound.replay_max``). ``None``: no such
    endpoint (``tenant`` ``None``: of any tenant). Raises
    :class:`~relaybox.errors.Conflict` ``endpoint_disabled`` (enable it first),
    :class:`ReplayRunning`, :class:`ReplayLimited` (``rate_limited``: the tenant's
    ``outbound.replay_jobs_per_hour``) and :class:`~relaybox.errors.InvalidRequest`
    for a ``since`` that is not a finite number."""
    if not math.isfinite(since):
        raise InvalidRequest(f"since: {since} is not a time")
    endpoint = await get_endpoint(box, endpoint_id, tenant)
    if endpoint is None:
        return None
    if endpoint.status != "enabled":
        raise Conflict(
            f"endpoint {endpoint_id} is disabled: enable it first", code="endpoint_disabled"
        )
    settings = outbound(box).settings
    most = settings.replay_max if limit is None else max(1, min(limit, settings.replay_max))
    now = box.clock.now()
    per_hour = settings.replay_jobs_per_hour if rate_limited else None
    started = await box.store.flow.replay_job_start(
        new_id("rpl", now),
        endpoint.tenant,
        endpoint.id,
        since=since,
        until=now,
        max_queued=most,
        now=now,
        per_hour=per_hour,
    )
    if started.running is not None:
        raise ReplayRunning(endpoint.id, started.running)
    if started.retry_after is not None:
        raise ReplayLimited(settings.replay_jobs_per_hour, started.retry_after)
    assert started.job is not None
    log.info(
        "replay_job_queued", job_id=started.job.id, endpoint_id=endpoint.id, since=since, limit=most
    )
    return started.job


async def get_replay(
    box: Runtime, job_id: str, *, tenant: str | None, endpoint_id: str | None = None
) -> ReplayJob | None:
    """The job (of ``tenant``, and of ``endpoint_id`` when given), or ``None``."""
    job = await box.store.flow.replay_job_get(job_id, tenant)
    if job is None or (endpoint_id is not None and job.endpoint_id != endpoint_id):
        return None
    return job


async def run_replay(box: Runtime, job_id: str, *, poll: float = 0.2) -> ReplayJob:
    """Run the job in this process until it ends and return it; when a dispatcher
    holds it, wait for that one instead (the CLI waits so; a killed holder's job is
    taken on here once its lease runs out)."""
    runner = ReplayRunner(box)
    while True:
        ran = await runner.run_once(job_id)
        job = ran or await box.store.flow.replay_job_get(job_id, None)
        if job is None:
            raise LookupError(f"no replay job {job_id}")
        if job.status in FINISHED:
            return job
        await asyncio.sleep(poll)


@dataclass(frozen=True, slots=True)
class _Chosen:
    """What a step checked: the ids to deliver, how many messages it read (a full
    ``room`` stops it early) and the keyset of the last one read."""

    ids: list[str]
    read: int
    last: tuple[float, str] | None


def _choose(
    page: Sequence[MissingMessage],
    patterns: Sequence[str],
    flt: CompiledFilter | None,
    room: int,
) -> _Chosen:
    """The messages of ``page`` the subscription wants, at most ``room``; in a worker
    thread (each check may parse a message's body).

    The cyclic garbage collector is off meanwhile: a parsed body is garbage once it was
    checked (freed by its reference count, no cycles), but a collection while one is
    being built promotes its objects, and every few dozen bodies of 117 KiB that set off
    a full collection of the process's heap, which holds the GIL, so the event loop as
    well, for 60-135 ms (measured on PostgreSQL with 200 such messages); with it off,
    the loop's longest wait fell to the parse of one body."""
    ids: list[str] = []
    read = 0
    last: tuple[float, str] | None = None
    collecting = gc.isenabled()
    gc.disable()
    try:
        for m in page:
            read += 1
            last = (m.created_at, m.id)
            if wants(m.event_type, functools.partial(json.loads, m.body), patterns, flt):
                ids.append(m.id)
                if len(ids) >= room:
                    break
    finally:
        if collecting:
            gc.enable()
    return _Chosen(ids, read, last)


class _LeaseLost(Exception):
    """Another runner took the job over (this one's lease ran out): roll back."""


STEP_TRIES = 3
"""How many times a replay job's step is tried when it fails for a reason other than
the database being away, before the job ends ``failed``."""

# Lock conflicts (serialization failure, deadlock, lock not available): the next try
# may well pass, like an outage.
_PASSING_STATES = ("40001", "40P01", "55P03")


def _passing(exc: BaseException) -> bool:
    """Whether ``exc`` is a condition that passes (the database away, a lock conflict)
    rather than an error in the job's data or the code."""
    if database_unavailable(exc):
        return True
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if str(getattr(current, "sqlstate", "") or "") in _PASSING_STATES:
            return True
        current = getattr(current, "orig", None) or current.__cause__ or current.__context__
    return False


class ReplayRunner:
    """Claims replay-missing jobs and runs them in steps (see the module's text).
    :meth:`run` loops until its ``stopping`` event is set (a dispatcher runs it);
    :meth:`run_once` claims one job and runs it to its end."""

    def __init__(self, box: Runtime, name: str | None = None) -> None:
        self.box = box
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.settings = outbound(box).settings

    async def run(self, stopping: asyncio.Event) -> None:
        """Claim and run jobs until ``stopping`` is set; a NOTIFY (or the poll
        interval) says when one was queued."""
        wake = asyncio.Event()
        listener = await self.box.store.db.listen("replay", wake)
        failures = 0
        try:
            while not stopping.is_set():
                wake.clear()
                try:
                    job = await self.claim()
                    failures = 0
                except Exception as exc:  # the database is away: the poll tries again
                    failures += 1
                    if failures == 1 or failures % 10 == 0:
                        log.warning("replay_claim_failed", runner=self.name, error=short_error(exc))
                    job = None
                if job is not None:
                    await self.run_job(job, stopping)
                    continue
                waits = [asyncio.ensure_future(e.wait()) for e in (wake, stopping)]
                try:
                    await asyncio.wait(
                        waits,
                        timeout=self.settings.poll_interval,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    for w in waits:
                        w.cancel()
        finally:
            if listener is not None:
                with contextlib.suppress(Exception):
                    await listener.close()

    async def claim(self, job_id: str | None = None) -> ReplayJob | None:
        """Lease the oldest waiting job (or ``job_id``) no live lease holds."""
        now = self.box.clock.now()
        return await self.box.store.flow.replay_job_claim(
            self.name, now=now, ttl=self.settings.lease_ttl, job_id=job_id
        )

    async def run_once(self, job_id: str | None = None) -> ReplayJob | None:
        """Claim a job (the oldest, or ``job_id``) and run it to its end; the job as it
        ended, or ``None`` when there was none to claim."""
        job = await self.claim(job_id)
        if job is None:
            return None
        await self.run_job(job, asyncio.Event())
        return await self.box.store.flow.replay_job_get(job.id, None)

    async def run_job(self, job: ReplayJob, stopping: asyncio.Event) -> None:
        """Run the claimed job step by step until it ends, its lease is lost, or
        ``stopping`` (then the lease is given back). A step that fails for a reason
        other than the database being away (or a lock conflict) is tried
        :data:`STEP_TRIES` times in all, then the job ends ``failed`` with that error:
        an error in the data or the code does not go away by itself, and a job retried
        forever would hold its endpoint's one slot for good."""
        state = job
        failures = 0
        try:
            while True:
                if stopping.is_set():
                    await self.box.store.flow.replay_job_release(
                        job.id, self.name, now=self.box.clock.now()
                    )
                    return
                try:
                    next_state = await self.step(state)
                except _LeaseLost:
                    raise
                except Exception as exc:
                    if _passing(exc):
                        raise
                    failures += 1
                    log.warning(
                        "replay_job_step_failed",
                        job_id=job.id,
                        attempt=failures,
                        error=short_error(exc),
                    )
                    if failures < STEP_TRIES:
                        await asyncio.sleep(min(0.2 * 2**failures, 2.0))
                        continue
                    await self._finish(
                        state, "failed", error=f"a step failed {failures} times: {short_error(exc)}"
                    )
                    return
                failures = 0
                if next_state is None:
                    return
                state = next_state
        except _LeaseLost:
            log.warning("replay_job_lease_lost", job_id=job.id, runner=self.name)
        except Exception as exc:  # the database went away: the lease runs out, and then
            # this or another runner takes the job on after its last committed step
            log.warning("replay_job_step_failed", job_id=job.id, error=short_error(exc))

    async def step(self, job: ReplayJob) -> ReplayJob | None:
        """One batch of the job: the job after it, or ``None`` once it ended."""
        box, store, settings = self.box, self.box.store, self.settings
        endpoint = await get_endpoint(box, job.endpoint_id, job.tenant)
        if endpoint is None or endpoint.status != "enabled":
            why = "the endpoint was deleted" if endpoint is None else "the endpoint is disabled"
            await self._finish(job, "failed", error=why)
            return None
        room = job.max_queued - job.queued
        size = min(settings.replay_batch, settings.replay_scan_max - job.scanned)
        if room <= 0 or size <= 0:  # a limit reached: done, more may remain
            await self._finish(job, "done", resume_since=job.cursor[0] if job.cursor else job.since)
            return None
        async with store.transaction() as conn:
            page = await store.flow.message_missing_page(
                conn,
                job.tenant,
                job.endpoint_id,
                since=job.since,
                until=job.until,
                after=job.cursor,
                limit=size,
            )
        flt = None if endpoint.payload_filter is None else compile_filter(endpoint.payload_filter)
        chosen = await asyncio.to_thread(_choose, page, endpoint.event_types, flt, room)
        if chosen.last is None:  # nothing left up to until
            await self._finish(job, "done")
            return None
        now = box.clock.now()
        async with store.transaction() as conn:
            inserted = await store.flow.delivery_insert_missing(
                conn, job.endpoint_id, job.tenant, chosen.ids, now=now
            )
            counts = await store.flow.replay_job_advance(
                conn,
                job.id,
                self.name,
                scanned=chosen.read,
                queued=inserted,
                cursor=chosen.last,
                now=now,
                ttl=settings.lease_ttl,
            )
            if counts is None:
                raise _LeaseLost(job.id)
            scanned, queued = counts
            ended = len(page) < size and chosen.read == len(page)
            if ended or queued >= job.max_queued or scanned >= settings.replay_scan_max:
                await store.flow.replay_job_finish(
                    conn,
                    job.id,
                    self.name,
                    status="done",
                    now=now,
                    resume_since=None if ended else chosen.last[0],
                )
                self._ended(job, "done", scanned=scanned, queued=queued)
                return None
        return dataclasses.replace(job, scanned=scanned, queued=queued, cursor=chosen.last)

    async def _finish(
        self,
        job: ReplayJob,
        status: str,
        *,
        error: str | None = None,
        resume_since: float | None = None,
    ) -> None:
        async with self.box.store.transaction() as conn:
            done = await self.box.store.flow.replay_job_finish(
                conn,
                job.id,
                self.name,
                status=status,
                now=self.box.clock.now(),
                error=error,
                resume_since=resume_since,
            )
        if not done:
            raise _LeaseLost(job.id)
        self._ended(job, status, scanned=job.scanned, queued=job.queued, error=error)

    def _ended(self, job: ReplayJob, status: str, **counts: Any) -> None:
        log.info(
            "replay_job_ended",
            job_id=job.id,
            endpoint_id=job.endpoint_id,
            status=status,
            since=job.since,
            **counts,
        )
