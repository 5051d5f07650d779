"""The store's erasure area: one subject's (or one tenant's) rows emptied in batches,
and the record of each erasure (:mod:`relaybox.erasure` drives it).

:class:`ErasureStore` is an area of :class:`~relaybox.store.base.Store`. Its methods
run the named queries of ``sql/<backend>_erasure.sql``, each in a transaction of its
own: one batch locks at most ``limit`` rows of each kind, briefly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox.store import statements as st
from relaybox.store.backend import Backend

__all__ = [
    "ERASED_KINDS",
    "Erasure",
    "ErasureScope",
    "ErasureStore",
    "forget_purged",
    "forget_subjects",
]

MIN_ID = -(2**63)
MAX_ID = 2**63 - 1

ErasureScope = Literal["subject", "tenant"]
"""What an erasure names: a subject (its digest, through ``relaybox_subjects``) or a
tenant (the events received for it, their quarantine entries and what their handlers
added to the outbox; every message published to it and their deliveries)."""

ERASED_KINDS = (
    "inbox",
    "quarantine",
    "outbox",
    "attempts",
    "messages",
    "inbox_attempts",
    "projections",
)
"""The kinds of rows an erasure empties, as its counts name them: inbox events,
quarantine entries, outbox deliveries, delivery attempts (the receiver's answer and
the attempt's error text), messages, handler attempts (their error text), versioned
projections (the state an event of the subject wrote: ``ctx.project``)."""


async def forget_subjects(
    db: Backend,
    conn: AsyncConnection,
    *,
    inbox: Sequence[int] = (),
    quarantine: Sequence[int] = (),
    outbox: Sequence[int] = (),
    messages: Sequence[str] = (),
) -> int:
    """Delete the subject index's rows (``relaybox_subjects``) that point at the rows
    just purged, erased or dropped (inbox, quarantine, outbox ids; message ids), in
    ``conn``'s transaction, once nothing found through them holds what an erasure
    empties (``subjects_forget_*``: payloads, headers, error texts, answers; an
    inbox row's quarantine entries and handler rows, a message's deliveries); how
    many. An index row that still finds some stays until the purge or the erasure of
    what holds it asks again: the index lives as long as the data it finds."""
    inbox_ids = [int(i) for i in inbox]
    message_ids = list(messages)
    if quarantine:
        rows = await db.rows(conn, "subjects_refs_quarantine", (db.array(list(quarantine)),))
        inbox_ids += [int(r[0]) for r in rows]
    if outbox:
        rows = await db.rows(conn, "subjects_refs_outbox", (db.array(list(outbox)),))
        inbox_ids += [int(r[0]) for r in rows if r[0] is not None]
        message_ids += [str(r[1]) for r in rows if r[1] is not None]
    forgotten = 0
    if inbox_ids:
        ids = db.array(sorted(set(inbox_ids)))
        forgotten += len(await db.rows(conn, "subjects_forget_inbox", (ids,)))
    if message_ids:
        ids = db.array(sorted(set(message_ids)))
        forgotten += len(await db.rows(conn, "subjects_forget_messages", (ids,)))
    return forgotten


@dataclass(frozen=True, slots=True)
class Erasure:
    """One erasure as recorded: who asked, when, what, and the rows it emptied by
    kind. ``waiting``: rows of the subject still pending at its last run (emptied
    once they finish); ``finished_at`` is ``None`` until none waits."""

    id: int
    actor: str
    reason: str
    scope: ErasureScope
    digest: bytes | None
    tenant: str | None
    created_at: float
    updated_at: float
    finished_at: float | None
    waiting: int
    rows: dict[str, int] = field(default_factory=dict)

    @property
    def key(self) -> bytes | str:
        """What the erase statements take: the digest, or the tenant."""
        if self.scope == "subject":
            assert self.digest is not None
            return self.digest
        assert self.tenant is not None
        return self.tenant

    @classmethod
    def from_row(cls, row: Any) -> Erasure:
        return cls(
            id=int(row[0]),
            actor=row[1],
            reason=row[2],
            scope=row[3],
            digest=None if row[4] is None else bytes(row[4]),
            tenant=row[5],
            created_at=row[6],
            updated_at=row[7],
            finished_at=row[8],
            waiting=int(row[9]),
            rows={kind: int(row[10 + i]) for i, kind in enumerate(ERASED_KINDS)},
        )

    def as_dict(self) -> dict[str, Any]:
        """The record as the admin API and the CLI show it (the digest in hex, never
        the subject: relaybox does not keep it)."""
        return {
            "id": self.id,
            "actor": self.actor,
            "reason": self.reason,
            "scope": self.scope,
            "subject_digest": None if self.digest is None else self.digest.hex(),
            "tenant": self.tenant,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "finished_at": self.finished_at,
            "status": "finished" if self.finished_at is not None else "waiting",
            "waiting": self.waiting,
            "rows": dict(self.rows),
        }


async def forget_purged(
    db: Backend, conn: AsyncConnection, table: str, ids: Sequence[int | str]
) -> int:
    """:func:`forget_subjects` for the rows of ``table`` (a purge's: ``inbox``,
    ``quarantine``, ``outbox``, ``messages``) that a purge batch just emptied."""
    if table == "messages":
        return await forget_subjects(db, conn, messages=[str(i) for i in ids])
    numbers = [int(i) for i in ids]
    if table == "inbox":
        return await forget_subjects(db, conn, inbox=numbers)
    if table == "quarantine":
        return await forget_subjects(db, conn, quarantine=numbers)
    if table == "outbox":
        return await forget_subjects(db, conn, outbox=numbers)
    raise ValueError(f"no subject index for {table} rows")


class ErasureStore:
    """Erasure batches and records."""

    def __init__(self, db: Backend) -> None:
        self.db = db

    async def subject_index(
        self, conn: AsyncConnection, digest: bytes, kind: str, ref: str
    ) -> None:
        """Index one row (``kind``: ``inbox`` or ``message``) under a subject digest,
        in ``conn``'s transaction."""
        await self.db.rows(conn, *st.subject_index(digest, kind, ref))

    async def subject_inherit(
        self,
        conn: AsyncConnection,
        message_id: str,
        *,
        inbox_id: int | None = None,
        outbox_id: int | None = None,
    ) -> None:
        """Index message ``message_id`` (an operational event) under every subject
        digest of the row it is about, in ``conn``'s transaction: inbox row
        ``inbox_id``, or outbox row ``outbox_id`` (through its message, or the inbox
        row whose handler added it). Its text may quote the subject's data (an
        error): erasing the subject empties it too."""
        if inbox_id is not None:
            await self.db.rows(conn, "subject_inherit_inbox", (message_id, inbox_id))
        if outbox_id is not None:
            await self.db.rows(conn, "subject_inherit_outbox", (message_id, outbox_id))

    async def begin(
        self,
        *,
        actor: str,
        reason: str,
        scope: ErasureScope,
        digest: bytes | None,
        tenant: str | None,
        now: float,
    ) -> tuple[int, bool]:
        """The erasure's id, and whether it is one recorded before that still waits
        for rows (asking again resumes it: no second record)."""
        async with self.db.transaction() as conn:
            row = await self.db.first(conn, "erasure_find_open", (scope, digest, tenant))
            if row is not None:
                return int(row[0]), True
            row = await self.db.first(
                conn, "erasure_insert", (actor, reason, scope, digest, tenant, now)
            )
        return int(row[0]), False

    async def erase_batch(self, erasure: Erasure, *, now: float, limit: int) -> dict[str, int]:
        """Empty up to ``limit`` rows of each kind of the erasure's subject or tenant
        that are not pending, and add them to its counts, in one transaction; the
        rows emptied by kind (all zero: nothing left that can be erased now)."""
        key = erasure.key
        scope = erasure.scope
        async with self.db.transaction() as conn, self.db.erasing(conn):
            inbox = await self.db.rows(conn, f"erase_inbox_{scope}", (key, now, limit))
            quarantine = await self.db.rows(conn, f"erase_quarantine_{scope}", (key, now, limit))
            handled: list[Any] = []
            outbox = await self.db.rows(conn, f"erase_outbox_{scope}", (key, now, limit))
            if inbox:
                ids = self.db.array([int(r[0]) for r in inbox])
                handled = await self.db.rows(conn, "erase_inbox_attempts", (ids,))
                if scope == "tenant":  # what its handlers added, found by the rows
                    outbox += await self.db.rows(conn, "erase_handler_outbox_ids", (ids, now))
            if scope == "subject":  # found by the subject's index, whenever added
                outbox += await self.db.rows(
                    conn, "erase_handler_outbox_subject", (key, now, limit)
                )
            attempts: list[Any] = []
            if outbox:
                ids = self.db.array([int(r[0]) for r in outbox])
                attempts = await self.db.rows(conn, "erase_attempts", (ids,))
            messages = await self.db.rows(conn, f"erase_messages_{scope}", (key, now, limit))
            if scope == "subject":  # the states its events wrote, by the subject itself
                projections = await self.db.rows(
                    conn, "erase_projections_subject", (key, now, limit)
                )
            elif inbox:  # what the tenant's erased events wrote (projections have no tenant)
                ids = self.db.array([int(r[0]) for r in inbox])
                projections = await self.db.rows(conn, "erase_projections_ids", (ids, now))
            else:
                projections = []
            counts = {
                "inbox": len(inbox),
                "quarantine": len(quarantine),
                "outbox": len(outbox),
                "attempts": len(attempts),
                "messages": len(messages),
                "inbox_attempts": len(handled),
                "projections": len(projections),
            }
            if any(counts.values()):
                await self.db.rows(
                    conn,
                    "erasure_add",
                    (erasure.id, *(counts[kind] for kind in ERASED_KINDS), now),
                )
                # The index rows of what this batch emptied, once they find nothing more.
                await forget_subjects(
                    self.db,
                    conn,
                    inbox=[int(r[0]) for r in inbox],
                    quarantine=[int(r[0]) for r in quarantine],
                    outbox=[int(r[0]) for r in outbox],
                    messages=[str(r[0]) for r in messages],
                )
        return counts

    async def forget_dropped_messages(self, *, limit: int) -> int:
        """After time partitions of the sending side were dropped: :func:`forget_subjects`
        for the index's message references below the lowest id the messages still hold
        (message ids sort by time), in id order, ``limit`` a transaction; how many index
        rows went. Those whose deliveries still hold data stay (read again at the next
        drop)."""
        async with self.db.transaction() as conn:
            row = await self.db.first(conn, "subjects_messages_low", ())
        # No message left: every reference is below (a message published meanwhile
        # commits with its index row and holds its body: never forgotten).
        low = "\uffff" if row is None or row[0] is None else str(row[0])
        return await self._forget_below("messages", "subjects_message_refs_below", "", low, limit)

    async def forget_dropped(self, *, limit: int) -> int:
        """After time partitions of the inbox were dropped: :func:`forget_subjects` for
        the index's inbox references below the lowest id the inbox still holds, in id
        order, ``limit`` a transaction; how many index rows went. Those that still find
        a handler's row holding data stay (its purge asks again); they are read again
        at the next drop."""
        async with self.db.transaction() as conn:
            row = await self.db.first(conn, "subjects_inbox_low", ())
        # An empty inbox: every reference is below (a row accepted meanwhile commits
        # with its index row, and holds its payload: never forgotten).
        low = MAX_ID if row is None or row[0] is None else int(row[0])
        return await self._forget_below("inbox", "subjects_inbox_refs_below", MIN_ID, low, limit)

    async def _forget_below(
        self,
        kind: Literal["inbox", "messages"],
        statement: str,
        after: int | str,
        low: int | str,
        limit: int,
    ) -> int:
        """:func:`forget_subjects` for the index's references of ``kind`` that
        ``statement`` reads after ``after`` and below ``low``, in order, ``limit`` a
        transaction; how many index rows went."""
        ref = type(low)  # inbox ids are integers, message ids text
        total = 0
        while True:
            async with self.db.transaction() as conn:
                rows = await self.db.rows(conn, statement, (after, low, limit))
                refs: list[Any] = [ref(r[0]) for r in rows]
                if refs:
                    total += await forget_subjects(self.db, conn, **{kind: refs})
            if len(refs) < limit:
                return total
            after = refs[-1]

    async def flush(self) -> None:
        """After a run: move what the erasure changed out of the backend's logs where
        it can (SQLite: a checkpoint that truncates the WAL); nothing by default
        (PostgreSQL keeps old row versions until VACUUM: docs/operating.md)."""
        await self.db.checkpoint()

    async def settle(self, erasure: Erasure, *, now: float) -> int:
        """Record how many of the erasure's rows still wait (finished at none); how
        many."""
        async with self.db.transaction() as conn:
            if erasure.scope == "subject":
                row = await self.db.first(conn, "erase_waiting_subject", (erasure.key,))
            else:
                row = await self.db.first(conn, "erase_waiting_tenant", (erasure.key,))
            waiting = int(row[0])
            await self.db.rows(conn, "erasure_settle", (erasure.id, waiting, now))
        return waiting

    async def get(self, erasure_id: int) -> Erasure | None:
        async with self.db.transaction() as conn:
            row = await self.db.first(conn, "erasure_get", (erasure_id,))
        return None if row is None else Erasure.from_row(row)

    async def latest(self, limit: int = 100) -> list[Erasure]:
        """The latest erasures, newest first."""
        async with self.db.transaction() as conn:
            rows = await self.db.rows(conn, "erasure_list", (limit,))
        return [Erasure.from_row(r) for r in rows]

    async def open_ids(self, limit: int = 100) -> list[int]:
        """Erasures still waiting for rows, oldest first."""
        async with self.db.transaction() as conn:
            rows = await self.db.rows(conn, "erasure_open_ids", (limit,))
        return [int(r[0]) for r in rows]
