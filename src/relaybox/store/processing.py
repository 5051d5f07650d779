"""What the worker needs of a store beyond the core statements of :mod:`.base`: the
capabilities a backend declares, and the statements of a group of events run in one
transaction (PostgreSQL), so that no caller compares backends."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, ClassVar

from sqlalchemy.ext.asyncio import AsyncConnection

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from relaybox.store.base import OutboxRow

__all__ = ["Processing"]


class Processing:
    """Capabilities and group statements of a store (a base of :class:`~relaybox.store.Store`).

    ``single_writer``: the database takes one write transaction at a time (SQLite).
    Concurrent transactions would only queue, so the worker runs one at a time, a
    claimed batch runs in one transaction (one COMMIT, one fsync, a savepoint per
    event), the claimed rows' hold needs no renewal (no other claimer passes a batch
    in its write transaction), and the acceptor uses one committer.

    ``groups``: the store runs a group of events in one transaction with each row
    locked and fenced by its attempt (:meth:`inbox_lock_group`), a savepoint per event
    when asked (:meth:`savepoint`, :meth:`rollback_to_savepoint`) and the group's
    completions sent with its COMMIT (:meth:`inbox_finish_group_on_commit`). A store
    without it raises :class:`NotImplementedError` from these; the worker does not
    call them then.

    ``starts_at_accept``: :meth:`inbox_accept` honours :attr:`NewDelivery.held_until`
    (the row goes in started and held, for this process's worker); a store without it
    ignores the field, and no worker sets it then.
    """

    single_writer: ClassVar[bool] = False
    groups: ClassVar[bool] = False
    starts_at_accept: ClassVar[bool] = False
    engine: AsyncEngine

    def connection(self) -> AbstractAsyncContextManager[AsyncConnection]:
        """A connection of the store's pool, no transaction begun (a worker chain holds
        one while its events run, one transaction after another)."""
        return self.engine.connect()

    async def inbox_lock_group(
        self,
        conn: AsyncConnection,
        started: Sequence[tuple[int, int]],
        *,
        now: float,
        claims: Sequence[tuple[str, str, int, str, str | None]] = (),
    ) -> bool:
        """The first statement of a group's transaction (``conn`` has begun and sent
        nothing yet): lock the rows still pending at the attempt given ((id, attempt)
        pairs), giving up on a lock after a short wait (the error's SQLSTATE is
        ``55P03``), and insert the ``claims`` as business keys ((key, fingerprint,
        inbox id, source, tenant)). False when a row did not match or a key was not
        inserted: the caller rolls back."""
        raise NotImplementedError(f"{type(self).__name__} runs no groups")

    async def savepoint(self, conn: AsyncConnection, *, release: bool, again: bool = True) -> None:
        """A group's savepoint around one event's handler. ``release``: release the
        previous event's first; ``again=False``: only that. A transaction that a
        handler left aborted raises an error with SQLSTATE ``25P02`` here."""
        raise NotImplementedError(f"{type(self).__name__} runs no groups")

    async def rollback_to_savepoint(self, conn: AsyncConnection) -> None:
        """Undo what the current event did since its :meth:`savepoint`."""
        raise NotImplementedError(f"{type(self).__name__} runs no groups")

    async def inbox_finish_group_on_commit(
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
        (locked by :meth:`inbox_lock_group`) completed, the next group's start marks
        (``claimed``: (id, attempts as claimed) pairs, counted only while still pending
        so), and the business keys it claimed that no handler asked for ``released``."""
        raise NotImplementedError(f"{type(self).__name__} runs no groups")
