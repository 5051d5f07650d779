"""The store's statements of an endpoint's flow: pause and resume, and replay missing.

:class:`FlowStore` is an area of :class:`~relaybox.store.base.Store`, beside
:class:`~relaybox.store.outbox.OutboxStore`, whose primitives it uses. A paused
endpoint's lane is skipped by the lease (``outbox_lease``), so its deliveries wait,
pending, and go out oldest first once it is resumed. Replay missing gives an endpoint
one delivery for each message it never had one for: the delivery key (message id and
endpoint id, UNIQUE in ``relaybox_outbox``) makes a second replay, or two at once,
insert nothing twice.

A replay is a job (``relaybox_replay_jobs``): the request inserts it, a dispatcher
claims it under a lease and runs it in batches, each batch's deliveries and the job's
progress in one transaction fenced by the lease (:meth:`FlowStore.replay_job_advance`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox.store.backend import Backend

__all__ = ["FlowStore", "MissingMessage", "ReplayJob", "ReplayStart"]


@dataclass(frozen=True, slots=True)
class MissingMessage:
    """A message an endpoint has no delivery of (``body``: the envelope's JSON text)."""

    id: str
    event_type: str
    body: str
    created_at: float


@dataclass(frozen=True, slots=True)
class ReplayJob:
    """A replay-missing job's row. ``status``: ``queued``, ``running``, ``done`` or
    ``failed``; ``cursor``: the ``(created_at, id)`` of the last message read;
    ``resume_since``: when done short of ``until`` (a limit reached), where a next
    replay would go on from."""

    id: str
    tenant: str
    endpoint_id: str
    since: float
    until: float
    max_queued: int
    status: str
    scanned: int
    queued: int
    cursor: tuple[float, str] | None
    resume_since: float | None
    error: str | None
    created_at: float
    started_at: float | None
    finished_at: float | None

    @classmethod
    def of(cls, r: Any) -> ReplayJob:
        cursor = None if r[9] is None else (float(r[9]), str(r[10]))
        return cls(
            r[0], r[1], r[2], float(r[3]), float(r[4]), int(r[5]), r[6], int(r[7]), int(r[8]),
            cursor, r[11], r[12], float(r[13]), r[14], r[15],
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class ReplayStart:
    """What asking for a replay job gave: the new ``job``, or why none: ``running``
    (the endpoint's queued or running job's id) or ``retry_after`` (seconds until the
    tenant's rate allows another)."""

    job: ReplayJob | None = None
    running: str | None = None
    retry_after: float | None = None


class FlowStore:
    """Pause, resume and replay-missing statements (``store.flow``)."""

    def __init__(self, db: Backend) -> None:
        self.db = db

    async def endpoint_pause(
        self, endpoint_id: str, tenant: str | None, *, paused: bool, now: float
    ) -> bool:
        """Pause (``paused``) or resume the endpoint (``tenant`` ``None``: of any
        tenant). ``True`` when this call changed it; a resume wakes the dispatchers."""
        params = (endpoint_id, tenant, now if paused else None, now)
        async with self.db.transaction() as conn:
            changed = await self.db.first(conn, "endpoint_pause", params) is not None
            if changed and not paused:
                await self.db.notify(conn, "outbox")
        return changed

    async def endpoint_paused_backlog(self) -> dict[str, int]:
        """Per paused endpoint id, how many of its deliveries wait (pending)."""
        async with self.db.transaction() as conn:
            found = await self.db.rows(conn, "endpoint_paused_backlog")
        return {r[0]: int(r[1]) for r in found}

    async def message_missing_page(
        self,
        conn: AsyncConnection,
        tenant: str,
        endpoint_id: str,
        *,
        since: float,
        until: float,
        after: tuple[float, str] | None,
        limit: int,
    ) -> list[MissingMessage]:
        """Up to ``limit`` of the tenant's messages published from ``since`` to ``until``
        (and after the ``(created_at, id)`` keyset ``after``), oldest first, with their
        body still there and no delivery to the endpoint, in ``conn``'s transaction."""
        after_time, after_id = after if after else (None, None)
        params = (tenant, endpoint_id, since, after_time, after_id, limit, until)
        found = await self.db.rows(conn, "message_missing_page", params)
        return [MissingMessage(r[0], r[1], r[2], r[3]) for r in found]

    async def delivery_insert_missing(
        self,
        conn: AsyncConnection,
        endpoint_id: str,
        tenant: str,
        message_ids: Sequence[str],
        *,
        now: float,
    ) -> int:
        """One pending delivery to the endpoint per message, in the given order, for
        those that have none yet (and whose body retention has not emptied), in
        ``conn``'s transaction; returns how many were inserted. A wake for the
        dispatchers goes with the COMMIT."""
        if not message_ids:
            return 0
        params = (endpoint_id, tenant, now, self.db.array(list(message_ids)))
        found = await self.db.rows(conn, "delivery_insert_missing", params)
        if found:
            await self.db.notify(conn, "outbox")
        return len(found)

    async def replay_job_start(
        self,
        job_id: str,
        tenant: str,
        endpoint_id: str,
        *,
        since: float,
        until: float,
        max_queued: int,
        now: float,
        per_hour: int | None,
    ) -> ReplayStart:
        """Queue a replay job for the endpoint, unless it has one queued or running, or
        (``per_hour`` set) the tenant started that many in the last hour. Dispatchers
        listening on ``replay`` wake with the COMMIT."""
        async with self.db.transaction() as conn:
            active = await self.db.first(conn, "replay_job_active", (endpoint_id,))
            if active is not None:
                return ReplayStart(running=active[0])
            if per_hour is not None:
                count, first = await self.db.first(conn, "replay_job_recent", (tenant, now - 3600))
                if int(count) >= per_hour:
                    return ReplayStart(retry_after=max(1.0, float(first) + 3600 - now))
            params = (job_id, tenant, endpoint_id, since, until, max_queued, now)
            row = await self.db.first(conn, "replay_job_insert", params)
            if row is None:  # another request's job for the endpoint committed first
                again = await self.db.first(conn, "replay_job_active", (endpoint_id,))
                return ReplayStart(running=again[0] if again else "")
            await self.db.notify(conn, "replay")
        return ReplayStart(job=ReplayJob.of(row))

    async def replay_job_get(self, job_id: str, tenant: str | None) -> ReplayJob | None:
        """The job (``tenant`` ``None``: of any tenant)."""
        async with self.db.transaction() as conn:
            row = await self.db.first(conn, "replay_job_get", (job_id, tenant))
        return None if row is None else ReplayJob.of(row)

    async def replay_job_latest(self, endpoint_id: str) -> ReplayJob | None:
        """The endpoint's newest job, if it ever had one."""
        async with self.db.transaction() as conn:
            row = await self.db.first(conn, "replay_job_latest", (endpoint_id,))
        return None if row is None else ReplayJob.of(row)

    async def replay_job_claim(
        self, owner: str, *, now: float, ttl: float, job_id: str | None = None
    ) -> ReplayJob | None:
        """Lease the oldest waiting job (or ``job_id``) that no live lease holds to
        ``owner`` for ``ttl`` seconds; ``None`` when there is none."""
        async with self.db.transaction() as conn:
            row = await self.db.first(conn, "replay_job_claim", (owner, now, ttl, job_id))
        return None if row is None else ReplayJob.of(row)

    async def replay_job_advance(
        self,
        conn: AsyncConnection,
        job_id: str,
        owner: str,
        *,
        scanned: int,
        queued: int,
        cursor: tuple[float, str],
        now: float,
        ttl: float,
    ) -> tuple[int, int] | None:
        """Add a batch's counts to the job, move its cursor and renew the lease, in
        ``conn``'s transaction, while ``owner`` holds the lease: the job's counts
        after, or ``None`` when the lease was lost (roll the batch back)."""
        params = (job_id, owner, scanned, queued, cursor[0], cursor[1], now, ttl)
        row = await self.db.first(conn, "replay_job_advance", params)
        return None if row is None else (int(row[0]), int(row[1]))

    async def replay_job_finish(
        self,
        conn: AsyncConnection,
        job_id: str,
        owner: str,
        *,
        status: str,
        now: float,
        error: str | None = None,
        resume_since: float | None = None,
    ) -> bool:
        """End the job ``done`` or ``failed`` while ``owner`` holds its lease."""
        params = (job_id, owner, status, error, resume_since, now)
        return await self.db.first(conn, "replay_job_finish", params) is not None

    async def replay_job_release(self, job_id: str, owner: str, *, now: float) -> None:
        """Give the job's lease back (a stopping dispatcher): claimable at once."""
        async with self.db.transaction() as conn:
            await self.db.rows(conn, "replay_job_release", (job_id, owner, now))

    async def replay_jobs_purge(self, before: float, *, limit: int) -> int:
        """Maintenance: drop up to ``limit`` jobs that ended before ``before``."""
        async with self.db.transaction() as conn:
            return len(await self.db.rows(conn, "replay_jobs_purge", (before, limit)))
