"""Running the sending side's named queries (``store/sql/<backend>_outbound.sql``).

Lists travel as arrays on PostgreSQL and as JSON text on SQLite (``json_each``); the
query files take them in the same parameter position on both backends.

On PostgreSQL the statements run on the asyncpg connection beneath the SQLAlchemy
``AsyncConnection``, inside its transaction (see ``relaybox.store.postgres._driver``):
about 18 µs of CPU a statement instead of ~60 µs through ``exec_driver_sql``, with
asyncpg's prepared-statement cache. Rows are asyncpg ``Record``s there and SQLAlchemy
``RowMapping``s on SQLite; both read as ``row["column"]`` and convert with ``dict()``.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox.store import Store

__all__ = ["array", "driver", "execute", "first", "new_id", "rows"]


def array(store: Store, values: Sequence[Any]) -> Any:
    return list(values) if store.backend == "postgres" else json.dumps(list(values))


async def driver(conn: AsyncConnection, store: Store) -> Any:
    """The asyncpg connection under ``conn`` (PostgreSQL) in ``conn``'s transaction,
    or ``None`` (SQLite: statements go through SQLAlchemy)."""
    if store.backend != "postgres":
        return None
    from relaybox.store.postgres import _driver

    return await _driver(conn)


async def execute(conn: AsyncConnection, store: Store, name: str, *params: Any) -> Any:
    raw = await driver(conn, store)
    if raw is not None:
        return await raw.execute(store.q[name], *params)
    return await conn.exec_driver_sql(store.q[name], tuple(params))


async def rows(conn: AsyncConnection, store: Store, name: str, *params: Any) -> list[Any]:
    raw = await driver(conn, store)
    if raw is not None:
        return list(await raw.fetch(store.q[name], *params))
    return list((await conn.exec_driver_sql(store.q[name], tuple(params))).mappings())


async def first(conn: AsyncConnection, store: Store, name: str, *params: Any) -> Any:
    raw = await driver(conn, store)
    if raw is not None:
        return await raw.fetchrow(store.q[name], *params)
    return (await conn.exec_driver_sql(store.q[name], tuple(params))).mappings().first()


def new_id(prefix: str, now: float) -> str:
    """``prefix_`` + milliseconds (hex, so ids sort by time) + 64 random bits."""
    return f"{prefix}_{int(now * 1000):011x}{secrets.token_hex(8)}"
