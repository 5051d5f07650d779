"""Running the sending side's named queries (``store/sql/<backend>_outbound.sql``).

Lists travel as arrays on PostgreSQL and as JSON text on SQLite (``json_each``); the
query files take them in the same parameter position on both backends.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox.store import Store

__all__ = ["array", "execute", "first", "new_id", "rows"]


def array(store: Store, values: Sequence[Any]) -> Any:
    return list(values) if store.backend == "postgres" else json.dumps(list(values))


async def execute(conn: AsyncConnection, store: Store, name: str, *params: Any) -> Any:
    return await conn.exec_driver_sql(store.q[name], tuple(params))


async def rows(conn: AsyncConnection, store: Store, name: str, *params: Any) -> list[Any]:
    return list((await execute(conn, store, name, *params)).mappings())


async def first(conn: AsyncConnection, store: Store, name: str, *params: Any) -> Any:
    return (await execute(conn, store, name, *params)).mappings().first()


def new_id(prefix: str, now: float) -> str:
    """``prefix_`` + milliseconds (hex, so ids sort by time) + 64 random bits."""
    return f"{prefix}_{int(now * 1000):011x}{secrets.token_hex(8)}"
