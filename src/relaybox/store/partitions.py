"""Time partitions of the history on PostgreSQL (docs/scaling.md, "Time partitions").

Layout (:mod:`relaybox.store.partition_layout`). The receiving side:
``relaybox_inbox`` and ``relaybox_quarantine`` are partitioned by RANGE on their id,
``relaybox_inbox_attempts`` on its ``inbox_id``. The sending side: ``relaybox_outbox``
(deliveries and handler outbox rows) on its id, ``relaybox_outbox_attempts`` on its
``outbox_id``, ``relaybox_messages`` on its TEXT id. A partition a day or a week. New
integer ids are *day-encoded* (migration 0032, ``relaybox_day_id``): the day by the
database's clock in the high 32 bits, the sequence in the low 32, so a range of ids is
a range of days, and a lookup by id still reads one partition. Message ids (``msg_`` +
11 hex digits of the publisher's clock in milliseconds + random) sort by time already:
their bounds are ``msg_`` + the hex of the day's first millisecond. An attempts
partition has the bounds of its event's (or outbox row's) partition: they go together.
Quarantine entries partition on their own id (their ``inbox_id`` may name a row that is
gone). A DEFAULT partition takes any row whose partition is missing (an insert is never
refused); a partition made later for its range takes its rows from there.

The UNIQUE constraints that cannot stay on a partitioned table (a unique index must
hold the partition key) are decided elsewhere: the event key of the inbox and the
messages' (tenant, idempotency_key) by the keys tables (migration 0027), the outbox's
(channel, key) by ``relaybox_outbox_keys`` (migration 0034), the quarantine's (inbox_id,
fingerprint) under its advisory lock, and a message's (tenant, ordering_key, sequence)
by the per-lane row of ``relaybox_outbound_sequences`` that hands each number out once.
The conversion waits for the keys backfills to finish before it drops them.

Conversion (:func:`convert`, ``relaybox migrate --partitions``): per group of tables
(receiving, sending), resumable at every step, the traffic flowing: new ids by day,
kept below the group's first bound while the conversion runs (``relaybox_day_id_below``:
a conversion killed and resumed days later never has an insert refused by its bound);
a CHECK of the partition key's bound added NOT VALID then validated (no write
blocked); then one short transaction per table renames the live table to its first
partition (named for the day of the conversion), creates the partitioned parent with
the same columns, checks and indexes, and ATTACHes the old table (the validated CHECK
spares the scan; its indexes become the parent's, none is built). No row is copied.
Message ids come from the publishers' clocks, which no default can hold back: the
messages' first bound is :data:`MESSAGES_SLACK` days further than the group's, so a
conversion left halfway has that long to be finished (by any maintenance pass) before
a publish could meet it.

Maintenance (:func:`maintain`): partitions made ahead; a partition dropped (DETACH,
then DROP) once no row in it must stay and every row is past the retention age of its
tenant or source. On the receiving side: nothing pending, no undiscarded dead letter,
no original of an open quarantine entry. On the sending side: no delivery pending,
held (a paused endpoint's are pending) or leased, no message with a delivery still
pending, held or dead and not purged; the age is ``retention.outbox_payload_max_age``
of the tenant. A detached partition is marked in the same transaction as its DETACH,
so a run killed before the DROP leaves it to the next run. One maintainer at a time (an
advisory lock on the DDL connection).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import asyncpg
import structlog

from relaybox.store.partition_layout import (
    BY_NAME,
    DELIVERY_KEYS,
    INBOX,
    MESSAGES,
    MINVALUE,
    OUTBOX,
    PERIODS,
    TABLES,
    Ddl,
    Partition,
    PartitionSpec,
    date_name,
    key_day,
    list_partitions,
    period_start,
    retry_locked,
)

__all__ = ["MESSAGES_SLACK", "MaintainResult", "convert", "maintain", "partitioned"]

log = structlog.get_logger("relaybox.partitions")

MESSAGES_SLACK = 14
"""Days the messages' first bound lies beyond the rest of the sending side's (see the
module's text)."""

GROUPS = (INBOX, OUTBOX)


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


async def partitioned(conn: asyncpg.Connection, q: Mapping[str, str]) -> set[str]:
    """The history tables that are partitioned already."""
    ddl = Ddl(conn, q)
    return {s.table for s in TABLES if await ddl.val("part_is_partitioned", s.table)}


async def _first_day(ddl: Ddl, s: PartitionSpec, hi_day: int) -> int:
    """The day table ``s``'s first partition ends, its group's being ``hi_day``. The
    messages' (and their delivery keys', which have their days): :data:`MESSAGES_SLACK`
    days later, and after the newest message (or key) stored (a publisher's clock may
    be ahead), or a bound an earlier try added that far."""
    if not (s.text_ids or s.day_keys):
        return hi_day
    day = hi_day + MESSAGES_SLACK
    for row in await ddl.rows("part_bound_check", s.table, f"{s.table}_bound_%"):
        return max(day, int(row["name"].rsplit("_", 1)[1]))
    newest = await ddl.val("part_max_key", table=s.table, key=s.key)
    if s.day_keys and newest is not None:
        day = max(day, int(newest) + 1)
    elif newest is not None and re.fullmatch(r"msg_[0-9a-f]{11}.*", newest):
        day = max(day, key_day(newest) + 1)
    return day


async def _group_bound(ddl: Ddl, specs: list[PartitionSpec], today: int, period: str) -> int:
    """The day the first partitions of a group end: where its first table's first
    partition ends when it was switched; else a bound an earlier try added (ids were
    held below it since); else a whole period after tomorrow (every id drawn until the
    switch stays below it)."""
    group = specs[0].group
    first = [p for p in await list_partitions(ddl, group) if p.lo == MINVALUE and not p.default]
    if first:
        return first[0].hi_day
    for s in specs:
        if s.day_keys:
            continue  # its bound follows the newest key, not the group's
        for row in await ddl.rows("part_bound_check", s.table, f"{s.table}_bound_%"):
            kept = int(row["name"].rsplit("_", 1)[1])
            return kept - MESSAGES_SLACK if s.text_ids else kept
    hi_day = period_start(today + 2, period)
    if hi_day < today + 2:
        hi_day += PERIODS[period]
    return hi_day


async def convert(
    conn: asyncpg.Connection,
    q: Mapping[str, str],
    period: str,
    *,
    before_switch: Callable[[str, str], Any] | None = None,
    ahead: int = 3,
    groups: tuple[str, ...] = GROUPS,
) -> list[str]:
    """Partition every history table of ``groups`` not partitioned yet (see the
    module's text). Resumable: each step looks at the catalog and does only what is
    missing. The keys backfills must have finished (the caller runs them first).
    ``before_switch`` (table, step) is called before each step (tests kill the process
    there). Returns the tables converted by this call."""
    if period not in PERIODS:
        raise ValueError(f"partitions by {period!r}: day or week")
    ddl = Ddl(conn, q)
    done: list[str] = []

    async def todo() -> list[PartitionSpec]:
        return [
            s
            for s in TABLES
            if s.group in groups and not await ddl.val("part_is_partitioned", s.table)
        ]

    if not await todo():
        return done
    for _ in range(600):  # a maintenance run holds it for a while at most
        if await ddl.val("part_lock"):
            break
        await asyncio.sleep(0.5)
    else:
        raise RuntimeError("another process is converting or maintaining the partitions")
    await conn.execute("SET lock_timeout = '2s'")
    today = int(await ddl.val("part_today"))
    left = await todo()

    async def step(table: str, name: str) -> None:
        if before_switch is not None:
            result = before_switch(table, name)
            if asyncio.iscoroutine(result):
                await result

    for group in GROUPS:
        specs = [s for s in left if s.group == group]
        if specs:
            done += await _convert_group(ddl, specs, today, period, step)
    await maintain(conn, q, period, ahead=ahead, drop=None, locked=True)
    return done


async def _convert_group(
    ddl: Ddl,
    specs: list[PartitionSpec],
    today: int,
    period: str,
    step: Callable[[str, str], Any],
) -> list[str]:
    hi_day = await _group_bound(ddl, specs, today, period)
    # 1. New ids by day, held below the first bound until every table is switched.
    await step(specs[0].group, "day_ids")
    for s in specs:
        if s.id_function:
            await ddl.run("part_id_function_capped", fn=s.id_function, seq=s.seq, day=hi_day)
        if s.day_ids:
            await retry_locked(
                partial(ddl.run, "part_set_id_capped", table=s.table, seq=s.seq, day=hi_day)
            )
    # 2. The bound CHECKs: added NOT VALID, then validated.
    for s in specs:
        first_day = await _first_day(ddl, s, hi_day)
        name = f"{s.table}_bound_{first_day}"
        for row in await ddl.rows("part_bound_check", s.table, f"{s.table}_bound_%"):
            if row["name"] != name:
                await retry_locked(
                    partial(ddl.run, "part_drop_constraint", table=s.table, name=row["name"])
                )
        valid = [r["valid"] for r in await ddl.rows("part_bound_check", s.table, name)]
        if not valid:
            await step(s.table, "add_check")
            hi = s.bound(first_day)
            await retry_locked(
                partial(ddl.run, "part_add_bound", table=s.table, name=name, key=s.key, hi=hi)
            )
            valid = [False]
        if not valid[0]:
            await step(s.table, "validate")
            await retry_locked(partial(ddl.run, "part_validate_bound", table=s.table, name=name))
    # 3. Plain indexes for the lookups a dropped UNIQUE one served, built beside the
    # traffic (one a build left invalid, killed, is built again).
    for s in specs:
        for index, columns in s.lookups:
            if await ddl.val("part_index_invalid", index):
                await ddl.run("part_drop_index_concurrently", name=index)
            await step(s.table, "lookups")
            await ddl.run("part_create_lookup", table=s.table, name=index, columns=columns)
    # 4. The switch, a short transaction per table.
    part_day = date_name(today)
    done = []
    for s in specs:
        await step(s.table, "switch")
        hi = s.bound(await _first_day(ddl, s, hi_day))
        await retry_locked(partial(_switch, ddl, s, f"{s.table}_p{part_day}", hi))
        done.append(s.table)
        log.info("partitioned", table=s.table, first_partition=f"{s.table}_p{part_day}")
    # 5. Ids by day, unheld (maintain does it too, for a run killed before this).
    await _release_ids(ddl)
    return done


async def _switch(ddl: Ddl, s: PartitionSpec, part: str, hi: str) -> None:
    async with ddl.conn.transaction():
        await ddl.run("part_lock_table", table=s.table)
        if await ddl.val("part_is_partitioned", s.table):
            return  # an earlier try committed it
        for unique in s.drop_uniques:
            await ddl.run("part_drop_constraint", table=s.table, name=unique)
        for index in s.drop_indexes:
            await ddl.run("part_drop_index", name=index)
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
            await ddl.run("part_add_pkey", table=s.table, columns=s.pkey)
        for ix in indexes:
            await ddl.conn.execute(ix["def"])  # on the parent: the name is free again
        await ddl.run("part_attach_first", table=s.table, part=part, hi=hi)
        await ddl.run("part_create_default", table=s.table)
        if s.seq:
            await ddl.run("part_own_sequence", table=s.table, seq=s.seq)


async def _release_ids(ddl: Ddl) -> None:
    """Once every table of a group is partitioned, its ids are no longer held below
    the first bound (a late id has its own partition, or the DEFAULT one)."""
    for group in GROUPS:
        specs = [s for s in TABLES if s.group == group]
        if not all([await ddl.val("part_is_partitioned", s.table) for s in specs]):
            continue
        for s in specs:
            if s.id_function and await ddl.val("part_id_function_held", s.id_function):
                await ddl.run("part_id_function", fn=s.id_function, seq=s.seq)
            if s.day_ids and await ddl.val("part_id_held", s.table):
                await retry_locked(
                    partial(ddl.run, "part_set_id_default", table=s.table, seq=s.seq)
                )


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
    ddl = Ddl(conn, q)
    result = MaintainResult()
    if not locked:
        if not await ddl.val("part_lock"):
            result.skipped = True
            return result
        await conn.execute("SET lock_timeout = '2s'")
        started = await _conversions_started(ddl)
        if started:
            # A conversion killed halfway: every maintenance pass finishes it (its ids
            # are held below its bound meanwhile; the messages' bound has some slack).
            result.converted = await convert(conn, q, period, ahead=ahead, groups=started)
        await _release_ids(ddl)
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
        parts = [p for p in await list_partitions(ddl, s.table) if not p.default]
        start = max((p.hi_day for p in parts), default=period_start(today, period))
        day = start
        while day < until:
            nxt = period_start(day, period) + step
            if nxt <= day:
                nxt = day + step
            name = f"{s.table}_p{date_name(day)}"
            made = partial(_create, ddl, s, name, s.bound(day), s.bound(nxt))
            moved = await retry_locked(made)
            result.created.append(name)
            result.moved += moved
            day = nxt
    if drop is not None:
        await _drop_old(ddl, result, drop, before_drop)
    if result.created or result.dropped:
        log.info(
            "partitions_maintained",
            created=result.created,
            dropped=result.dropped,
            moved=result.moved,
        )
    return result


async def _conversions_started(ddl: Ddl) -> tuple[str, ...]:
    """The groups whose conversion began (a bound CHECK added, or some tables
    switched) and has not finished."""
    started = []
    for group in GROUPS:
        switched = 0
        specs = [s for s in TABLES if s.group == group]
        for s in specs:
            if await ddl.val("part_is_partitioned", s.table):
                switched += 1
            elif await ddl.rows("part_bound_check", s.table, f"{s.table}_bound_%"):
                started.append(group)
                break
        else:
            if 0 < switched < len(specs):
                started.append(group)
    return tuple(started)


async def _create(ddl: Ddl, s: PartitionSpec, name: str, lo: str, hi: str) -> int:
    """Make partition ``name`` of keys ``lo`` to ``hi`` (SQL literals); the rows of that
    range waiting in the DEFAULT partition move into it. Returns how many moved."""
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


_DROPPED: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # (table, what its holds and ages statements are named for, its children)
    (INBOX, "inbox", ("relaybox_inbox_attempts",)),
    ("relaybox_quarantine", "quarantine", ()),
    (OUTBOX, "outbox", ("relaybox_outbox_attempts",)),
    ("relaybox_messages", "messages", ()),
)

_REASONS = {
    "pending": "pending",
    "dead": "dead letters not discarded",
    "quarantined": "open quarantine",
    "leased": "leased",
    "live": "deliveries still live",
}


async def _drop_old(
    ddl: Ddl,
    result: MaintainResult,
    drop: Drop,
    before_drop: Callable[[str, str], Any] | None,
) -> None:
    now, ages, min_age = drop
    for table, named, children in _DROPPED:
        if not await ddl.val("part_is_partitioned", table):
            continue
        s = next(x for x in TABLES if x.table == table)
        for p in await list_partitions(ddl, table):
            # Only a partition whose range of days ended longer ago than the shortest
            # age is read at all; its rows decide (not its bound: clocks differ).
            if p.default or p.hi_day * 86400 > now - min_age(table):
                continue
            why = await _held(ddl, s, p, named, now, ages)
            if why:
                result.held[p.name] = why
                continue
            for child in children:
                if not await ddl.val("part_is_partitioned", child):
                    continue
                for c in await list_partitions(ddl, child):
                    if not c.default and c.lo == p.lo and c.hi == p.hi:
                        await _detach_drop(ddl, child, c.name, before_drop)
                        result.dropped.append(c.name)
            if table == INBOX:
                await ddl.run("part_operations_drop", part=p.name)
            await _detach_drop(ddl, table, p.name, before_drop)
            result.dropped.append(p.name)
    await _drop_delivery_keys(ddl, result, now - min_age(MESSAGES), before_drop)


async def _drop_delivery_keys(
    ddl: Ddl,
    result: MaintainResult,
    older: float,
    before_drop: Callable[[str, str], Any] | None,
) -> None:
    """The delivery keys' partitions whose messages are gone: each after the messages'
    partitions of its days (a run killed between the drops leaves it to the next run,
    never a message without its keys). Kept while a messages' partition holds some of
    its days (new ones are made ahead of today, never for days past), while it ended
    less than the messages' shortest age ago, or while the messages' DEFAULT partition
    holds a message of its days (a publisher's clock far behind: read under the lock of
    the DETACH, so a publish of such a message either committed before and is seen, or
    writes its key after, into the DEFAULT partition)."""
    if not (
        await ddl.val("part_is_partitioned", DELIVERY_KEYS)
        and await ddl.val("part_is_partitioned", MESSAGES)
    ):
        return
    messages = [p for p in await list_partitions(ddl, MESSAGES) if not p.default]
    spec = BY_NAME[MESSAGES]
    for k in await list_partitions(ddl, DELIVERY_KEYS):
        if k.default or k.hi_day * 86400 > older:
            continue
        if any(m.lo_day < k.hi_day and k.lo_day < m.hi_day for m in messages):
            continue
        lo = "''" if k.lo == MINVALUE else spec.bound(k.lo_day)
        hi = spec.bound(k.hi_day)

        async def late(lo: str = lo, hi: str = hi) -> bool:
            return bool(await ddl.val("part_default_has", table=MESSAGES, key="id", lo=lo, hi=hi))

        if await _detach_drop(ddl, DELIVERY_KEYS, k.name, before_drop, keep_if=late):
            result.dropped.append(k.name)
        else:
            result.held[k.name] = "messages in the DEFAULT partition"


async def _held(
    ddl: Ddl, s: PartitionSpec, p: Partition, named: str, now: float, ages: Ages
) -> str | None:
    sql = ddl.sql(f"part_{named}_holds", part=p.name, lo=s.lowest(p), hi=s.highest(p))
    row = await ddl.conn.fetchrow(sql)
    for column, held in row.items():
        if held:
            return _REASONS[column]
    for r in await ddl.rows(f"part_{named}_ages", part=p.name):
        if r["newest"] is not None and r["newest"] >= now - ages(s.table, r["tenant"], r["source"]):
            return "retention age"
    return None


class _Kept(Exception):
    pass


async def _detach_drop(
    ddl: Ddl,
    table: str,
    part: str,
    before_drop: Callable[[str, str], Any] | None,
    *,
    keep_if: Callable[[], Awaitable[bool]] | None = None,
) -> bool:
    """DETACH partition ``part`` (marked in the same transaction), then DROP it; with
    ``keep_if``, asked once the DETACH holds its lock: true keeps the partition (the
    DETACH rolled back). Whether it was dropped."""

    async def hook(step: str) -> None:
        if before_drop is not None:
            r = before_drop(part, step)
            if asyncio.iscoroutine(r):
                await r

    async def detach() -> None:
        async with ddl.conn.transaction():
            await ddl.run("part_detach", table=table, part=part)
            if keep_if is not None and await keep_if():
                raise _Kept
            await ddl.run("part_mark_detached", part=part)

    await hook("detach")
    try:
        await retry_locked(detach)
    except _Kept:
        return False
    await hook("drop")
    await ddl.run("part_drop", part=part)
    log.info("partition_dropped", table=table, partition=part)
    return True
