"""Time partitions of the history on PostgreSQL (docs/scaling.md, "Time partitions").

Layout. ``relaybox_inbox`` and ``relaybox_quarantine`` are partitioned by RANGE on
their id, ``relaybox_inbox_attempts`` on its ``inbox_id``, a partition a day or a
week. Their new ids are *day-encoded* (migration 0032, ``relaybox_day_id``): the day
by the database's clock in the high 32 bits, the sequence in the low 32, so a range
of ids is a range of days, and a lookup by id still reads one partition. An attempts
partition has the bounds of its event's partition: they go together. Quarantine
entries partition on their own id (their ``inbox_id`` may name a row that is gone).
A DEFAULT partition takes any row whose partition is missing (an insert is never
refused); a partition made later for its range takes its rows from there.

The UNIQUE event key of the inbox and the quarantine's UNIQUE (inbox_id, fingerprint)
cannot stay on a partitioned table (a unique index must hold the partition key): the
keys tables (migration 0027) decide duplicates already, and the quarantine insert is
decided under its advisory lock. The conversion waits for the keys backfill to finish
before it drops them.

Conversion (:func:`convert`, ``relaybox migrate --partitions``): per table, resumable
at every step, the traffic flowing: new ids by day; a CHECK of the partition key's
bound added NOT VALID then validated (no write blocked); then one short transaction
renames the live table to its first partition (named for the day of the conversion),
creates the partitioned parent with the same columns, checks and indexes, and
ATTACHes the old table (the validated CHECK spares the scan; its indexes become the
parent's, none is built). No row is copied.

Maintenance (:func:`maintain`): partitions made ahead; a partition dropped (DETACH,
then DROP) once no row in it must stay — nothing pending, no undiscarded dead letter,
no original of an open quarantine entry — and every row is past the retention age of
its tenant or source. A detached partition is marked in the same transaction as its
DETACH, so a run killed before the DROP leaves it to the next run. One maintainer at
a time (an advisory lock on the DDL connection).

Messages (TEXT ids) and the outbox are not partitioned yet: the outbox's UNIQUE
(channel, key) decides its ``ON CONFLICT`` and needs a keys table of its own first.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import asyncpg
import structlog

__all__ = [
    "PERIODS",
    "TABLES",
    "MaintainResult",
    "Partition",
    "PartitionSpec",
    "convert",
    "day_id",
    "maintain",
    "partitioned",
]

log = structlog.get_logger("relaybox.partitions")

Period = Literal["day", "week"]
PERIODS: Mapping[str, int] = {"day": 1, "week": 7}

MINVALUE = -(2**63)
MAXVALUE = 2**63 - 1


@dataclass(frozen=True)
class PartitionSpec:
    table: str
    key: str
    seq: str
    drop_uniques: tuple[str, ...] = ()
    primary_key: bool = True
    """Whether the parent keeps a primary key on ``id`` (it holds the partition key)."""
    day_ids: bool = True
    """Whether its own ids become day-encoded (the partition key is its id)."""


TABLES: tuple[PartitionSpec, ...] = (
    PartitionSpec(
        "relaybox_inbox", "id", "relaybox_inbox_id_seq", drop_uniques=("relaybox_inbox_event_key",)
    ),
    PartitionSpec(
        "relaybox_inbox_attempts",
        "inbox_id",
        "relaybox_inbox_attempts_id_seq",
        primary_key=False,
        day_ids=False,
    ),
    PartitionSpec(
        "relaybox_quarantine",
        "id",
        "relaybox_quarantine_id_seq",
        drop_uniques=("relaybox_quarantine_once",),
    ),
)
_BY_NAME = {s.table: s for s in TABLES}


def day_id(day: int, low: int = 0) -> int:
    """The day-encoded id of day ``day`` with ``low`` in its low 32 bits."""
    return (day << 32) | (low & 0xFFFFFFFF)


def period_start(day: int, period: str) -> int:
    """The first day of the period holding ``day`` (weeks start on Monday)."""
    if period == "week":
        return day - ((day - 4) % 7)  # 1970-01-01 was a Thursday: day 4 a Monday
    return day


def _date(day: int) -> str:
    return (dt.date(1970, 1, 1) + dt.timedelta(days=day)).strftime("%Y%m%d")


@dataclass(frozen=True)
class Partition:
    name: str
    lo: int
    hi: int
    default: bool = False

    @property
    def hi_day(self) -> int:
        return self.hi >> 32


_BOUND = re.compile(r"FOR VALUES FROM \((MINVALUE|'?-?\d+'?)\) TO \((MAXVALUE|'?-?\d+'?)\)")


def _parse(name: str, bound: str) -> Partition:
    if bound.strip() == "DEFAULT":
        return Partition(name, MINVALUE, MAXVALUE, True)
    m = _BOUND.search(bound)
    if m is None:
        raise RuntimeError(f"partition {name}: unexpected bound {bound!r}")
    lo, hi = (x.strip("'") for x in m.groups())
    return Partition(
        name,
        MINVALUE if lo == "MINVALUE" else int(lo),
        MAXVALUE if hi == "MAXVALUE" else int(hi),
    )


@dataclass
class MaintainResult:
    """What one maintenance of the partitions did."""

    created: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    moved: int = 0
    """Rows moved from a DEFAULT partition into a partition made for them."""
    held: dict[str, str] = field(default_factory=dict)
    """Partitions old enough to drop, kept, and why."""
    skipped: bool = False
    """Another maintainer held the lock."""
    converted: list[str] = field(default_factory=list)
    """Tables whose conversion, begun by a run that did not finish it, this one
    finished."""


class _Ddl:
    """The DDL connection: the named templates, filled in, run one by one."""

    def __init__(self, conn: asyncpg.Connection, q: Mapping[str, str]) -> None:
        self.conn = conn
        self.q = q

    def sql(self, block: str, /, **names: Any) -> str:
        return self.q[block].format(**names)

    async def run(self, block: str, /, *args: Any, **names: Any) -> None:
        await self.conn.execute(self.sql(block, **names), *args)

    async def rows(self, block: str, /, *args: Any, **names: Any) -> list[Any]:
        return list(await self.conn.fetch(self.sql(block, **names), *args))

    async def val(self, block: str, /, *args: Any, **names: Any) -> Any:
        return await self.conn.fetchval(self.sql(block, **names), *args)


async def partitioned(conn: asyncpg.Connection, q: Mapping[str, str]) -> set[str]:
    """The history tables that are partitioned already."""
    ddl = _Ddl(conn, q)
    return {s.table for s in TABLES if await ddl.val("part_is_partitioned", s.table)}


async def _list(ddl: _Ddl, table: str) -> list[Partition]:
    found = [_parse(r["name"], r["bound"]) for r in await ddl.rows("part_list", table)]
    return sorted(found, key=lambda p: (p.default, p.lo))


async def _retry_locked(step: Callable[[], Any], *, tries: int = 20) -> Any:
    """Run ``step`` (a transaction that takes an ACCESS EXCLUSIVE lock under a short
    lock_timeout) until it gets its lock."""
    for attempt in range(tries):
        try:
            return await step()
        except (asyncpg.LockNotAvailableError, asyncpg.DeadlockDetectedError):
            if attempt == tries - 1:
                raise
            await asyncio.sleep(0.2 * (attempt + 1))
    return None


async def convert(
    conn: asyncpg.Connection,
    q: Mapping[str, str],
    period: str,
    *,
    before_switch: Callable[[str, str], Any] | None = None,
    ahead: int = 3,
) -> list[str]:
    """Partition every history table not partitioned yet (see the module's text).
    Resumable: each step looks at the catalog and does only what is missing. The keys
    backfill of events must have finished (the caller runs it first). ``before_switch``
    (table, step) is called before each step (tests kill the process there). Returns
    the tables converted by this call."""
    if period not in PERIODS:
        raise ValueError(f"partitions by {period!r}: day or week")
    ddl = _Ddl(conn, q)
    done: list[str] = []
    if not [s for s in TABLES if not await ddl.val("part_is_partitioned", s.table)]:
        return done
    for _ in range(600):  # a maintenance run holds it for a while at most
        if await ddl.val("part_lock"):
            break
        await asyncio.sleep(0.5)
    else:
        raise RuntimeError("another process is converting or maintaining the partitions")
    await conn.execute("SET lock_timeout = '2s'")
    today = int(await ddl.val("part_today"))
    todo = [s for s in TABLES if not await ddl.val("part_is_partitioned", s.table)]

    async def step(table: str, name: str) -> None:
        if before_switch is not None:
            result = before_switch(table, name)
            if asyncio.iscoroutine(result):
                await result

    # 1. New ids by day (the inbox's accept draws them through relaybox_inbox_id()).
    await step("relaybox_inbox", "day_ids")
    await ddl.run("part_inbox_ids_by_day")
    for s in todo:
        if s.day_ids:
            await _retry_locked(partial(ddl.run, "part_set_id_default", table=s.table, seq=s.seq))
    # 2. The first partition ends where the partitions made ahead begin: a whole period
    # after tomorrow (every id drawn until the switch stays below it). A table that was
    # switched already sets it (the attempts share their events' bounds); so does a
    # bound an earlier try added, while it is still ahead.
    hi_day = period_start(today + 2, period)
    if hi_day < today + 2:
        hi_day += PERIODS[period]
    first = [p for p in await _list(ddl, "relaybox_inbox") if p.lo == MINVALUE and not p.default]
    if first:
        hi_day = first[0].hi_day
    else:
        for s in todo:
            for row in await ddl.rows("part_bound_check", s.table, f"{s.table}_bound_%"):
                kept = int(row["name"].rsplit("_", 1)[1])
                if kept >= today + 1:
                    hi_day = kept
    hi = day_id(hi_day)
    part_day = _date(today)
    for s in todo:
        name = f"{s.table}_bound_{hi_day}"
        for row in await ddl.rows("part_bound_check", s.table, f"{s.table}_bound_%"):
            if row["name"] != name:
                await _retry_locked(
                    partial(ddl.run, "part_drop_constraint", table=s.table, name=row["name"])
                )
        valid = [r["valid"] for r in await ddl.rows("part_bound_check", s.table, name)]
        if not valid:
            await step(s.table, "add_check")
            await _retry_locked(
                partial(ddl.run, "part_add_bound", table=s.table, name=name, key=s.key, hi=hi)
            )
            valid = [False]
        if not valid[0]:
            await step(s.table, "validate")
            await _retry_locked(partial(ddl.run, "part_validate_bound", table=s.table, name=name))
    # 3. The switch, a short transaction per table.
    for s in todo:
        await step(s.table, "switch")
        await _retry_locked(partial(_switch, ddl, s, f"{s.table}_p{part_day}", hi))
        done.append(s.table)
        log.info("partitioned", table=s.table, first_partition=f"{s.table}_p{part_day}")
    await maintain(conn, q, period, ahead=ahead, drop=None, locked=True)
    return done


async def _switch(ddl: _Ddl, s: PartitionSpec, part: str, hi: int) -> None:
    async with ddl.conn.transaction():
        await ddl.run("part_lock_table", table=s.table)
        if await ddl.val("part_is_partitioned", s.table):
            return  # an earlier try committed it
        for unique in s.drop_uniques:
            await ddl.run("part_drop_constraint", table=s.table, name=unique)
        checks = await ddl.rows("part_checks", s.table)
        indexes = await ddl.rows("part_indexes", s.table)
        keyed = await ddl.rows("part_constraint_indexes", s.table)
        await ddl.run("part_rename_table", table=s.table, part=part)
        for ix in indexes:
            await ddl.run(
                "part_rename_index", name=ix["name"], new=_renamed(ix["name"], s.table, part)
            )
        for k in keyed:
            new = _renamed(k["name"], s.table, part)
            await ddl.run("part_rename_constraint", table=part, name=k["name"], new=new)
        await ddl.run("part_create_parent", table=s.table, part=part, key=s.key)
        for c in checks:
            await ddl.run("part_add_check", table=s.table, name=c["name"], **{"def": c["def"]})
        if s.primary_key:
            await ddl.run("part_add_pkey", table=s.table)
        for ix in indexes:
            await ddl.conn.execute(ix["def"])  # on the parent: the name is free again
        await ddl.run("part_attach_first", table=s.table, part=part, hi=hi)
        await ddl.run("part_create_default", table=s.table)
        await ddl.run("part_own_sequence", table=s.table, seq=s.seq)


def _renamed(name: str, table: str, part: str) -> str:
    if name.startswith(table):
        return part + name[len(table) :]
    return f"{part}_{name}"[:63]


Ages = Callable[[str, str | None, str | None], float]
"""(table, tenant, source) → the retention age (seconds) of such a row."""

Drop = tuple[float, Ages, Callable[[str], float]]
"""What a drop needs: now (epoch seconds), each row's age, and each table's shortest
age (a partition that ended more recently is not read)."""


async def maintain(
    conn: asyncpg.Connection,
    q: Mapping[str, str],
    period: str,
    *,
    ahead: int = 3,
    drop: Drop | None = None,
    locked: bool = False,
    before_drop: Callable[[str, str], Any] | None = None,
) -> MaintainResult:
    """Make partitions ``ahead`` periods ahead of today; with ``drop`` (:data:`Drop`),
    drop the partitions whose every row is past its age and none of which must stay.
    Tables not partitioned are left alone. ``before_drop`` (partition, step) is called
    before the DETACH and before the DROP (tests kill the process there)."""
    ddl = _Ddl(conn, q)
    result = MaintainResult()
    if not locked:
        if not await ddl.val("part_lock"):
            result.skipped = True
            return result
        await conn.execute("SET lock_timeout = '2s'")
        if await _conversion_started(ddl):
            # A conversion killed halfway: its bound CHECKs would refuse rows once the
            # database's day reaches them, so every maintenance pass finishes it.
            result.converted = await convert(conn, q, period, ahead=ahead)
    # What a killed run detached and did not drop.
    for row in await ddl.rows("part_detached"):
        await ddl.run("part_drop", part=row["name"])
        result.dropped.append(row["name"])
    today = int(await ddl.val("part_today"))
    step = PERIODS.get(period, 1)
    until = today + step * (ahead + 1)
    for s in TABLES:
        if not await ddl.val("part_is_partitioned", s.table):
            continue
        parts = [p for p in await _list(ddl, s.table) if not p.default]
        start = max((p.hi_day for p in parts), default=period_start(today, period))
        day = start
        while day < until:
            nxt = period_start(day, period) + step
            if nxt <= day:
                nxt = day + step
            name = f"{s.table}_p{_date(day)}"
            moved = await _retry_locked(partial(_create, ddl, s, name, day_id(day), day_id(nxt)))
            result.created.append(name)
            result.moved += moved
            day = nxt
    if drop is not None:
        await _drop_old(ddl, result, period, drop, before_drop)
    if result.created or result.dropped:
        log.info(
            "partitions_maintained",
            created=result.created,
            dropped=result.dropped,
            moved=result.moved,
        )
    return result


async def _conversion_started(ddl: _Ddl) -> bool:
    """Whether a conversion began (a bound CHECK added, or some tables switched) and
    has not finished."""
    switched = 0
    for s in TABLES:
        if await ddl.val("part_is_partitioned", s.table):
            switched += 1
        elif await ddl.rows("part_bound_check", s.table, f"{s.table}_bound_%"):
            return True
    return 0 < switched < len(TABLES)


async def _create(ddl: _Ddl, s: PartitionSpec, name: str, lo: int, hi: int) -> int:
    """Make partition ``name`` of ids ``lo`` to ``hi``; the rows of that range waiting
    in the DEFAULT partition move into it. Returns how many moved."""
    async with ddl.conn.transaction():
        waiting = await ddl.val("part_default_has", table=s.table, key=s.key, lo=lo, hi=hi)
        if not waiting:
            await ddl.run("part_create", table=s.table, part=name, lo=lo, hi=hi)
            return 0
        await ddl.run("part_create_loose", table=s.table, part=name)
        status = await ddl.conn.execute(
            ddl.sql("part_move_default", table=s.table, part=name, key=s.key, lo=lo, hi=hi)
        )
        await ddl.run("part_attach", table=s.table, part=name, lo=lo, hi=hi)
        return int(status.rsplit(" ", 1)[-1])


async def _drop_old(
    ddl: _Ddl,
    result: MaintainResult,
    period: str,
    drop: Drop,
    before_drop: Callable[[str, str], Any] | None,
) -> None:
    now, ages, min_age = drop
    for table, holds, newest, children in (
        ("relaybox_inbox", "part_inbox_holds", "part_inbox_ages", ("relaybox_inbox_attempts",)),
        ("relaybox_quarantine", "part_quarantine_holds", "part_quarantine_ages", ()),
    ):
        if not await ddl.val("part_is_partitioned", table):
            continue
        for p in await _list(ddl, table):
            # Only a partition whose range of days ended longer ago than the shortest
            # age is read at all; its rows decide (not its bound: clocks differ).
            if p.default or p.hi_day * 86400 > now - min_age(table):
                continue
            why = await _held(ddl, table, p, holds, newest, now, ages)
            if why:
                result.held[p.name] = why
                continue
            for child in children:
                if not await ddl.val("part_is_partitioned", child):
                    continue
                for c in await _list(ddl, child):
                    if not c.default and c.lo == p.lo and c.hi == p.hi:
                        await _detach_drop(ddl, child, c.name, before_drop)
                        result.dropped.append(c.name)
            if table == "relaybox_inbox":
                await ddl.run("part_operations_drop", part=p.name)
            await _detach_drop(ddl, table, p.name, before_drop)
            result.dropped.append(p.name)


async def _held(
    ddl: _Ddl, table: str, p: Partition, holds: str, newest: str, now: float, ages: Ages
) -> str | None:
    lo, hi = max(p.lo, MINVALUE), p.hi
    row = await ddl.conn.fetchrow(ddl.sql(holds, part=p.name, lo=lo, hi=hi))
    if row["pending"]:
        return "pending"
    if row["dead"]:
        return "dead letters not discarded"
    if row["quarantined"]:
        return "open quarantine"
    for r in await ddl.rows(newest, part=p.name):
        if r["newest"] is not None and r["newest"] >= now - ages(table, r["tenant"], r["source"]):
            return "retention age"
    return None


async def _detach_drop(
    ddl: _Ddl, table: str, part: str, before_drop: Callable[[str, str], Any] | None
) -> None:
    async def hook(step: str) -> None:
        if before_drop is not None:
            r = before_drop(part, step)
            if asyncio.iscoroutine(r):
                await r

    async def detach() -> None:
        async with ddl.conn.transaction():
            await ddl.run("part_detach", table=table, part=part)
            await ddl.run("part_mark_detached", part=part)

    await hook("detach")
    await _retry_locked(detach)
    await hook("drop")
    await ddl.run("part_drop", part=part)
    log.info("partition_dropped", table=table, partition=part)
