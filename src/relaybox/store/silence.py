"""The store's silence area: what :mod:`relaybox.silence` reads to tell whether a
source or an endpoint has gone quiet, and the state it keeps (``relaybox_silences``).

:class:`SilenceStore` is an area of :class:`~relaybox.store.base.Store`. Its methods
run the named queries of ``sql/<backend>_silence.sql``; none is on a hot path (the
maintenance role calls them). The reads cost what the number of watched sources and
endpoints sets, through indexes, never a walk over history; a silence is raised and
ended by conditional updates in the caller's transaction, so of several hosts
checking at once one raises it (and publishes its event) and one ends it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox.store.backend import Backend

__all__ = [
    "EndpointActivity",
    "SilenceKind",
    "SilenceState",
    "SilenceStore",
    "SilenceSummary",
]

SILENT_COUNT_CAP = 10_000
"""Silent endpoints are counted up to this many."""

SilenceKind = Literal["source", "endpoint"]


@dataclass(frozen=True, slots=True)
class EndpointActivity:
    """An endpoint as the silence check sees it: its last success (``None``: none
    noted) and since when deliveries wait for it (``None``: none waits)."""

    id: str
    tenant: str
    url: str
    last_success_at: float | None
    created_at: float
    waiting_since: float | None


@dataclass(frozen=True, slots=True)
class SilenceState:
    """One row of ``relaybox_silences``."""

    kind: str
    name: str
    last_seen: float | None
    expected: float | None
    silent_since: float | None
    learned: float | None
    learned_at: float | None
    checked_at: float


@dataclass(frozen=True, slots=True)
class SilenceSummary:
    """What the operator surfaces show: every watched source, how many endpoints are
    silent (counted up to :data:`SILENT_COUNT_CAP`) and the longest silent ones."""

    sources: list[SilenceState]
    silent_endpoints: int
    endpoints: list[SilenceState]

    @property
    def silent_sources(self) -> list[SilenceState]:
        return [s for s in self.sources if s.silent_since is not None]


class SilenceStore:
    """Silence detection's reads and state (``store.silence``)."""

    def __init__(self, db: Backend) -> None:
        self.db = db

    async def sources_seen(self, sources: Sequence[str]) -> dict[str, float | None]:
        """Each source's newest arrival (``None``: it never received anything)."""
        if not sources:
            return {}
        async with self.db.transaction() as conn:
            found = await self.db.rows(
                conn, "silence_sources_seen", (self.db.array(list(sources)),)
            )
        return {str(r[0]): None if r[1] is None else float(r[1]) for r in found}

    async def arrivals(self, source: str, since: float, limit: int) -> list[float]:
        """Arrival times of the source's newest ``limit`` events since ``since``,
        newest first (learning its window)."""
        async with self.db.transaction() as conn:
            found = await self.db.rows(conn, "silence_arrivals", (source, since, limit))
        return [float(r[0]) for r in found]

    async def endpoints(self, operational_tenant: str) -> list[EndpointActivity]:
        """Every enabled, unpaused endpoint outside ``operational_tenant``."""
        async with self.db.transaction() as conn:
            found = await self.db.rows(conn, "silence_endpoints", (operational_tenant,))
        return [
            EndpointActivity(
                id=str(r[0]),
                tenant=str(r[1]),
                url=str(r[2]),
                last_success_at=None if r[3] is None else float(r[3]),
                created_at=float(r[4]),
                waiting_since=None if r[5] is None else float(r[5]),
            )
            for r in found
        ]

    async def states(self) -> list[SilenceState]:
        """Every watched source as the last check left it."""
        async with self.db.transaction() as conn:
            found = await self.db.rows(conn, "silence_states")
        return [SilenceState(*r) for r in found]

    async def summary(self, limit: int = 20) -> SilenceSummary:
        """The watched sources, and the ``limit`` longest silent endpoints: read in
        a time set by the configured sources and ``limit``, never by the endpoints."""
        async with self.db.transaction() as conn:
            sources = await self.db.rows(conn, "silence_states")
            endpoints = await self.db.rows(conn, "silence_silent_endpoints", (limit,))
            count = await self.db.first(conn, "silence_silent_endpoints_count", (SILENT_COUNT_CAP,))
        return SilenceSummary(
            [SilenceState(*r) for r in sources],
            int(count[0]),
            [SilenceState(*r) for r in endpoints],
        )

    async def rows(self, kind: SilenceKind) -> dict[str, SilenceState]:
        """The state of every watched name of ``kind``, by name."""
        async with self.db.transaction() as conn:
            found = await self.db.rows(conn, "silence_rows", (kind,))
        return {str(r[1]): SilenceState(*r) for r in found}

    async def note(
        self,
        kind: SilenceKind,
        notes: Sequence[tuple[str, float | None, float | None]],
        *,
        now: float,
    ) -> None:
        """Record what a check saw, ``(name, last_seen, expected)`` per name whose
        values changed or that is new, in one statement."""
        if not notes:
            return
        if self.db.backend == "sqlite":
            params: tuple[Any, ...] = (kind, json.dumps([list(n) for n in notes]), now)
        else:
            names, seen, expected = (list(column) for column in zip(*notes, strict=True))
            params = (kind, names, seen, expected, now)
        async with self.db.transaction() as conn:
            await self.db.rows(conn, "silence_note", params)

    async def start(
        self, conn: AsyncConnection, kind: SilenceKind, name: str, *, now: float
    ) -> bool:
        """Mark the silence raised; ``False`` when another check already did."""
        return await self.db.first(conn, "silence_raise", (kind, name, now)) is not None

    async def end(self, conn: AsyncConnection, kind: SilenceKind, name: str) -> bool:
        """Mark the silence ended; ``False`` when another check already did."""
        return await self.db.first(conn, "silence_end", (kind, name)) is not None

    async def learned(
        self, kind: SilenceKind, name: str, learned: float | None, *, now: float
    ) -> None:
        """Store a learned window (``None``: too few arrivals to learn one), the
        name's row made if it has none yet."""
        async with self.db.transaction() as conn:
            await self.db.rows(conn, "silence_learned", (kind, name, learned, now))

    async def forget(self, kind: SilenceKind, watched: Sequence[str]) -> list[str]:
        """Drop the rows of ``kind`` not in ``watched``; return their names."""
        async with self.db.transaction() as conn:
            found = await self.db.rows(conn, "silence_forget", (kind, self.db.array(list(watched))))
        return [str(r[0]) for r in found]
