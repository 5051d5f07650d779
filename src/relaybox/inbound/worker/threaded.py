"""Synchronous handlers (plain ``def``): each event runs in a worker thread, in one
transaction from ``box.sync_transaction()`` (:meth:`Threaded._run_threaded`).

The attempt is counted before, as for every event (the start mark). The transaction's
first statement completes the row if it is still pending at that attempt
(``inbox_begin_done``, under the row lock); then the handler runs with a
:class:`~relaybox.sync.SyncContext` on the same connection, its ORM session is flushed,
its outbox rows are written and a retried success is added to the attempts history,
and the transaction commits: effect, business keys, projection, outbox rows and
completion together. A handler that raises rolls all of it back; a second short
transaction records the outcome (retry with backoff, dead letters, the attempts
history) while the row is still pending, through the same plan as async handlers
(:meth:`Recorder._plan`). Log lines and metrics follow the COMMIT, and the worker's
``before_commit`` / ``after_commit`` hooks run on its event loop as for async events.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy.engine import Connection

from relaybox import tracing
from relaybox.errors import OperationConflict, PermanentError
from relaybox.inbound.worker.context import process_attributes
from relaybox.inbound.worker.outcomes import (
    Recorder,
    _NotOurs,
    _Outcome,
    _Plan,
    _Report,
    _RolledBack,
)
from relaybox.log import error_text, short_error
from relaybox.store import InboxEvent

if TYPE_CHECKING:
    from relaybox.inbound.worker.context import Registration
    from relaybox.inbound.worker.transactions import _Job
    from relaybox.sync.context import SyncContext

log = structlog.get_logger("relaybox.worker")

__all__ = ["Threaded"]


class Threaded(Recorder):
    """Runs events whose handler is a plain ``def`` (a base of the worker's runners)."""

    if TYPE_CHECKING:

        def _registration(self, source: str, event_type: str) -> Registration | None: ...

        def _take(self) -> _Job | None: ...

    def _threaded(self, event: InboxEvent) -> Registration | None:
        """The registration of ``event`` when its handler is a plain ``def``."""
        registration = self._registration(event.source, event.event_type)
        return registration if registration is not None and registration.sync else None

    async def _run_threaded(
        self, event: InboxEvent, attempt: int, registration: Registration
    ) -> bool:
        """Run ``event`` (its attempt counted: ``attempt``) in a worker thread and its
        own synchronous transaction; emit its report after the COMMIT. ``False``: the
        row was not this worker's any more (completed, or started again elsewhere)."""
        loop = asyncio.get_running_loop()
        # The thread runs in a copy of this context: the span is current there.
        with tracing.span(
            "relaybox.process",
            kind="consumer",
            parent=event.traceparent,
            attributes={**process_attributes(event), "relaybox.attempt": attempt},
        ):
            reports = await asyncio.to_thread(self._in_thread, loop, event, attempt, registration)
        if reports is None:
            return False
        self._report(reports)
        if any(kind == "done" and "outbox_keys" in fields for _, kind, _, fields in reports):
            self.box.store.db.wake("outbox")
        await self.hooks.fire("after_commit", [event.id])
        return True

    async def _run_threaded_job(
        self, job: _Job, attempt: int, registration: Registration
    ) -> _Job | None:
        """A chain's plain-def event (:meth:`_run_threaded`); returns the chain's next
        job, its attempt not counted yet."""
        try:
            await self._run_threaded(job.event, attempt, registration)
        except Exception as exc:
            # The COMMIT's answer may be lost: the row comes back after the hold, and
            # its business keys say what happened.
            log.warning(
                "worker_commit_uncertain",
                worker=self.name,
                ids=[job.event.id],
                error=short_error(exc),
            )
            job.batch.finish(exc)
            return None
        job.batch.finish()
        return self._take()

    async def _run_threaded_events(
        self,
        threaded: dict[int, Registration],
        started: dict[int, int],
        events: dict[int, InboxEvent],
    ) -> None:
        """Events of a claim (SQLite), one after another, their attempts counted
        (``started``); raises the first failure once all have run."""
        failures: list[BaseException] = []
        for inbox_id, registration in threaded.items():
            try:
                await self._run_threaded(events[inbox_id], started[inbox_id], registration)
            except Exception as exc:
                log.warning(
                    "worker_commit_uncertain",
                    worker=self.name,
                    ids=[inbox_id],
                    error=short_error(exc),
                )
                failures.append(exc)
        if failures:
            raise failures[0]

    def _in_thread(
        self,
        loop: asyncio.AbstractEventLoop,
        event: InboxEvent,
        attempt: int,
        registration: Registration,
    ) -> list[_Report] | None:
        from relaybox.sync.context import SyncContext

        box = self.box
        store = box.store.sync
        object.__setattr__(event, "attempts", attempt)  # this worker's own copy of the row
        started = box.clock.now()
        try:
            with box.sync_transaction() as conn:
                if not store.inbox.begin(conn, event.id, attempt=attempt, now=started):
                    raise _NotOurs
                ctx = SyncContext(box, conn, event)
                ctx._declare(registration)
                outcome = self._call(ctx, registration)
                if outcome.kind != "done":
                    raise _RolledBack(ctx, outcome)
                store.inbox.outbox_insert_rows(conn, ctx.outbox_rows, now=box.clock.now())
                plan = self._plan(event, ctx, outcome, started)
                self._write(conn, event, plan)
                self._on_loop(loop, self.hooks.fire("before_commit", [event.id]))
            return [plan.report]
        except _NotOurs:
            return None
        except _RolledBack as failed:
            with box.sync_transaction() as conn:
                locked = store.inbox.lock(conn, [event.id])
                if not locked or locked[0].attempts != attempt:
                    return None  # completed meanwhile, or started again elsewhere
                object.__setattr__(locked[0], "attempts", attempt)
                plan = self._plan(locked[0], failed.ctx, failed.outcome, started)
                self._write(conn, locked[0], plan)
            return [plan.report]

    def _call(self, ctx: SyncContext, registration: Registration) -> _Outcome:
        """The handler's outcome; its ORM session flushed on success, closed always."""
        try:
            result = registration.handler(ctx)  # type: ignore[arg-type]
            if inspect.isawaitable(result):
                if inspect.iscoroutine(result):
                    result.close()
                raise TypeError(
                    "the handler returned an awaitable: register an async def handler,"
                    " or a plain def that does its work before it returns"
                )
            ctx._flush_session()
            return _Outcome("done")
        except OperationConflict as exc:
            return _Outcome("conflict", str(exc))
        except PermanentError as exc:
            return _Outcome("invalid", str(exc) or type(exc).__name__)
        except Exception as exc:
            return _Outcome("retry", error_text(exc))
        finally:
            ctx._close_session()

    def _write(self, conn: Connection, event: InboxEvent, plan: _Plan) -> None:
        """:meth:`Recorder._record`'s writes, on the synchronous connection."""
        store = self.box.store.sync
        if plan.retry_at is not None:
            store.inbox.retry_later(
                conn, event.id, at=plan.retry_at, error=plan.error, now=plan.now
            )
        if plan.dead:
            store.inbox.kill(conn, event.id, reason=plan.kind, error=plan.error, now=plan.now)
        if plan.history:
            store.inbox.attempt_insert(conn, plan.attempt_row(event, self.name))

    @staticmethod
    def _on_loop(loop: asyncio.AbstractEventLoop, hook: Coroutine[Any, Any, None]) -> None:
        """Run a worker hook (async) on the worker's loop from this thread, and wait."""
        asyncio.run_coroutine_threadsafe(hook, loop).result()
