"""PostgreSQL backend (asyncpg): many receivers and workers on one database.

Claims use ``FOR NO KEY UPDATE SKIP LOCKED``: rows another worker holds are passed
over, and the weaker lock still lets the quarantine's foreign key reference a row
that a worker is processing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, ClassVar

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from relaybox.store.base import AcceptOutcome, NewDelivery, Store

__all__ = ["PostgresStore"]


def async_url(url: str) -> str:
    """``postgresql://…`` (any driver spelling) → the asyncpg dialect URL."""
    u = make_url(url)
    return u.set(drivername="postgresql+asyncpg").render_as_string(hide_password=False)


class PostgresStore(Store):
    backend: ClassVar[str] = "postgres"

    def __init__(
        self, url: str, *, pool_size: int = 10, max_overflow: int = 10, connect_timeout: float = 5
    ) -> None:
        super().__init__()
        self.url = url
        self.engine = create_async_engine(
            async_url(url),
            pool_size=pool_size,
            max_overflow=max_overflow,
            pool_timeout=connect_timeout,
            connect_args={
                "timeout": connect_timeout,
                "command_timeout": 60,
                "server_settings": {"application_name": "relaybox"},
            },
        )

    async def _lock_migrations(self, conn: AsyncConnection) -> None:
        await conn.exec_driver_sql("SELECT pg_advisory_xact_lock(hashtext('relaybox_migrate'))")

    def _sql_insert_migration(self) -> str:
        return "INSERT INTO relaybox_migrations (version, name, applied_at) VALUES ($1, $2, $3)"

    async def notify(self, conn: AsyncConnection, channel: str) -> None:
        await conn.exec_driver_sql(self.q[f"notify_{channel}"])

    async def inbox_insert(
        self, conn: AsyncConnection, batch: Sequence[NewDelivery]
    ) -> list[AcceptOutcome]:
        now = max(d.received_at for d in batch)
        cols: list[list[Any]] = [[] for _ in range(10)]
        for d in batch:
            for i, v in enumerate(
                (
                    d.source,
                    d.account,
                    d.event_id,
                    d.event_type,
                    d.tenant,
                    d.fingerprint,
                    d.payload,
                    d.headers,
                    d.version,
                    "ignored" if d.ignored else "pending",
                )
            ):
                cols[i].append(v)
        inserted = {
            (r[1], r[2], r[3]): r[0]
            for r in await conn.exec_driver_sql(self.q["inbox_insert_batch"], (*cols, now))
        }
        counts = Counter(d.key for d in batch)
        keys = [k for k in counts if k not in inserted or counts[k] > 1]
        existing: dict[tuple[str, str, str], tuple[int, bytes]] = {}
        if keys:
            rows = await conn.exec_driver_sql(
                self.q["inbox_existing"],
                ([k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys]),
            )
            existing = {(r[1], r[2], r[3]): (r[0], bytes(r[4])) for r in rows}
        outcomes = self._classify(batch, inserted, existing)
        for d, o in zip(batch, outcomes, strict=True):
            if o.status == "quarantined":
                await conn.exec_driver_sql(
                    self.q["quarantine_insert"],
                    (
                        o.inbox_id,
                        d.source,
                        d.account,
                        d.event_id,
                        d.event_type,
                        d.tenant,
                        d.fingerprint,
                        d.payload,
                        d.headers,
                        d.received_at,
                    ),
                )
        if any(o.status == "accepted" for o in outcomes):
            await self.notify(conn, "inbox")
        return outcomes

    @staticmethod
    def _classify(
        batch: Sequence[NewDelivery],
        inserted: dict[tuple[str, str, str], int],
        existing: dict[tuple[str, str, str], tuple[int, bytes]],
    ) -> list[AcceptOutcome]:
        """The first delivery of an inserted key is the new row; every other one is
        compared with the stored row's fingerprint."""
        claimed: set[tuple[str, str, str]] = set()
        outcomes = []
        for d in batch:
            if d.key in inserted and d.key not in claimed:
                claimed.add(d.key)
                status = "ignored" if d.ignored else "accepted"
                outcomes.append(AcceptOutcome(status, inserted[d.key]))  # type: ignore[arg-type]
                continue
            inbox_id, stored_fp = existing[d.key]
            same = stored_fp == d.fingerprint
            outcomes.append(AcceptOutcome("duplicate" if same else "quarantined", inbox_id))
        return outcomes


def dsn(url: str) -> str:
    """``postgresql+asyncpg://…`` → a plain DSN for ``asyncpg.connect`` (LISTEN)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
