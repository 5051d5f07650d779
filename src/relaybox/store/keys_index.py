"""The keys tables' indexes by day, kept only where a keys window applies.

Each keys table (``relaybox_event_keys``, ``relaybox_message_keys``,
``relaybox_business_keys``, PostgreSQL's ``relaybox_outbox_keys``) has a B-tree index
on ``first_seen`` (migrations 0027, 0031, 0034, 0037) that only the expiry by a keys
window reads (:meth:`KeysStore.expire <relaybox.store.keys_store.KeysStore.expire>`).
Keys are kept for good by default, and then that index costs some 8 bytes a key for
nothing. So the maintenance keeps each in step with the windows
(:func:`relaybox.retention.purge.expire_keys`): built when a window applies to its table
and it is missing, dropped when none does. ``relaybox_delivery_keys`` has none apart
(its primary key starts with the day).

PostgreSQL builds with ``CREATE INDEX CONCURRENTLY`` and drops with ``DROP INDEX
CONCURRENTLY`` (neither blocks the accepts and publishes writing keys), on a DDL
connection of its own, outside every transaction, under ``lock_timeout``
(:data:`LOCK_TIMEOUT`), one process at a time (an advisory lock: another process that
finds it held changes nothing this pass). An index left invalid by a build that was
killed or failed is dropped and built again. A table whose index cannot be built this
pass has no expiry this pass (the caller skips it): the expiry never scans a table
without its index. SQLite creates and drops them in a plain transaction.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

import asyncpg
import structlog

from relaybox.store.keys import KeyKind

if TYPE_CHECKING:
    from relaybox.store.backend import Backend

__all__ = [
    "DAY_INDEXES",
    "LOCK_TIMEOUT",
    "day_index_changes",
    "postgres_keep",
    "postgres_state",
    "sqlite_keep",
    "sqlite_state",
]

log = structlog.get_logger("relaybox.keys")

DAY_INDEXES: Mapping[KeyKind, tuple[str, str]] = {
    "event": ("relaybox_event_keys", "relaybox_event_keys_age"),
    "message": ("relaybox_message_keys", "relaybox_message_keys_age"),
    "operation": ("relaybox_business_keys", "relaybox_business_keys_age"),
    "outbox": ("relaybox_outbox_keys", "relaybox_outbox_keys_age"),
}
"""Each kind of keys: its table and the name of that table's index by day."""

LOCK_TIMEOUT = "5s"
"""How long a build or a drop waits for a lock (PostgreSQL: the table's, and the
transactions a concurrent build waits for) before it gives up until the next pass."""


def day_index_changes(
    state: Mapping[KeyKind, bool | None], wanted: Collection[KeyKind]
) -> tuple[list[KeyKind], list[KeyKind]]:
    """What to build and what to drop: ``state`` is, for each kind whose table exists,
    whether its index is there and valid (``None``: missing, ``False``: invalid)."""
    build = [k for k, valid in state.items() if k in wanted and not valid]
    drop = [k for k, valid in state.items() if k not in wanted and valid is not None]
    return build, drop


async def sqlite_state(db: Backend) -> dict[KeyKind, bool | None]:
    """For each kind whose table exists: ``True`` when its index is there, else
    ``None`` (SQLite builds an index in its transaction: never invalid)."""
    found: dict[KeyKind, bool | None] = {}
    async with db.transaction() as conn:
        for kind, (table, index) in DAY_INDEXES.items():
            sql = db.q["keys_day_index_state"].format(table=table, index=index)
            row = (await conn.exec_driver_sql(sql)).first()
            if row is not None:
                found[kind] = True if row._mapping["valid"] else None
    return found


async def sqlite_keep(db: Backend, wanted: Collection[KeyKind]) -> dict[KeyKind, bool | None]:
    """Build the missing indexes of ``wanted``, drop the others' (a transaction each);
    each table's state after."""
    build, drop = day_index_changes(await sqlite_state(db), wanted)
    for kind in drop + build:
        table, index = DAY_INDEXES[kind]
        name = "keys_day_index_create" if kind in build else "keys_day_index_drop"
        started = time.monotonic()
        async with db.transaction() as conn:
            await conn.exec_driver_sql(db.q[name].format(table=table, index=index))
        _log_change(kind, kind in build, time.monotonic() - started)
    return await sqlite_state(db)


def _log_change(kind: KeyKind, built: bool, seconds: float) -> None:
    table, index = DAY_INDEXES[kind]
    if built:
        log.info("keys_day_index_built", table=table, index=index, seconds=round(seconds, 3))
    else:
        log.info("keys_day_index_dropped", table=table, index=index)


async def postgres_state(
    conn: asyncpg.Connection, q: Mapping[str, str]
) -> dict[KeyKind, bool | None]:
    """For each kind whose table exists: its index valid (``True``), invalid
    (``False``: a build killed or failed) or missing (``None``)."""
    kinds = list(DAY_INDEXES)
    rows = await conn.fetch(
        q["keys_day_index_state"],
        [DAY_INDEXES[k][0] for k in kinds],
        [DAY_INDEXES[k][1] for k in kinds],
    )
    valid = {r["table_name"]: r["valid"] for r in rows}
    return {k: valid[DAY_INDEXES[k][0]] for k in kinds if DAY_INDEXES[k][0] in valid}


async def postgres_keep(
    conn: asyncpg.Connection,
    q: Mapping[str, str],
    wanted: Collection[KeyKind],
    *,
    lock: str,
    unlock: str,
) -> dict[KeyKind, bool | None]:
    """On the DDL connection ``conn`` (no transaction open): build the missing or
    invalid indexes of ``wanted``, drop the others', under the advisory lock that the
    statements ``lock`` (true when taken, at once or never) and ``unlock`` take and
    release (PostgreSQL's own, named in :mod:`relaybox.store.postgres`); each table's
    state after. Another process holding the lock: nothing changes."""
    state = await postgres_state(conn, q)
    build, drop = day_index_changes(state, wanted)
    if not build and not drop:
        return state
    if not await conn.fetchval(lock):
        # Another process builds or drops them now: as they are, this pass.
        log.info("keys_day_index_busy", build=build, drop=drop)
        return state
    try:
        await conn.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'")
        state = await postgres_state(conn, q)  # as the previous holder left them
        build, drop = day_index_changes(state, wanted)
        for kind in drop:
            await _postgres_change(conn, q, kind, build=False)
        for kind in build:
            await _postgres_change(conn, q, kind, build=True, invalid=state[kind] is False)
        return await postgres_state(conn, q)
    finally:
        with contextlib.suppress(asyncpg.PostgresError, OSError):
            await conn.fetchval(unlock)


async def _postgres_change(
    conn: asyncpg.Connection,
    q: Mapping[str, str],
    kind: KeyKind,
    *,
    build: bool,
    invalid: bool = False,
) -> None:
    """Build ``kind``'s index (an ``invalid`` one dropped first) or drop it. A failure
    is logged (the table's expiry waits for a later pass), and a failed build's
    invalid index dropped when it can be."""
    table, index = DAY_INDEXES[kind]

    async def run(name: str) -> Any:
        return await conn.execute(q[name].format(table=table, index=index))

    started = time.monotonic()
    try:
        if invalid or not build:
            await run("keys_day_index_drop")
        if build:
            await run("keys_day_index_create")
    except (asyncpg.PostgresError, OSError) as exc:
        log.warning(
            "keys_day_index_failed",
            table=table,
            index=index,
            action="build" if build else "drop",
            error=str(exc),
        )
        if build:
            with contextlib.suppress(asyncpg.PostgresError, OSError):
                await run("keys_day_index_drop")
        return
    _log_change(kind, build, time.monotonic() - started)
