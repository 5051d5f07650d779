"""The store's history area: replay, pull-based recovery, reconciliation, versioned
projections, retention and the queue reads behind the metrics.

:class:`HistoryStore` is an area of :class:`~relaybox.store.base.Store`. Its methods
run the named queries of ``sql/<backend>_replay.sql``, ``_ordering.sql`` and
``_ops.sql`` through the store's primitives (:meth:`Backend.rows`, :meth:`Backend.first`):
on PostgreSQL these run on the asyncpg connection beneath the caller's
``AsyncConnection``, in its transaction, so the statements a handler makes
(:meth:`projection_upsert`, :meth:`reconcile_request`) cost no more than they would
through SQLAlchemy and no extra round trip. Methods taking ``conn`` run in the
caller's transaction; the others open their own. The maintenance lock differs by
backend: each backend module defines :meth:`maintenance_try_lock`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox.store import statements as st
from relaybox.store.backend import Backend
from relaybox.store.erasure import forget_purged

__all__ = [
    "HistoryStore",
    "Projection",
    "ProjectionWrite",
    "PurgeTable",
    "QueueGroup",
    "QueueSnapshot",
    "ReconcileTicket",
    "RecoveryRecord",
    "ReplayCandidate",
    "ReplayFilter",
]

PurgeTable = Literal["inbox", "quarantine", "outbox", "messages"]
"""What retention purges: inbox events, quarantine entries, outbox deliveries (and
their attempts' responses), messages."""

_FIND_CHUNK = 500
"""Event ids per ``inbox_find_events`` statement: bounds one statement's parameter."""


@dataclass(frozen=True, slots=True)
class ReplayFilter:
    """Which finished rows a replay selects (at most ``limit``); ``None`` does not
    filter."""

    ids: Sequence[int] | None = None
    source: str | None = None
    since: float | None = None
    until: float | None = None
    statuses: Sequence[str] | None = None
    limit: int = 10_000


@dataclass(frozen=True, slots=True)
class ReplayCandidate:
    """A row a selection matches, as it is now."""

    inbox_id: int
    status: str
    dead_reason: str | None
    purged: bool
    discarded: bool = False  # a dead letter an operator discarded


@dataclass(frozen=True, slots=True)
class RecoveryRecord:
    """One recovery action (``ingested``, ``redelivery_requested``) on one delivery."""

    source: str
    event_id: str
    delivery_id: str
    action: str
    inbox_id: int | None
    recovered_at: float


@dataclass(frozen=True, slots=True)
class ReconcileTicket:
    """A reconciliation's ticket (its version), and the request counter seen with it."""

    ticket: int
    requested_seen: int


@dataclass(frozen=True, slots=True)
class ProjectionWrite:
    """A state offered to the projection's compare-and-set."""

    resource_key: str
    origin: str  # "event" (provider versions) or "reconcile" (fetch tickets)
    version: str
    version_key: str
    state_json: str
    source: str | None
    inbox_id: int | None
    updated_at: float

    def params(self) -> tuple[Any, ...]:
        """The parameters of ``projection_upsert``."""
        return (
            self.resource_key,
            self.origin,
            self.version,
            self.version_key,
            self.state_json,
            self.source,
            self.inbox_id,
            self.updated_at,
        )


@dataclass(frozen=True)
class Projection:
    """A stored current state."""

    resource_key: str
    origin: str  # "event" (provider versions) or "reconcile" (fetch tickets)
    version: str
    version_key: str
    state: Any
    source: str | None
    inbox_id: int | None
    updated_at: float

    @classmethod
    def from_row(cls, row: Any) -> Projection:
        """A row of ``projection_get``."""
        return cls(
            resource_key=row[0],
            origin=row[1],
            version=row[2],
            version_key=row[3],
            state=None if row[4] is None else json.loads(row[4]),
            source=row[5],
            inbox_id=row[6],
            updated_at=row[7],
        )


@dataclass(frozen=True)
class QueueGroup:
    """Rows of one queue sharing (source, status, reason); outbox "source" is the channel."""

    queue: str
    source: str
    status: str
    reason: str
    discarded: bool
    count: int
    oldest: float | None
    retrying: int
    attempts: int


@dataclass(frozen=True, slots=True)
class QueueSnapshot:
    """The queue tables read in one transaction."""

    groups: tuple[QueueGroup, ...]
    quarantined_by_source: dict[str, int]


class HistoryStore:
    """Replay, recovery, reconciliation, projections, retention and metrics reads."""

    def __init__(self, db: Backend) -> None:
        self.db = db

    # -- replay -------------------------------------------------------------------------

    async def replay_select(
        self, conn: AsyncConnection, selection: ReplayFilter
    ) -> list[ReplayCandidate]:
        """The finished rows ``selection`` matches, by id (pending rows never match)."""
        params = (
            None if selection.ids is None else self.db.array(selection.ids),
            selection.source,
            selection.since,
            selection.until,
            None if selection.statuses is None else self.db.array(selection.statuses),
            selection.limit,
        )
        rows = await self.db.rows(conn, "replay_select", params)
        return [ReplayCandidate(r[0], r[1], r[2], bool(r[3]), bool(r[4])) for r in rows]

    async def replay_mark(
        self, conn: AsyncConnection, inbox_id: int, *, status: str, now: float
    ) -> bool:
        """Put the row back to pending with a fresh attempt budget if it is still in
        ``status`` and has its payload; it is judged again (its ``superseded_by``
        cleared). Returns whether it was marked."""
        if await self.db.first(conn, "replay_mark", (inbox_id, now, status)) is None:
            return False
        await self.db.rows(conn, "inbox_clear_superseded", (inbox_id,))
        return True

    async def replay_record(
        self,
        conn: AsyncConnection,
        candidate: ReplayCandidate,
        *,
        actor: str,
        reason: str,
        now: float,
    ) -> None:
        """Record who replayed ``candidate``, why, and what it was before."""
        await self.db.rows(
            conn,
            "replay_record",
            (candidate.inbox_id, actor, reason, candidate.status, candidate.dead_reason, now),
        )

    # -- recovery -----------------------------------------------------------------------

    async def inbox_find_events(self, source: str, event_ids: Sequence[str]) -> set[str]:
        """Which of ``event_ids`` ``source`` already holds, whatever the account."""
        found: set[str] = set()
        async with self.db.transaction() as conn:
            for i in range(0, len(event_ids), _FIND_CHUNK):
                chunk = self.db.array(event_ids[i : i + _FIND_CHUNK])
                found.update(
                    r[0] for r in await self.db.rows(conn, "inbox_find_events", (source, chunk))
                )
        return found

    async def inbox_mark_recovered(self, conn: AsyncConnection, inbox_id: int, via: str) -> None:
        """Say where a recovered row came from (it did not arrive by HTTP)."""
        await self.db.rows(conn, "inbox_mark_recovered", (inbox_id, via))

    async def recovery_record(
        self, record: RecoveryRecord, *, conn: AsyncConnection | None = None
    ) -> None:
        """Record one recovery action (in ``conn``'s transaction if given)."""
        params = (
            record.source,
            record.event_id,
            record.delivery_id,
            record.action,
            record.inbox_id,
            record.recovered_at,
        )
        if conn is not None:
            await self.db.rows(conn, "recovery_record", params)
            return
        async with self.db.transaction() as own:
            await self.db.rows(own, "recovery_record", params)

    # -- reconciliation -----------------------------------------------------------------

    async def reconcile_ticket_take(self, source: str, resource_id: str) -> ReconcileTicket:
        """Issue the resource's next ticket in a transaction of its own (before the
        fetch: a later ticket belongs to a read that started later)."""
        async with self.db.transaction() as conn:
            row = await self.db.first(conn, "reconcile_ticket", (source, resource_id))
        assert row is not None  # an upsert with RETURNING always returns its row
        return ReconcileTicket(int(row[0]), int(row[1]))

    async def reconcile_lock(self, conn: AsyncConnection, source: str, resource_id: str) -> None:
        """Lock the resource's ticket row until ``conn``'s transaction ends."""
        await self.db.rows(conn, "reconcile_lock", (source, resource_id))

    async def reconcile_done(
        self,
        conn: AsyncConnection,
        source: str,
        resource_id: str,
        *,
        requested_seen: int,
        now: float,
        diverged: bool,
    ) -> None:
        """Mark the requests seen with the ticket served; count a divergence."""
        await self.db.rows(
            conn, "reconcile_done", (source, resource_id, requested_seen, now, int(diverged))
        )

    async def reconcile_request(self, conn: AsyncConnection, source: str, resource_id: str) -> None:
        """Ask for a reconciliation, in ``conn``'s (a handler's) transaction."""
        await self.db.rows(conn, "reconcile_request", (source, resource_id))

    async def reconcile_ids(
        self, source: str, *, requested: bool = False, limit: int = 100_000
    ) -> list[str]:
        """Resource ids of ``source`` reconciled or requested before, in order
        (``requested``: only those with a request not yet served)."""
        async with self.db.transaction() as conn:
            if requested:
                rows = await self.db.rows(conn, "reconcile_ids_requested", (source, limit))
            else:
                rows = await self.db.rows(conn, "reconcile_ids_all", (source, limit))
        return [r[0] for r in rows]

    # -- projections --------------------------------------------------------------------

    async def projection_upsert(self, conn: AsyncConnection, new: ProjectionWrite) -> bool:
        """Compare-and-set: write ``new`` if the resource is new, or stored with a lower
        ``version_key`` by the same origin. Returns whether it was written."""
        return await self.db.first(conn, "projection_upsert", new.params()) is not None

    async def projection_get(self, conn: AsyncConnection, resource_key: str) -> Projection | None:
        row = await self.db.first(conn, "projection_get", (resource_key,))
        return None if row is None else Projection.from_row(row)

    async def inbox_mark_superseded(self, conn: AsyncConnection, inbox_id: int, by: str) -> None:
        """Add ``by`` (``resource@version``) to the row's ``superseded_by``."""
        await self.db.rows(conn, *st.inbox_mark_superseded(inbox_id, by))

    # -- retention ----------------------------------------------------------------------

    async def retention_count(self, table: PurgeTable, cutoff: float) -> int:
        """Rows of ``table`` whose payload a purge at ``cutoff`` drops."""
        async with self.db.connect() as conn:
            if table == "inbox":
                row = await self.db.first(conn, "ops_purge_count", (cutoff,))
            elif table == "quarantine":
                row = await self.db.first(conn, "ops_purge_quarantine_count", (cutoff,))
            elif table == "outbox":
                row = await self.db.first(conn, "ops_purge_outbox_count", (cutoff,))
            else:
                row = await self.db.first(conn, "ops_purge_messages_count", (cutoff,))
        return int(row[0])

    async def retention_purge_batch(
        self, table: PurgeTable, *, cutoff: float, now: float, limit: int
    ) -> int:
        """Purge up to ``limit`` rows of ``table`` finished before ``cutoff``, in a
        transaction of their own; returns how many. A delivery's attempts lose their
        stored responses with it, and the subject index the rows it finds no more
        (:func:`~relaybox.store.erasure.forget_subjects`)."""
        params = (cutoff, now, limit)
        async with self.db.connect() as conn:
            if table == "inbox":
                rows = await self.db.rows(conn, "ops_purge_inbox", params)
                if rows:
                    ids = self.db.array([r[0] for r in rows])
                    await self.db.rows(conn, "operations_purge", (ids,))
            elif table == "quarantine":
                rows = await self.db.rows(conn, "ops_purge_quarantine", params)
            elif table == "outbox":
                rows = await self.db.rows(conn, "ops_purge_outbox", params)
                if rows:
                    ids = self.db.array([r[0] for r in rows])
                    await self.db.rows(conn, "ops_purge_outbox_responses", (ids,))
            else:
                rows = await self.db.rows(conn, "ops_purge_messages", params)
            if rows:
                await forget_purged(self.db, conn, table, [r[0] for r in rows])
        return len(rows)

    # -- metrics ------------------------------------------------------------------------

    async def ops_stats_queues(self) -> QueueSnapshot:
        """The inbox and outbox queues by (source, status, reason) and the open
        quarantine entries by source, in one transaction (one consistent view on
        PostgreSQL)."""
        groups: list[QueueGroup] = []
        async with self.db.connect() as conn:
            inbox = await self.db.rows(conn, "ops_stats_inbox")
            outbox = await self.db.rows(conn, "ops_stats_outbox")
            quarantine = await self.db.rows(conn, "ops_stats_quarantine")
        for queue, rows in (("inbox", inbox), ("outbox", outbox)):
            groups.extend(
                QueueGroup(
                    queue=queue,
                    source=r[0],
                    status=r[1],
                    reason=r[2] or "",
                    discarded=bool(r[3]),
                    count=int(r[4]),
                    oldest=r[5],
                    retrying=int(r[6] or 0),
                    attempts=int(r[7] or 0),
                )
                for r in rows
            )
        return QueueSnapshot(
            groups=tuple(groups), quarantined_by_source={r[0]: int(r[1]) for r in quarantine}
        )
