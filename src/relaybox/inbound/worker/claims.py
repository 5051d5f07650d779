"""Claiming due inbox rows (:class:`Claimer`): one autocommit statement holds up to a
batch of due rows back for this worker and dead-letters rows whose budget workers that
died used up (``exhausted``, announced in a transaction of their own); while the rows
run, their hold is renewed (:meth:`Claimer.holding`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING

import structlog

from relaybox import tracing
from relaybox.inbound.worker.outcomes import dead_event
from relaybox.log import short_error
from relaybox.store import Claim

if TYPE_CHECKING:
    from relaybox.clock import Clock
    from relaybox.metrics import Metrics
    from relaybox.runtime import Announce
    from relaybox.store import Store

log = structlog.get_logger("relaybox.worker")

__all__ = ["Claimer"]


@dataclass(eq=False)
class Claimer:
    """Claims rows for one worker (``worker``: its name): up to ``batch`` rows at a
    time, held ``hold`` seconds and renewed while they run; ``max_attempts`` is the
    budget past which a row whose worker died goes to dead letters. ``announce``
    publishes ``relaybox.inbox.dead`` (the receiving side's announcer)."""

    store: Store
    clock: Clock
    metrics: Metrics
    announce: Announce
    _: KW_ONLY
    worker: str
    batch: int
    hold: float
    max_attempts: int

    async def claim(self, now: float, *, start: int) -> Claim:
        """Claim due rows, the first ``start`` of them started by the claim itself
        (PostgreSQL). The rows it dead-lettered are the caller's to report
        (:meth:`report_exhausted`)."""
        began = tracing.now_ns() if tracing.enabled() else 0
        claim = await self.store.inbox.claim(
            now=now,
            limit=self.batch,
            max_attempts=self.max_attempts,
            hold=self.hold,
            start=start,
        )
        if began and claim.events:  # a span only for a claim that took rows
            tracing.record(
                "relaybox.claim",
                began,
                {"relaybox.claimed": len(claim.events), "relaybox.worker": self.worker},
                (e.traceparent for e in claim.events.values()),
            )
        return claim

    async def report_exhausted(self, claim: Claim) -> None:
        """The metric, the log line and ``relaybox.inbox.dead`` of the rows ``claim``
        dead-lettered as ``exhausted`` (their budget used up by workers that died)."""
        for inbox_id, source, account, event_id, attempts in claim.exhausted:
            self.metrics.processed.labels(source, "dead_exhausted").inc()
            log.error(
                "event_dead",
                reason="exhausted",
                inbox_id=inbox_id,
                event_key=[source, account, event_id],
                attempts=attempts,
                error="the worker died during its last attempt",
            )
        if claim.exhausted:
            try:
                await self._announce_dead(claim.exhausted)
            except Exception as exc:
                log.error("operational_event_failed", event="inbox.dead", error=short_error(exc))

    async def _announce_dead(self, dead: list[tuple[int, str, str, str, int]]) -> None:
        """``relaybox.inbox.dead`` for rows a claim dead-lettered (their worker died in
        their last attempt): the claim is one statement of its own, so the events
        follow in a transaction of their own."""
        async with self.store.transaction() as conn:
            for inbox_id, source, account, event_id, attempts in dead:
                data = dead_event(inbox_id, (source, account, event_id), None, None)
                data.update(
                    reason="exhausted",
                    attempts=attempts,
                    error="the worker died during its last attempt",
                )
                await self.announce(conn, "relaybox.inbox.dead", data)

    @contextlib.asynccontextmanager
    async def holding(self, ids: list[int], until: float) -> AsyncIterator[None]:
        """Renew the hold of ``ids`` (``until`` written) while the block runs
        (:meth:`_keep_hold`)."""
        stop = asyncio.Event()
        keeper = asyncio.create_task(self._keep_hold(ids, until, stop))
        try:
            yield
        finally:
            stop.set()
            await asyncio.gather(keeper, return_exceptions=True)

    async def _keep_hold(self, ids: list[int], until: float, stop: asyncio.Event) -> None:
        """While the claim runs, renew its rows' hold every third of ``claim_hold``
        (``inbox_keep_hold``): a row that waits its turn, or waits for a lock, longer
        than the hold does not come back to other workers as if this one had died (nor,
        its budget counted, go to dead letters as ``exhausted``). This process dying
        stops the renewals: its rows come back a hold later, as before."""
        held = [until]
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.hold / 3)
            if stop.is_set():
                return
            until = self.clock.now() + self.hold
            try:
                await self.store.inbox.keep_hold(ids, held, until)
            except Exception as exc:  # the database went away: the rows come back
                log.warning("worker_hold_failed", worker=self.worker, error=short_error(exc))
                continue
            held.append(until)
