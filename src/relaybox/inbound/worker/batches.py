"""SQLite's claimed batches (:class:`BatchRunner`): several events in one transaction,
each in a SAVEPOINT (one writer, one COMMIT and one fsync for the batch); plain-def
handlers after it, each in a synchronous transaction of its own. Inline acceptance
runs a handler the same way, in the accept's transaction (:meth:`BatchRunner.process`)."""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox.inbound.worker.handlers import HandlerLookup, HandlerRunner
from relaybox.inbound.worker.outcomes import OutcomeRecorder, _Outcome, _Plan
from relaybox.inbound.worker.threaded import ThreadedRunner
from relaybox.log import short_error
from relaybox.store import InboxEvent

if TYPE_CHECKING:
    from relaybox.clock import Clock
    from relaybox.inbound.worker.context import Hooks
    from relaybox.store import Store

log = structlog.get_logger("relaybox.worker")

__all__ = ["BatchRunner"]


@dataclass(eq=False)
class BatchRunner:
    """Runs a claim's events in transactions of several (SQLite). It holds what it
    calls: the ``handlers``' runner, the ``threaded`` runner for plain defs, the
    outcome ``recorder``; ``worker`` is the worker's name, in log lines."""

    store: Store
    clock: Clock
    hooks: Hooks
    _: KW_ONLY
    lookup: HandlerLookup
    handlers: HandlerRunner
    threaded: ThreadedRunner
    recorder: OutcomeRecorder
    worker: str

    async def start_and_process(self, ids: list[int], events: dict[int, InboxEvent]) -> None:
        """Count the attempts of ``ids`` (of the claimed ``events``) and run them."""
        # The attempt is counted as the events start, not at the claim: rows still
        # waiting for a slot are not charged if the process dies meanwhile.
        started = await self.store.inbox.start(ids, self.clock.now())
        ids = [i for i in ids if i in started]
        if not ids:
            return
        # Plain-def handlers run in synchronous transactions of their own, after the
        # batch (one writer: never while the batch holds the write lock).
        threaded = {i: r for i in ids if (r := self.lookup.threaded(events[i])) is not None}
        batch = [i for i in ids if i not in threaded]
        if batch:
            await self._process_batch(batch)
        await self.threaded.run_events(threaded, started, events)

    async def _process_batch(self, ids: list[int]) -> None:
        """Several events in one transaction, each in a savepoint (SQLite: one
        COMMIT, one fsync, for the whole group)."""
        store = self.store
        try:
            async with store.transaction() as conn:
                events = await store.inbox.lock(conn, ids)
                done: list[int] = []
                created = False
                reports: list[_Plan] = []
                for event in events:
                    outcome = await self.process(conn, event, reports)
                    if outcome.kind == "done":
                        done.append(event.id)
                    created = created or outcome.outbox_created
                if done:
                    await store.inbox.complete(conn, done, self.clock.now())
                await self.hooks.fire("before_commit", [e.id for e in events])
            self.recorder.report(reports)
            if created:
                store.db.wake("outbox")
            await self.hooks.fire("after_commit", [e.id for e in events])
        except Exception as exc:
            log.warning(
                "worker_commit_uncertain", worker=self.worker, ids=ids, error=short_error(exc)
            )
            raise

    async def process(
        self, conn: AsyncConnection, event: InboxEvent, reports: list[_Plan] | None = None
    ) -> _Outcome:
        """Run the handler for one locked event inside a savepoint, then record its
        outcome in the enclosing transaction. The caller marks ``done`` rows complete
        (and emits ``reports`` after its COMMIT, when given)."""
        started = self.clock.now()
        ctx, outcome = await self.handlers.run(conn, event, savepoint=True)
        await self.recorder.record(conn, event, ctx, outcome, started, reports)
        outcome.outbox_created = outcome.kind == "done" and ctx.outbox_created
        return outcome
