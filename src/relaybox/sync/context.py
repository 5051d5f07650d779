"""What a synchronous handler (a plain ``def``) gets: :class:`SyncContext`, the twin
of :class:`relaybox.inbound.worker.Context` over a synchronous ``Connection``.

    @box.handler("stripe", "invoice.paid")
    def grant(ctx: SyncContext) -> None:
        if ctx.once(f"grant:{ctx.payload['data']['object']['id']}"):
            ctx.conn.execute(text("UPDATE balances SET credits = credits + 100 ..."))
            ctx.outbox.add("email", f"receipt:{ctx.event.event_id}", {...})

The worker runs it in a thread, inside one transaction from ``box.sync_transaction()``:
the effect, the business keys, the projection, the outbox rows and the inbox row's
completion commit together or roll back together.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from relaybox.inbound import projections
from relaybox.inbound.worker.context import Handling, _add_row

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = ["StoreTransactions", "SyncContext", "SyncOutbox", "SyncTransaction"]

SyncTransaction = Callable[[], AbstractContextManager[Connection]]
"""A provider of synchronous transactions (``box.sync_transaction``): called with no
argument, it returns a context manager that yields a ``Connection`` in an open
transaction, committed when the block ends and rolled back when it raises."""


class StoreTransactions:
    """The default provider of synchronous transactions (``box.sync_transaction``): a
    transaction on the sync engine of ``box``'s store (:attr:`Store.sync`), made on
    first use from the database URL (psycopg 3 on PostgreSQL, sqlite3 on SQLite). The
    store is read at each call: a box closed and opened again has a new one."""

    def __init__(self, box: Runtime) -> None:
        self.box = box

    def __call__(self) -> AbstractContextManager[Connection]:
        return self.box.store.sync.transaction()


class SyncOutbox:
    """Outgoing actions recorded in a synchronous handler's transaction."""

    def __init__(self, ctx: SyncContext) -> None:
        self._ctx = ctx

    def add(self, channel: str, key: str, payload: Any) -> None:
        """Record an outgoing action, once per ``(channel, key)``, written with the
        handler's COMMIT and delivered after it (as ``Context.outbox.add``)."""
        _add_row(self._ctx, channel, key, payload)


@dataclass
class SyncContext(Handling):
    """What a plain ``def`` handler gets: the event and the synchronous transaction it
    runs in (``conn``; ``session`` for the ORM)."""

    conn: Connection

    def __post_init__(self) -> None:
        super().__post_init__()
        self.outbox = SyncOutbox(self)

    @property
    def session(self) -> Session:
        """An ORM ``Session`` on :attr:`conn`, in the same transaction: what it writes
        commits with the handler's business keys and the event's completion, or rolls
        back with them. relaybox flushes it when the handler returns; the handler does
        not commit it."""
        return self._bound_session(Session)

    @property
    def driver(self) -> Any:
        """The database driver's own connection under :attr:`conn`, in the same
        transaction: psycopg's ``Connection`` on PostgreSQL (``%s`` placeholders), the
        ``sqlite3`` module's on SQLite (``?``); see ``Context.driver``."""
        if self.conn.closed or self.conn.invalidated:
            raise RuntimeError("ctx.driver is only available while the handler runs")
        return self.conn.connection.driver_connection

    def _flush_session(self) -> None:
        if self._session is not None:
            self._session.flush()

    def _close_session(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            session.close()

    def once(self, business_key: str | None = None, *, fingerprint: str | None = None) -> bool:
        """Record that the operation named by ``business_key`` happens now: ``True`` the
        first time, ``False`` when it already happened (the UNIQUE key decides);
        :class:`~relaybox.errors.OperationConflict` for the key with another
        ``fingerprint``. Without ``business_key``: the one the registration declares
        (as ``Context.once``)."""
        asked = self._once_asked(business_key, fingerprint)
        if asked is None:
            return True
        business_key, fingerprint = asked
        created, stored = self.box.store.sync.inbox.operation_insert(
            self.conn, self._operation(business_key, fingerprint)
        )
        return self._once_answer(business_key, fingerprint, created, stored)

    def project(
        self, resource_key: str, version: str | int | None, state: Any, **options: Any
    ) -> bool:
        """Write ``state`` as ``resource_key``'s current state only if ``version`` is
        newer than the stored one (:func:`relaybox.inbound.projections.project`)."""
        offered = projections.offer(self, resource_key, version, state, **options)
        store = self.box.store.sync
        if store.history.projection_upsert(self.conn, offered):
            return projections.applied(self)
        winner = store.history.projection_get(self.conn, resource_key)
        superseded = projections.refused(self, offered, winner)
        if superseded is not None:
            store.history.inbox_mark_superseded(self.conn, self.event.id, superseded)
        return False
