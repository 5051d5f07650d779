"""Synchronous handlers (plain ``def``): each event runs in a worker thread, in one
transaction from ``box.sync_transaction()`` (:meth:`ThreadedRunner.run`).

The attempt is counted before, as for every event (the start mark). The transaction's
first statement completes the row if it is still pending at that attempt
(``inbox_begin_done``, under the row lock); then the handler runs with a
:class:`~relaybox.sync.SyncContext` on the same connection, its ORM session is flushed,
its outbox rows are written and a retried success is added to the attempts history,
and the transaction commits: effect, business keys, projection, outbox rows and
completion together. A handler that raises rolls all of it back; a second short
transaction records the outcome (retry with backoff, dead letters, the attempts
history) while the row is still pending, through the same plan as async handlers
(:meth:`OutcomeRecorder.plan`). Log lines and metrics follow the COMMIT, and the worker's
``before_commit`` / ``after_commit`` hooks run on its event loop as for async events.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import structlog

from relaybox import tracing
from relaybox.errors import OperationConflict, PermanentError
from relaybox.inbound.worker.context import Hooks, process_attributes
from relaybox.inbound.worker.outcomes import (
    OutcomeRecorder,
    _NotOurs,
    _Outcome,
    _Plan,
    _RolledBack,
)
from relaybox.log import error_text, short_error
from relaybox.store import InboxEvent

if TYPE_CHECKING:
    from relaybox.inbound.worker.context import Registration
    from relaybox.runtime import WorkerRuntime
    from relaybox.sync.context import SyncContext

log = structlog.get_logger("relaybox.worker")

__all__ = ["ThreadedRunner"]


class ThreadedRunner:
    """Runs events whose handler is a plain ``def``. ``box`` gives the synchronous
    transactions (``box.sync_transaction``) and is what their contexts carry
    (``ctx.box``); ``recorder`` records their outcomes; ``hooks`` are the worker's
    (``worker``: its name, in log lines)."""

    def __init__(
        self, box: WorkerRuntime, recorder: OutcomeRecorder, hooks: Hooks, *, worker: str
    ) -> None:
        self.box = box
        self.store = box.store
        self.clock = box.clock
        self.recorder = recorder
        self.hooks = hooks
        self.worker = worker

    async def run(self, event: InboxEvent, attempt: int, registration: Registration) -> bool:
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
        self.recorder.report(reports)
        if any(plan.kind == "done" and "outbox_keys" in plan.fields for plan in reports):
            self.store.wake("outbox")
        await self.hooks.fire("after_commit", [event.id])
        return True

    async def run_events(
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
                await self.run(events[inbox_id], started[inbox_id], registration)
            except Exception as exc:
                log.warning(
                    "worker_commit_uncertain",
                    worker=self.worker,
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
    ) -> list[_Plan] | None:
        from relaybox.sync.context import SyncContext

        box = self.box
        store = self.store.sync
        recorder = self.recorder
        object.__setattr__(event, "attempts", attempt)  # this worker's own copy of the row
        started = self.clock.now()
        try:
            with box.sync_transaction() as conn:
                if not store.inbox_begin(conn, event.id, attempt=attempt, now=started):
                    raise _NotOurs
                ctx = SyncContext(box, conn, event)
                ctx._declare(registration)
                outcome = self._call(ctx, registration)
                if outcome.kind != "done":
                    raise _RolledBack(ctx, outcome)
                store.outbox_insert_rows(conn, ctx.outbox_rows, now=self.clock.now())
                plan = recorder.plan(event, ctx, outcome, started)
                recorder.write_sync(conn, event, plan)
                self._on_loop(loop, self.hooks.fire("before_commit", [event.id]))
            return [plan]
        except _NotOurs:
            return None
        except _RolledBack as failed:
            with box.sync_transaction() as conn:
                locked = store.inbox_lock(conn, [event.id])
                if not locked or locked[0].attempts != attempt:
                    return None  # completed meanwhile, or started again elsewhere
                object.__setattr__(locked[0], "attempts", attempt)
                plan = recorder.plan(locked[0], failed.ctx, failed.outcome, started)
                recorder.write_sync(conn, locked[0], plan)
            return [plan]

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

    @staticmethod
    def _on_loop(loop: asyncio.AbstractEventLoop, hook: Coroutine[Any, Any, None]) -> None:
        """Run a worker hook (async) on the worker's loop from this thread, and wait."""
        asyncio.run_coroutine_threadsafe(hook, loop).result()
