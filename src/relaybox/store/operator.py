"""The store's operator area: the inbox, dead-letter and quarantine listings and
actions behind the admin API, the dashboard and the CLI, an event's history, the
throughput chart, table checks, and what ``relaybox doctor`` reads of the database.

:class:`OperatorStore` is an area of :class:`~relaybox.store.base.Store`. Its methods
run the named queries of ``sql/<backend>_ops.sql`` and ``_testing.sql`` in a
transaction of their own (none of them is on a hot path) and return plain rows as
``dict`` keyed by column (the columns each query names) or small dataclasses. Every
write is guarded by the state it expects (the query's ``WHERE``), so two operators
acting at once cannot both discard or resolve the same row; the method says whether
it changed the row.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox.store.backend import Backend

__all__ = [
    "DatabaseHealth",
    "DoctorProbe",
    "EventHistory",
    "EventListing",
    "OperatorStore",
    "Row",
    "ThroughputRow",
]

Row = dict[str, Any]
"""A row keyed by the columns its query names."""


@dataclass(frozen=True, slots=True)
class EventHistory:
    """One inbox event and everything recorded about it, read in one transaction."""

    event: Row
    attempts: list[Row]
    business_keys: list[Row]
    outbox: list[Row]
    replays: list[Row]
    quarantine: list[Row]


class EventListing(TypedDict):
    """What the listings of events (the inbox's, the dead letters') filter on, each
    ``None`` for any: the source, the event type, the tenant, the time received
    (``since``, ``until``); a page of at most ``limit`` with ids below ``before_id``."""

    source: str | None
    event_type: str | None
    tenant: str | None
    since: float | None
    until: float | None
    before_id: int | None
    limit: int


def _listing_params(listing: EventListing, state: str | None) -> tuple[Any, ...]:
    """The parameters of the listing statements: ``state`` (the inbox's status, the
    dead letters' reason) third."""
    return (
        listing["source"],
        listing["event_type"],
        state,
        listing["tenant"],
        listing["since"],
        listing["until"],
        listing["before_id"],
        listing["limit"],
    )


@dataclass(frozen=True, slots=True)
class ThroughputRow:
    """Deliveries accepted in one minute (epoch minutes) that have ``status`` now."""

    minute: int
    status: str
    count: int


@dataclass(frozen=True, slots=True)
class DoctorProbe:
    """The applied migrations and the database's clock, with this machine's clock read
    just before and just after the database's (the skew is taken against their middle)."""

    applied: frozenset[int]
    db_now: float
    before: float
    after: float


@dataclass(frozen=True, slots=True)
class DatabaseHealth:
    """What long transactions and dead rows look like, read from the database's own
    statistics (``/metrics`` and ``relaybox doctor``).

    PostgreSQL: ``transactions`` are the open transactions of this database's other
    sessions, oldest first (``pid``, ``state``, ``application_name``, ``age`` in
    seconds, ``relaybox``: whether it holds a lock on one of relaybox's tables), from
    ``pg_stat_activity`` and ``pg_locks``; ``tables`` are relaybox's tables with their
    ``live`` and ``dead`` row estimates and when they were last vacuumed
    (``vacuumed_at``, epoch seconds or ``None``), from ``pg_stat_user_tables``. A role
    without ``pg_read_all_stats`` sees only its own sessions' transactions.

    SQLite shows no other connection's transactions; its counterparts are the pages
    deletes freed that only ``VACUUM`` returns (``free_pages`` of ``pages``) and the
    size of the write-ahead log (``wal_bytes``), which grows while a long read keeps
    checkpoints from reaching its end."""

    transactions: list[Row]
    tables: list[Row]
    pages: int | None = None
    free_pages: int | None = None
    wal_bytes: int | None = None

    def oldest(self, *, relaybox: bool) -> float | None:
        """Seconds the oldest open transaction has run (``relaybox``: of those holding
        a lock on relaybox's tables); ``None`` when there is none or it cannot be seen."""
        ages = [t["age"] for t in self.transactions if t["relaybox"] or not relaybox]
        return max(ages) if ages else None


class OperatorStore:
    """Operator listings, actions and checks (``store.operator``)."""

    def __init__(self, db: Backend) -> None:
        self.db = db

    async def _maps(self, conn: AsyncConnection, name: str, params: Sequence[Any]) -> list[Row]:
        return await self.db.maps(conn, name, params)

    async def _read(self, name: str, params: Sequence[Any] = ()) -> list[Row]:
        async with self.db.connect() as conn:
            return await self._maps(conn, name, params)

    # -- checks -----------------------------------------------------------------------

    async def table_exists(self, table: str) -> bool:
        """Whether a migration created ``table``."""
        async with self.db.connect() as conn:
            result = await conn.exec_driver_sql(self.db.q["ops_table_exists"], (table,))
            return bool(result.scalar())

    async def db_time(self) -> float:
        """The database server's clock, in seconds since the epoch (``clock_timestamp()``
        on PostgreSQL: the time of the read, not of the transaction's start)."""
        async with self.db.connect() as conn:
            return float((await conn.exec_driver_sql(self.db.q["ops_db_now"])).scalar_one())

    async def doctor_probe(self) -> DoctorProbe:
        """The applied migration versions and the database's clock, in one transaction.
        Raises the driver's error when the database is unreachable or was never
        migrated (its message names ``relaybox_migrations``)."""
        async with self.db.connect() as conn:
            result = await conn.exec_driver_sql(self.db.q["ops_migrations_applied"])
            applied = frozenset(int(r[0]) for r in result)
            before = time.time()
            db_now = float((await conn.exec_driver_sql(self.db.q["ops_db_now"])).scalar_one())
            after = time.time()
        return DoctorProbe(applied=applied, db_now=db_now, before=before, after=after)

    async def database_health(self) -> DatabaseHealth:
        """Long transactions and dead rows (:class:`DatabaseHealth`), read from the
        backend's own statistics (each backend implements it)."""
        return await self.db.health()

    # -- inbox ------------------------------------------------------------------------

    async def inbox_list(self, *, status: str | None, **listing: Unpack[EventListing]) -> list[Row]:
        """The inbox events of ``status`` (``None``: any) the ``listing`` matches,
        newest first, keyset-paginated (ids below ``before_id``)."""
        return await self._read("ops_inbox_list", _listing_params(listing, status))

    async def inbox_history(self, inbox_id: int) -> EventHistory | None:
        """The event with its attempts, business keys, outbox rows, replays and
        quarantine entries; ``None`` when there is no such event."""
        async with self.db.connect() as conn:
            found = await self._maps(conn, "inbox_get", (inbox_id,))
            if not found:
                return None
            return EventHistory(
                event=found[0],
                attempts=await self._maps(conn, "ops_inbox_attempts", (inbox_id,)),
                business_keys=await self._maps(conn, "ops_inbox_operations", (inbox_id,)),
                outbox=await self._maps(conn, "ops_inbox_outbox", (inbox_id,)),
                replays=await self._maps(conn, "ops_inbox_replays", (inbox_id,)),
                quarantine=await self._maps(conn, "ops_inbox_quarantine", (inbox_id,)),
            )

    async def inbox_purged_at(
        self, inbox_ids: Sequence[int], *, column: str = "purged_at"
    ) -> dict[int, float | None]:
        """When retention purged each event's payload (``None``: not purged or absent);
        with ``column="erased_at"``, when an erasure emptied it."""
        out: dict[int, float | None] = {}
        async with self.db.connect() as conn:
            for inbox_id in inbox_ids:
                found = await self._maps(conn, "inbox_get", (inbox_id,))
                out[inbox_id] = found[0][column] if found else None
        return out

    async def inbox_throughput(self, since: float) -> list[ThroughputRow]:
        """Deliveries accepted per minute since ``since``, by their status now."""
        rows = await self._read("ops_throughput", (since,))
        return [ThroughputRow(int(r["minute"]), str(r["status"]), int(r["n"])) for r in rows]

    # -- dead letters -----------------------------------------------------------------

    async def dead_list(self, *, reason: str | None, **listing: Unpack[EventListing]) -> list[Row]:
        """The dead letters not discarded of ``reason`` (``None``: any) the ``listing``
        matches, newest first, keyset-paginated."""
        return await self._read("ops_dead_list", _listing_params(listing, reason))

    async def dead_discard(self, inbox_id: int, *, now: float, actor: str, reason: str) -> bool:
        """Discard an undiscarded dead letter; whether this call discarded it."""
        return bool(await self._read("ops_dead_discard", (inbox_id, now, actor, reason)))

    # -- quarantine -------------------------------------------------------------------

    async def quarantine_list(
        self, *, source: str | None, resolved: bool | None, before_id: int | None, limit: int
    ) -> list[Row]:
        """Quarantine entries, newest first (``resolved``: ``None`` any, else only
        resolved or only open ones)."""
        flag = None if resolved is None else self.db.flag(resolved)
        return await self._read("ops_quarantine_list", (source, flag, before_id, limit))

    async def quarantine_get(self, quarantine_id: int) -> Row | None:
        """A quarantined delivery next to the original it collided with."""
        rows = await self._read("ops_quarantine_get", (quarantine_id,))
        return rows[0] if rows else None

    async def quarantine_resolve(
        self, quarantine_id: int, *, now: float, resolution: str, actor: str, reason: str
    ) -> bool:
        """Record the decision on an open entry; whether this call resolved it."""
        params = (quarantine_id, now, resolution, actor, reason)
        return bool(await self._read("ops_quarantine_resolve", params))

    # -- test views (relaybox.testing) ------------------------------------------------

    async def testing_inbox(self, source: str | None, event_id: str | None) -> list[Row]:
        """Every inbox row (of ``source``, of ``event_id``), in insertion order."""
        return await self._read("testing_inbox_list", (source, event_id))

    async def testing_operations(self, prefix: str | None) -> list[Row]:
        """Business keys recorded by handlers (starting with ``prefix``)."""
        return await self._read("testing_operations_list", (prefix,))

    async def testing_outbox(self, channel: str | None) -> list[Row]:
        """Every outbox row (of ``channel``), in insertion order."""
        return await self._read("testing_outbox_list", (channel,))
