"""The store's retention-policy area: the payload ages an operator set per tenant
(``relaybox_retention_policies``) and the purge's passes per tenant group or source.

:class:`RetentionStore` is an area of :class:`~relaybox.store.base.Store`. Its
methods run the named queries of ``sql/<backend>_retention.sql``; none is on a
request's hot path (the admin API and the maintenance role call them). A purge pass
is one of two shapes, both in batches of their own transactions:

* :meth:`purge_tenants`: the rows of a list of tenants finished before one
  cutoff, through partial ``(tenant, time)`` indexes: each batch reads the candidates
  it purges and one index descent per tenant of the list.
* :meth:`scan` then :meth:`purge_ids`: the candidates before a
  cutoff in (time, id) order after a cursor (all of them, or one source's), which the
  caller filters (rows whose tenant or source keeps them longer) before purging the
  others by id. The cursor moves past rows left alone, so a pass reads each once.

Each purge batch also deletes, in its transaction, the subject index's rows of the rows
it purged that find nothing an erasure empties any more
(:func:`~relaybox.store.erasure.forget_purged`).

On PostgreSQL these statements are planned for their values (``retention_custom_plans``):
which index reads fewer rows depends on the cutoff, the cursor, the tenants and the
source, which a generic plan does not see.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox.store.backend import Backend
from relaybox.store.erasure import forget_purged
from relaybox.store.history import PurgeTable

__all__ = ["PurgeCandidate", "RetentionPolicyRow", "RetentionStore"]


@dataclass(frozen=True, slots=True)
class RetentionPolicyRow:
    """One tenant's ages as set through the admin API (``None``: not set there)."""

    tenant: str
    payload_max_age: float | None
    outbox_payload_max_age: float | None
    updated_at: float
    updated_by: str
    keys_max_age: float | None = None

    @classmethod
    def from_row(cls, row: Any) -> RetentionPolicyRow:
        return cls(
            tenant=row[0],
            payload_max_age=None if row[1] is None else float(row[1]),
            outbox_payload_max_age=None if row[2] is None else float(row[2]),
            updated_at=float(row[3]),
            updated_by=row[4],
            keys_max_age=None if row[5] is None else float(row[5]),
        )


@dataclass(frozen=True, slots=True)
class PurgeCandidate:
    """A row a scan found: its id (an integer; a message's is text), the time its age
    counts from, and what decides that age (tenant, source: ``None`` when the row has
    none or the table has no sources)."""

    id: int | str
    at: float
    tenant: str | None
    source: str | None


class RetentionStore:
    """Retention policies and the purge's scoped passes (see the module docstring)."""

    def __init__(self, db: Backend) -> None:
        self.db = db

    # -- policies -----------------------------------------------------------------------

    async def policy_get(self, tenant: str) -> RetentionPolicyRow | None:
        async with self.db.connect() as conn:
            row = await self.db.first(conn, "retention_policy_get", (tenant,))
        return None if row is None else RetentionPolicyRow.from_row(row)

    async def policy_put(
        self,
        tenant: str,
        *,
        payload_max_age: float | None,
        outbox_payload_max_age: float | None,
        now: float,
        actor: str,
        max_policies: int,
        keys_max_age: float | None = None,
    ) -> RetentionPolicyRow | None:
        """Set (insert or replace) the tenant's policy; at least one age must be given.
        ``None``: the tenant had none and ``max_policies`` tenants already have one."""
        if payload_max_age is None and outbox_payload_max_age is None and keys_max_age is None:
            raise ValueError("a retention policy sets at least one age")
        params = (
            tenant,
            payload_max_age,
            outbox_payload_max_age,
            now,
            actor,
            max_policies,
            keys_max_age,
        )
        async with self.db.connect() as conn:
            row = await self.db.first(conn, "retention_policy_put", params)
        return None if row is None else RetentionPolicyRow.from_row(row)

    async def policy_delete(self, tenant: str) -> bool:
        """Remove the tenant's policy; whether it had one."""
        async with self.db.connect() as conn:
            return await self.db.first(conn, "retention_policy_delete", (tenant,)) is not None

    async def policy_page(self, *, after: str = "", limit: int = 100) -> list[RetentionPolicyRow]:
        """The policies of the tenants after ``after``, in tenant order."""
        async with self.db.connect() as conn:
            rows = await self.db.rows(conn, "retention_policy_page", (after, limit))
        return [RetentionPolicyRow.from_row(r) for r in rows]

    # -- scoped purge passes -------------------------------------------------------------

    async def purge_tenants(
        self,
        table: PurgeTable,
        tenants: Sequence[str],
        *,
        cutoff: float,
        now: float,
        limit: int,
    ) -> int:
        """Purge up to ``limit`` rows of ``table`` of the ``tenants`` finished before
        ``cutoff`` (what :meth:`retention_purge_batch` purges, for these tenants only),
        in a transaction of their own; returns how many."""
        params = (cutoff, now, limit, self.db.array(list(tenants)))
        async with self.db.connect() as conn:
            await self.db.rows(conn, "retention_custom_plans")
            rows = await self.db.rows(conn, f"ops_purge_{table}_tenants", params)
            await self._after_purge(conn, table, [r[0] for r in rows])
        return len(rows)

    async def scan(
        self,
        table: PurgeTable,
        *,
        cutoff: float,
        after: tuple[float, int | str] | None,
        limit: int,
        source: str | None = None,
    ) -> list[PurgeCandidate]:
        """Up to ``limit`` candidates of ``table`` finished before ``cutoff``, after the
        cursor ``after`` (the last candidate's (time, id); ``None``: from the start), in
        (time, id) order; ``source``: that source's only (inbox and quarantine)."""
        if after is None:
            after = (float("-inf"), "" if table == "messages" else 0)
        params: tuple[Any, ...] = (cutoff, after[0], after[1], limit)
        if table == "inbox" and source is not None:
            name = "ops_purge_inbox_scan_source"
            params += (source,)
        elif table == "quarantine":
            name = "ops_purge_quarantine_scan"
            params += (source,)
        elif source is not None:
            raise ValueError(f"{table} rows have no source")
        else:
            name = f"ops_purge_{table}_scan"
        async with self.db.connect() as conn:
            await self.db.rows(conn, "retention_custom_plans")
            rows = await self.db.rows(conn, name, params)
        return [PurgeCandidate(r[0], float(r[1]), r[2], r[3]) for r in rows]

    async def purge_ids(
        self, table: PurgeTable, ids: Sequence[int | str], *, cutoff: float, now: float
    ) -> int:
        """Purge the rows ``ids`` of ``table`` (from :meth:`scan`) that are
        still candidates at ``cutoff`` once locked, in a transaction of their own;
        returns how many."""
        if not ids:
            return 0
        async with self.db.connect() as conn:
            await self.db.rows(conn, "retention_custom_plans")
            rows = await self.db.rows(
                conn, f"ops_purge_{table}_ids", (self.db.array(list(ids)), now, cutoff)
            )
            await self._after_purge(conn, table, [r[0] for r in rows])
        return len(rows)

    async def _after_purge(
        self, conn: AsyncConnection, table: PurgeTable, purged: list[Any]
    ) -> None:
        """What goes with the rows ``purged`` of ``table``, in their transaction: the
        readable business keys of purged events, the recorded responses of purged
        deliveries, and the subject index's rows that find nothing more."""
        if not purged:
            return
        if table == "inbox":
            await self.db.rows(conn, "operations_purge", (self.db.array(purged),))
        if table == "outbox":
            await self.db.rows(conn, "ops_purge_outbox_responses", (self.db.array(purged),))
        await forget_purged(self.db, conn, table, purged)

    async def count_groups(
        self, table: PurgeTable, cutoff: float
    ) -> dict[tuple[str | None, str | None], int]:
        """What a purge at ``cutoff`` would drop in ``table``, by (tenant, source)
        (the source ``None`` on the sending side): dry runs and progress totals."""
        async with self.db.connect() as conn:
            rows = await self.db.rows(conn, f"ops_purge_{table}_groups", (cutoff,))
        return {(r[0], r[1]): int(r[2]) for r in rows}
