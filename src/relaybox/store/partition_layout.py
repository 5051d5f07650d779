"""The layout of the time partitions (:mod:`relaybox.store.partitions`): which tables,
on which key, in which groups; a partition's bounds as days; the DDL connection.

Two groups, each converted together and sharing its first partition's bound: the
receiving side (``relaybox_inbox``, its attempts, the quarantine) and the sending side
(``relaybox_outbox``, its attempts, ``relaybox_messages``, and the keys of the
deliveries, ``relaybox_delivery_keys``, by their message's day). Integer keys are
day-encoded ids (:func:`day_id`); the messages' TEXT ids (``msg_`` + 11 hex digits of
the publisher's clock in milliseconds + random) sort by time already, and their bounds
are ``msg_`` + the hex of the day's first millisecond (:func:`msg_bound`); the delivery
keys' are day numbers, read here as the day-encoded id of their day."""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import asyncpg

__all__ = [
    "BY_NAME",
    "DELIVERY_KEYS",
    "INBOX",
    "MAXVALUE",
    "MESSAGES",
    "MINVALUE",
    "OUTBOX",
    "PERIODS",
    "TABLES",
    "Ddl",
    "Partition",
    "PartitionSpec",
    "date_name",
    "day_id",
    "key_day",
    "list_partitions",
    "msg_bound",
    "period_start",
    "retry_locked",
]

Period = Literal["day", "week"]
PERIODS: Mapping[str, int] = {"day": 1, "week": 7}

MINVALUE = -(2**63)
MAXVALUE = 2**63 - 1
DAY_MS = 86_400_000

INBOX = "relaybox_inbox"
OUTBOX = "relaybox_outbox"
MESSAGES = "relaybox_messages"
DELIVERY_KEYS = "relaybox_delivery_keys"


@dataclass(frozen=True)
class PartitionSpec:
    table: str
    key: str
    seq: str
    group: str
    """The group's first table (:data:`INBOX`, :data:`OUTBOX`): converted together,
    sharing its first partition's bound; the others follow it."""
    drop_uniques: tuple[str, ...] = ()
    """UNIQUE constraints that cannot hold across partitions (a keys table decides)."""
    drop_indexes: tuple[str, ...] = ()
    """UNIQUE indexes likewise (``relaybox_messages_sequence``: the per-lane row of
    ``relaybox_outbound_sequences`` hands each number out once)."""
    lookups: tuple[tuple[str, str], ...] = ()
    """Plain indexes (name, columns) built CONCURRENTLY before the switch where a
    dropped UNIQUE one served lookups (a message by its idempotency key)."""
    primary_key: bool = True
    """Whether the parent keeps a primary key on ``id`` (it holds the partition key)."""
    day_ids: bool = True
    """Whether its own ids become day-encoded (the partition key is its id)."""
    text_ids: bool = False
    """Whether the key is a message's TEXT id (bounds by :func:`msg_bound`)."""
    id_function: str | None = None
    """The function the inserts draw their ids from (``relaybox_inbox_id``), if any,
    rather than the column's default."""
    day_keys: bool = False
    """Whether the key is a day number (``relaybox_delivery_keys``: the day of the key's
    message), its partitions those of the messages of the same days."""
    pkey: str = "id"
    """The parent's primary key columns (they hold the partition key)."""

    def bound(self, day: int) -> str:
        """The SQL literal of the first key of day ``day``."""
        if self.day_keys:
            return str(day)
        return f"'{msg_bound(day)}'" if self.text_ids else str(day_id(day))

    def lowest(self, p: Partition) -> str:
        """The SQL literal of partition ``p``'s lower bound (the first partition's is
        below every key)."""
        if p.lo == MINVALUE:
            return "''" if self.text_ids else str(MINVALUE)
        if self.day_keys:
            return str(p.lo_day)
        return f"'{p.lo}'" if self.text_ids else str(p.lo)

    def highest(self, p: Partition) -> str:
        if self.day_keys and p.hi != MAXVALUE:
            return str(p.hi_day)
        return f"'{p.hi}'" if self.text_ids else str(p.hi)


TABLES: tuple[PartitionSpec, ...] = (
    PartitionSpec(
        INBOX,
        "id",
        "relaybox_inbox_id_seq",
        INBOX,
        drop_uniques=("relaybox_inbox_event_key",),
        id_function="relaybox_inbox_id",
    ),
    PartitionSpec(
        "relaybox_inbox_attempts",
        "inbox_id",
        "relaybox_inbox_attempts_id_seq",
        INBOX,
        primary_key=False,
        day_ids=False,
    ),
    PartitionSpec(
        "relaybox_quarantine",
        "id",
        "relaybox_quarantine_id_seq",
        INBOX,
        drop_uniques=("relaybox_quarantine_once",),
    ),
    PartitionSpec(
        OUTBOX, "id", "relaybox_outbox_id_seq", OUTBOX, drop_uniques=("relaybox_outbox_key",)
    ),
    PartitionSpec(
        "relaybox_outbox_attempts",
        "outbox_id",
        "relaybox_outbox_attempts_id_seq",
        OUTBOX,
        primary_key=False,
        day_ids=False,
    ),
    PartitionSpec(
        "relaybox_messages",
        "id",
        "",
        OUTBOX,
        drop_uniques=("relaybox_messages_idempotency",),
        drop_indexes=("relaybox_messages_sequence",),
        lookups=(
            (
                "relaybox_messages_idempotency_key",
                "(tenant, idempotency_key) WHERE idempotency_key IS NOT NULL",
            ),
        ),
        day_ids=False,
        text_ids=True,
    ),
    PartitionSpec(
        DELIVERY_KEYS,
        "day",
        "",
        OUTBOX,
        day_ids=False,
        day_keys=True,
        pkey="day, digest",
    ),
)
BY_NAME = {s.table: s for s in TABLES}


def day_id(day: int, low: int = 0) -> int:
    """The day-encoded id of day ``day`` with ``low`` in its low 32 bits."""
    return (day << 32) | (low & 0xFFFFFFFF)


def msg_bound(day: int) -> str:
    """The lowest message id of day ``day``: ``msg_`` + its first millisecond, hex."""
    return f"msg_{day * DAY_MS:011x}"


def period_start(day: int, period: str) -> int:
    """The first day of the period holding ``day`` (weeks start on Monday)."""
    if period == "week":
        return day - ((day - 4) % 7)  # 1970-01-01 was a Thursday: day 4 a Monday
    return day


def date_name(day: int) -> str:
    return (dt.date(1970, 1, 1) + dt.timedelta(days=day)).strftime("%Y%m%d")


def key_day(value: int | str) -> int:
    """The day of a key: a day-encoded id's high bits, a message id's milliseconds."""
    if isinstance(value, str):
        return int(value[4:15], 16) // DAY_MS
    return value >> 32


@dataclass(frozen=True)
class Partition:
    name: str
    lo: int | str
    hi: int | str
    default: bool = False

    @property
    def lo_day(self) -> int:
        return MINVALUE if self.lo == MINVALUE else key_day(self.lo)

    @property
    def hi_day(self) -> int:
        return MAXVALUE if self.hi == MAXVALUE else key_day(self.hi)


_BOUND = re.compile(r"FOR VALUES FROM \((MINVALUE|'[^']*'|-?\d+)\) TO \((MAXVALUE|'[^']*'|-?\d+)\)")


def _value(text: str, edge: int) -> int | str:
    if text in ("MINVALUE", "MAXVALUE"):
        return edge
    bare = text.strip("'")
    return int(bare) if re.fullmatch(r"-?\d+", bare) else bare


def parse(name: str, bound: str) -> Partition:
    if bound.strip() == "DEFAULT":
        return Partition(name, MINVALUE, MAXVALUE, True)
    m = _BOUND.search(bound)
    if m is None:
        raise RuntimeError(f"partition {name}: unexpected bound {bound!r}")
    return Partition(name, _value(m.group(1), MINVALUE), _value(m.group(2), MAXVALUE))


class Ddl:
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


async def list_partitions(ddl: Ddl, table: str) -> list[Partition]:
    found = [parse(r["name"], r["bound"]) for r in await ddl.rows("part_list", table)]
    spec = BY_NAME.get(table)
    if spec is not None and spec.day_keys:  # day numbers, as the ids of their days
        found = [Partition(p.name, _day_key(p.lo), _day_key(p.hi), p.default) for p in found]
    return sorted(found, key=lambda p: (p.default, p.lo_day))


def _day_key(value: int | str) -> int | str:
    if value in (MINVALUE, MAXVALUE) or isinstance(value, str):
        return value
    return day_id(value)


async def retry_locked(step: Callable[[], Any], *, tries: int = 20) -> Any:
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
