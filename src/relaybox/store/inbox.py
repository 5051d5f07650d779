"""The store's receiving side: the accept, the worker's claim and processing
statements, and the reads of single events.

:class:`InboxStore` holds a :class:`~relaybox.store.backend.Backend`; the methods
taking a ``conn`` run inside a transaction the caller opened with
:meth:`Store.transaction <relaybox.store.base.Store.transaction>`. Each backend
subclasses it where it accepts, claims or runs a group its own way
(:mod:`relaybox.store.postgres`, :mod:`relaybox.store.sqlite`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox.store import statements as st
from relaybox.store.backend import Backend
from relaybox.store.inbox_rows import (
    AcceptOutcome,
    Claim,
    InboxEvent,
    NewAttempt,
    NewDelivery,
    NewOperation,
    OutboxRow,
    Stats,
)

__all__ = ["InboxStore"]


class InboxStore:
    """The inbox's statements over one backend."""

    def __init__(self, db: Backend) -> None:
        self.db = db

    # -- accept -----------------------------------------------------------------

    async def accept(self, batch: Sequence[NewDelivery]) -> list[AcceptOutcome]:
        """Insert a batch in one transaction, committed once (group commit).
        See :meth:`insert` for the outcomes."""
        async with self.db.connect() as conn:
            return await self.insert(conn, batch)

    async def insert(
        self, conn: AsyncConnection, batch: Sequence[NewDelivery]
    ) -> list[AcceptOutcome]:
        """Insert deliveries in the caller's transaction.

        For each delivery: ``accepted`` (a new row), ``duplicate`` (the key exists
        with the same fingerprint: nothing changes), ``quarantined`` (the key exists
        with another fingerprint: the newcomer is stored apart), or ``ignored``
        (a new row recorded as ignored). Raises on any database error: the caller
        answers 503 to the deliveries of the batch (see :meth:`row_error`).
        """
        raise NotImplementedError

    def row_error(self, exc: BaseException) -> bool:
        """Whether ``exc``, raised by :meth:`accept`, comes from what a row
        holds (a value the driver cannot encode, or the database refuses) rather
        than from the database being unreachable: the acceptor then commits the
        batch's rows apart, so that only the refused one fails. Here: values that
        could not be converted (``UnicodeEncodeError`` is a ``ValueError``)."""
        return isinstance(exc, ValueError | TypeError)

    async def warm_accept(self, connections: int) -> None:
        """Open what the accept path uses before the first request needs it (the
        PostgreSQL store: its connections, its statement prepared on each). Nothing
        to do here."""

    # -- reads --------------------------------------------------------------------

    async def get(self, inbox_id: int) -> InboxEvent | None:
        async with self.db.connect() as conn:
            row = (await conn.exec_driver_sql(self.db.q["inbox_get"], (inbox_id,))).first()
        return InboxEvent.from_row(row) if row else None

    async def get_by_key(self, source: str, account: str, event_id: str) -> InboxEvent | None:
        async with self.db.connect() as conn:
            q = self.db.q["inbox_get_by_key"]
            row = (await conn.exec_driver_sql(q, (source, account, event_id))).first()
        return InboxEvent.from_row(row) if row else None

    async def stats(self) -> Stats:
        counts: dict[tuple[str, str | None], int] = {}
        oldest: float | None = None
        async with self.db.connect() as conn:
            rows: Iterable[Sequence[Any]] = await conn.exec_driver_sql(self.db.q["stats_inbox"])
            for status, reason, n, old in rows:
                counts[(status, reason)] = n
                if old is not None:
                    oldest = old if oldest is None else min(oldest, old)
            quarantined = (await conn.exec_driver_sql(self.db.q["stats_quarantine"])).scalar_one()

        def total(status: str) -> int:
            return sum(n for (s, _), n in counts.items() if s == status)

        return Stats(
            pending=total("pending"),
            done=total("done"),
            ignored=total("ignored"),
            dead_invalid=counts.get(("dead", "invalid"), 0),
            dead_exhausted=counts.get(("dead", "exhausted"), 0),
            dead_other=total("dead")
            - counts.get(("dead", "invalid"), 0)
            - counts.get(("dead", "exhausted"), 0),
            quarantined=quarantined,
            oldest_pending_at=oldest,
        )

    # -- processing -----------------------------------------------------------------

    async def claim(
        self, *, now: float, limit: int, max_attempts: int, hold: float, start: int = 0
    ) -> Claim:
        """Phase 1 of processing, its own short transaction: hold up to ``limit`` due
        rows back ``hold`` seconds, and dead-letter the ones whose attempts were used up
        by workers that died. ``start``: how many of them (the first due, suspects
        excepted) the worker starts at once, whose attempts the claim counts
        (PostgreSQL; SQLite counts none here: its worker runs a claim as one batch)."""
        async with self.db.connect() as conn:
            rows = await self.db.rows(conn, "inbox_claim", (now, limit, hold, max_attempts))
        return Claim.from_rows(rows)

    async def keep_hold(self, ids: Sequence[int], held: Sequence[float], until: float) -> None:
        """Renew the hold of a live worker's claimed rows not finished yet (PostgreSQL,
        ``inbox_keep_hold``). SQLite: nothing to do; a batch runs in one write
        transaction, which no other claimer passes."""

    async def start(self, ids: Sequence[int], now: float) -> dict[int, int]:
        """Count an attempt on ``ids`` as they start, in its own short transaction
        (durable before any handler runs); return each row's attempt number."""
        async with self.db.connect() as conn:
            rows = await self.db.rows(conn, "inbox_start", (self.db.array(ids), now))
        return {r[0]: r[1] for r in rows}

    async def begin(
        self, conn: AsyncConnection, inbox_id: int, *, attempt: int, now: float
    ) -> bool:
        """The first statement of one event's own transaction (``conn`` has begun and
        sent nothing yet): mark the row done, under its row lock, if it is still
        pending at ``attempt``; the handler's failure rolls the mark back. Returns
        whether the row is this worker's to process."""
        return bool(await self.db.rows(conn, *st.inbox_begin(inbox_id, attempt=attempt, now=now)))

    async def start_on_commit(
        self, conn: AsyncConnection, inbox_id: int, *, attempts: int, now: float
    ) -> None:
        """Count the attempt of the event that starts after ``conn``'s transaction, in
        that transaction (last statement before COMMIT): counted only if it commits,
        and only while the row is still pending at ``attempts`` (as claimed). The
        next :meth:`begin` with ``attempts + 1`` tells whether it was."""
        await self.db.rows(conn, "inbox_start_next", (inbox_id, now, attempts))

    async def lock(self, conn: AsyncConnection, ids: Sequence[int]) -> list[InboxEvent]:
        """Phase 2: lock claimed rows still pending, until the caller's COMMIT."""
        return st.inbox_events(await self.db.rows(conn, *st.inbox_lock(ids, self.db.array)))

    async def complete(self, conn: AsyncConnection, ids: Sequence[int], now: float) -> None:
        await self.db.rows(conn, "inbox_complete", (self.db.array(ids), now))

    async def retry_later(
        self, conn: AsyncConnection, inbox_id: int, *, at: float, error: str, now: float
    ) -> None:
        await self.db.rows(conn, *st.inbox_retry_later(inbox_id, at=at, error=error, now=now))

    async def kill(
        self, conn: AsyncConnection, inbox_id: int, *, reason: str, error: str, now: float
    ) -> None:
        await self.db.rows(conn, *st.inbox_kill(inbox_id, reason=reason, error=error, now=now))

    async def attempt_insert(self, conn: AsyncConnection, attempt: NewAttempt) -> None:
        """Add ``attempt`` to the attempts history, in ``conn``'s transaction."""
        await self.db.rows(conn, *st.attempt_insert(attempt))

    async def operation_insert(
        self, conn: AsyncConnection, operation: NewOperation
    ) -> tuple[bool, str]:
        """Insert a business key; return (created, stored fingerprint)."""
        return await st.run(self.db, conn, st.operation_insert(operation, self.db.backend))

    async def outbox_insert(
        self,
        conn: AsyncConnection,
        *,
        channel: str,
        key: str,
        payload: str,
        tenant: str | None,
        inbox_id: int | None,
        now: float,
    ) -> int | None:
        """Record an outgoing action; ``None`` when (channel, key) already exists."""
        row = OutboxRow(channel, key, payload, tenant, inbox_id)
        found = await self.db.first(conn, *st.outbox_insert(row, now=now))
        return found[0] if found else None

    async def outbox_insert_rows(
        self, conn: AsyncConnection, rows: Sequence[OutboxRow], *, now: float
    ) -> None:
        """Handlers' outbox rows, written in ``conn``'s transaction before it commits; a
        (channel, key) that exists is left alone."""
        await st.run(self.db, conn, st.outbox_insert_rows(rows, now=now))

    # -- groups (PostgreSQL) ------------------------------------------------------------

    def event_transaction(self, conn: AsyncConnection) -> AbstractAsyncContextManager[Any]:
        """One event's own transaction on ``conn``, committed on success; its first
        statement is :meth:`begin`."""
        return self.db.event_transaction(conn)

    async def lock_group(
        self,
        conn: AsyncConnection,
        started: Sequence[tuple[int, int]],
        *,
        now: float,
        claims: Sequence[NewOperation] = (),
    ) -> bool:
        """The first statement of a group's transaction (``conn`` has begun and sent
        nothing yet): lock the rows still pending at the attempt given ((id, attempt)
        pairs), giving up on a lock after a short wait (the error's SQLSTATE is
        ``55P03``), and insert the ``claims`` as business keys. False when a row
        did not match or a key was not inserted: the caller rolls back. Only where
        the backend's ``groups`` is on."""
        raise NotImplementedError(f"{type(self).__name__} runs no groups")

    async def savepoint(self, conn: AsyncConnection, *, release: bool, again: bool = True) -> None:
        """A group's savepoint around one event's handler. ``release``: release the
        previous event's first; ``again=False``: only that. A transaction that a
        handler left aborted raises an error with SQLSTATE ``25P02`` here."""
        raise NotImplementedError(f"{type(self).__name__} runs no groups")

    async def rollback_to_savepoint(self, conn: AsyncConnection) -> None:
        """Undo what the current event did since its :meth:`savepoint`."""
        raise NotImplementedError(f"{type(self).__name__} runs no groups")

    async def finish_group_on_commit(
        self,
        conn: AsyncConnection,
        done: Sequence[int],
        claimed: Sequence[tuple[int, int]],
        outbox: Sequence[OutboxRow] = (),
        *,
        now: float,
        released: Sequence[str] = (),
    ) -> None:
        """With a group's COMMIT: its handlers' ``outbox`` rows, its ``done`` rows
        (locked by :meth:`lock_group`) completed, the next group's start marks
        (``claimed``: (id, attempts as claimed) pairs, counted only while still pending
        so), and the business keys it claimed that no handler asked for ``released``."""
        raise NotImplementedError(f"{type(self).__name__} runs no groups")
