"""The claim loop: :class:`Worker` claims due rows (``run``, ``run_once``) with its
:class:`~relaybox.inbound.worker.claims.Claimer`, which renews their hold while they
run, and hands them to chains (PostgreSQL: groups or one event
per transaction on a connection each) or to SQLite's batches; suspects run alone. In a
process that also receives (PostgreSQL), it takes new rows from the accept as well
(``offer``, ``settle``: :class:`relaybox.inbound.accept.Handoff`).

The worker is built from the objects it holds, each given what it needs, none calling
back into it: the claimer, the queue of claimed events (:mod:`~.queue`), the handler
lookup and runner (:mod:`~.handlers`), the threaded runner for plain defs
(:mod:`~.threaded`), the outcome recorder (:mod:`~.outcomes`), and the transaction
runners that use them (:mod:`~.transactions` for chains, :mod:`~.batches` for
SQLite's batches)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox.inbound.worker.batches import BatchRunner
from relaybox.inbound.worker.claims import Claimer
from relaybox.inbound.worker.handlers import HandlerLookup, HandlerRunner
from relaybox.inbound.worker.outcomes import OutcomeRecorder, _Outcome, _Plan
from relaybox.inbound.worker.queue import ReadyQueue, StartMarks, _Batch, _Job
from relaybox.inbound.worker.threaded import ThreadedRunner
from relaybox.inbound.worker.transactions import ChainRunner
from relaybox.log import short_error
from relaybox.retry import Backoff
from relaybox.store import AcceptOutcome, Claim, InboxEvent, NewDelivery
from relaybox.store.inbox_rows import Listener

if TYPE_CHECKING:
    from relaybox.runtime import WorkerRuntime

__all__ = ["Worker"]

log = structlog.get_logger("relaybox.worker")

_PG_GROUP = 16
"""Events per transaction on PostgreSQL by default (``worker.group``)."""


class Worker:
    """Runs handlers for due inbox rows. ``run()`` loops until stopped;
    ``run_once()`` processes one batch (tests drive it with a frozen clock)."""

    def __init__(
        self,
        box: WorkerRuntime,
        *,
        name: str | None = None,
        concurrency: int | None = None,
        batch: int | None = None,
        group: int | None = None,
        rng: random.Random | None = None,
    ) -> None:
        s = box.settings.worker
        self.box = box
        self.store = store = box.store
        self.clock = clock = box.clock
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        single = store.db.single_writer
        # One writer (SQLite): concurrent transactions would only queue.
        self.concurrency = 1 if single else (concurrency or s.concurrency)
        # A claim feeds every chain's groups: run_once waits for its whole batch, so
        # a batch of only concurrency x group rows would leave chains idle at its end.
        self.batch = batch or s.batch or (32 if single else 128)
        # Events per transaction. PostgreSQL: a group of 16 per chain, one COMMIT (one
        # WAL flush) for all; a group holds its events' row locks (a shared balance,
        # say) until that COMMIT, so it gives up after 50 ms of waiting for a lock
        # (another group's, or a deadlock) and that event runs in a transaction of its
        # own (ChainRunner.run_group). SQLite: the whole claim, since its single writer
        # serialises anyway and one COMMIT (fsync) serves the batch.
        self.group = group or s.group or (self.batch if single else _PG_GROUP)
        # Chains run groups where the store runs one (PostgreSQL); otherwise a claim's
        # events run in batches of ``group`` (SQLite), or one per transaction.
        self._grouped = self.group > 1 and store.db.groups
        self.savepoints = s.savepoints
        self._slots = asyncio.Semaphore(self.concurrency)
        self._isolation = asyncio.Lock()
        self._reserved = 0  # events a claim in flight counts (see _room)
        self._chains = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self.poll_interval = s.poll_interval
        self.claim_hold = s.claim_hold
        self.handler_timeout = s.handler_timeout
        self.backoff = Backoff(
            base=s.backoff_base,
            factor=s.backoff_factor,
            cap=s.backoff_cap,
            jitter=s.backoff_jitter,
            max_attempts=s.max_attempts,
            max_age=s.max_age,
        )
        self.rng = rng or random.Random()
        self.hooks = box.hooks
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        # What the worker holds, each given what it needs; none calls back in here.
        announce = box.inbound.announce
        self.claimer = Claimer(
            store,
            clock,
            box.metrics,
            announce,
            worker=self.name,
            batch=self.batch,
            hold=self.claim_hold,
            max_attempts=self.backoff.max_attempts,
        )
        self.queue = ReadyQueue()
        """Claimed events waiting for a chain (PostgreSQL)."""
        self._ready = self.queue.jobs
        self.lookup = HandlerLookup(box.inbound)
        self.recorder = OutcomeRecorder(
            store,
            clock,
            box.metrics,
            announce,
            box.inbound.announce_sync,
            self.backoff,
            self.rng,
            self.name,
        )
        handlers = HandlerRunner(box, self.lookup, timeout=self.handler_timeout)
        threaded = ThreadedRunner(box, self.recorder, self.hooks, worker=self.name)
        self.chains = ChainRunner(
            store,
            clock,
            self.hooks,
            queue=self.queue,
            marks=StartMarks(store, clock),
            lookup=self.lookup,
            handlers=handlers,
            threaded=threaded,
            recorder=self.recorder,
            group=self.group,
            grouped=self._grouped,
            savepoints=self.savepoints,
            worker=self.name,
        )
        """Runs the events chains take (PostgreSQL; one event per transaction anywhere)."""
        self.batches = BatchRunner(
            store,
            clock,
            self.hooks,
            lookup=self.lookup,
            handlers=handlers,
            threaded=threaded,
            recorder=self.recorder,
            worker=self.name,
        )
        """Runs SQLite's claimed batches, and inline acceptance's handlers."""

    # -- loop -----------------------------------------------------------------

    def stop(self) -> None:
        """Finish the batches in hand, then return from :meth:`run`."""
        self._stopping.set()
        self._wake.set()

    async def run(self) -> None:
        listener = await self._listen()
        try:
            # Two claimers: one claims the next batch while the other's events run.
            await asyncio.gather(*(self._loop() for _ in range(2)))
        finally:
            if listener is not None:
                with contextlib.suppress(Exception):
                    await listener.close()

    async def _loop(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            try:
                n = await self.run_once()
                failures = 0
            except Exception as exc:  # the database went away: back off and retry
                failures += 1
                if failures == 1 or failures % 10 == 0:  # not one line per retry
                    log.warning(
                        "worker_batch_failed",
                        worker=self.name,
                        failures=failures,
                        error=short_error(exc),
                    )
                n = 0
            if n == 0 and not self._stopping.is_set():
                # Idle: the poll interval. Failing: doubling pauses up to 10 s (a wake-up
                # from new rows does not cut them short: the database is the problem).
                pause = self.poll_interval
                if failures:
                    pause = min(self.poll_interval * 2 ** min(failures, 10), 10.0)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), pause)
                    continue
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), pause)

    async def _listen(self) -> Listener | None:
        """Wake up on new rows (PostgreSQL LISTEN, SQLite's in-process signal); polling
        finds them anyway."""
        return await self.store.db.listen("inbox", self._wake)

    # -- one batch ------------------------------------------------------------

    async def run_once(self) -> int:
        """Claim and process one batch; return how many rows were claimed. Nothing
        while this host's clock is past ``clock_max_skew`` (:class:`ClockGuard`)."""
        if not await self.box.clock_guard.check():
            return 0
        now = self.clock.now()
        # Rows that free chains start at once have their attempts counted by the claim
        # itself: their start mark's round trip saved. Reserved while the claim is in
        # flight, so that the other claimer does not count for the same chains.
        start = self._room()
        self._reserved += start
        try:
            claim = await self.claimer.claim(now, start=start)
        finally:
            self._reserved -= start
        await self.claimer.report_exhausted(claim)
        if not claim.ids and not claim.suspects:
            return len(claim.exhausted)
        # One writer's batch needs no renewal: no other claimer passes it.
        held = (
            contextlib.nullcontext()
            if self.store.db.single_writer
            else self.claimer.holding([*claim.ids, *claim.suspects], now + self.claim_hold)
        )
        async with held:
            await self._run_claim(claim)
        return len(claim.ids) + len(claim.suspects) + len(claim.exhausted)

    async def process(
        self, conn: AsyncConnection, event: InboxEvent, reports: list[_Plan] | None = None
    ) -> _Outcome:
        """Run the handler for one locked event inside a savepoint and record its
        outcome in ``conn``'s transaction (inline acceptance;
        :meth:`BatchRunner.process`)."""
        return await self.batches.process(conn, event, reports)

    # -- rows from the accept (a receiver in this process) ---------------------------

    def offer(self, batch: Sequence[NewDelivery]) -> int:
        """Take the new rows of an accept batch that the chains would take next
        (:meth:`_offer_room`): each goes in with its first attempt counted and held for
        this worker (:attr:`NewDelivery.held_until`), and runs when the batch's COMMIT
        returns (:meth:`settle`), without a claim's round trip and the claimer's wake-up
        before it. Nothing while the worker stops, a suspect runs alone, or this host's
        clock is refused (:class:`ClockGuard`); nothing on a store without
        ``starts_at_accept`` (SQLite: its worker runs claimed batches)."""
        if not self.store.db.starts_at_accept or self._stopping.is_set():
            return 0
        room = self._offer_room()
        if room <= 0 or self.box.clock_guard.refusing:
            return 0
        until = self.clock.now() + self.claim_hold
        taken = 0
        for d in batch:
            if taken == room:
                break
            if not d.ignored:
                d.held_until = until
                taken += 1
        self._reserved += taken
        return taken

    def settle(
        self, batch: Sequence[NewDelivery], outcomes: Sequence[AcceptOutcome] | None
    ) -> None:
        """After the insert of a batch :meth:`offer` took rows of: the rows inserted
        (``accepted``) go to the chains as a claim's started rows would, their hold
        kept while they run; a duplicate or a conflict frees its room. ``outcomes`` is
        ``None`` when the insert failed: if its COMMIT went through after all, its rows
        come back to any worker once their hold ends, as after a crash (suspects)."""
        held = [i for i, d in enumerate(batch) if d.held_until is not None]
        self._reserved -= len(held)
        if outcomes is None:
            return
        events = [
            InboxEvent.from_delivery(batch[i], outcomes[i].inbox_id, attempts=1)
            for i in held
            if outcomes[i].status == "accepted"
        ]
        if not events:
            return
        until = batch[held[0]].held_until
        assert until is not None
        run = _Batch(len(events))
        for event in events:
            job = self._job(event, run)
            job.attempt = 1
            self.queue.append(job)
        self._spawn_chains()
        self._spawn(self._hold_taken([e.id for e in events], until, run))

    async def _hold_taken(self, ids: list[int], until: float, run: _Batch) -> None:
        """Hold rows taken from the accept until they have run, as :meth:`run_once`
        does a claim's, and log a failure of theirs as a claim's."""
        try:
            async with self.claimer.holding(ids, until):
                await run.wait()
        except Exception as exc:  # the database went away: the rows come back
            log.warning("worker_batch_failed", worker=self.name, error=short_error(exc))

    def _offer_room(self) -> int:
        """How many rows of an accept batch this worker takes: up to one group per
        chain waiting in :attr:`_ready` (less those a claim or an offer in flight
        counts), so that a row taken waits at most for one transaction of a chain,
        and chains still take whole groups. Taking only what free chains would start
        at once (:meth:`_room`) started chains with groups of one or two rows: p50
        10.4 and 9.3 ms at 1,200/s, against 9.0 and 7.0 taking nothing and 4.8 and
        5.9 ms this way (bench/README.md)."""
        if not self._grouped or self.queue.isolating:
            return 0
        return max(0, self.concurrency * self.group - len(self.queue) - self._reserved)

    def _room(self) -> int:
        """How many claimed events would start at once (PostgreSQL groups): the groups
        free chains would run, less the events waiting for a chain and those counted
        by a claim in flight."""
        if not self._grouped or self.queue.isolating:
            return 0
        free = (self.concurrency - self._chains) * self.group
        return max(0, free - len(self.queue) - self._reserved)

    async def _run_claim(self, claim: Claim) -> None:
        if self.group == 1 or self._grouped:
            batch = _Batch(len(claim.ids) + len(claim.suspects))
            started = claim.started
            for i in sorted(claim.ids, key=lambda i: i not in started):  # counted first
                job = self._job(claim.events[i], batch)
                if i in started:
                    job.attempt = claim.events[i].attempts
                self.queue.append(job)
            self._spawn_chains()
            for inbox_id in claim.suspects:
                self._spawn(self._run_suspect(self._job(claim.events[inbox_id], batch)))
            await batch.wait()
        else:
            groups = [claim.ids[i : i + self.group] for i in range(0, len(claim.ids), self.group)]
            results = await asyncio.gather(
                *(self._process_group(ids, claim.events) for ids in groups),
                *(self._process_suspect(inbox_id, claim.events) for inbox_id in claim.suspects),
                return_exceptions=True,
            )
            failures = [r for r in results if isinstance(r, BaseException)]
            if failures:
                raise failures[0]

    def _job(self, event: InboxEvent, batch: _Batch) -> _Job:
        """A claimed event for the chains. A plain-def handler's event runs in a
        synchronous transaction of its own, never in a group."""
        return _Job(event, batch, alone=self.lookup.threaded(event) is not None)

    async def drain(self) -> None:
        """Wait (30 s at most) for chains still running: :meth:`run_once` returns once
        its batch is done, while the chain that ran its last event may still be giving
        its connection back (:meth:`Relaybox.close` calls this before closing the
        store)."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=30.0)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- chains: groups or one event per transaction (PostgreSQL) ---------------------

    def _spawn_chains(self) -> None:
        while self.queue.jobs and self._chains < self.concurrency and not self.queue.isolating:
            self._chains += 1
            self._spawn(self._chain())

    async def _chain(self) -> None:
        """Runs claimed events one after another on one connection, at most
        ``concurrency`` chains at once. Each event's COMMIT also counts the attempt of
        the event this chain runs next (it starts right then): one round trip for both,
        and no event is charged while it waits for its turn."""
        try:
            async with self._slots:
                await self._run_chain(self.queue.take())
        finally:
            self._chains -= 1
            self._spawn_chains()

    async def _run_chain(self, job: _Job | None) -> None:
        while job is not None:
            if job.attempt is None and not self.chains.in_group(job):
                # Counted with no connection held (SQLite's pool has one connection);
                # chains starting together share one statement.
                try:
                    job.attempt = await self.chains.marks.start(job.event.id)
                except Exception as exc:
                    job.batch.finish(exc)
                    return
                if job.attempt is None:  # no longer pending: completed by a late worker
                    job.batch.finish()
                    job = self.queue.take()
                    continue
            threaded = self.lookup.threaded(job.event)
            if threaded is not None:  # its own sync transaction: no async connection held
                assert job.attempt is not None
                job = await self.chains.run_threaded(job, job.attempt, threaded)
                continue
            try:
                async with self.store.db.connection() as conn:
                    while job is not None:
                        if self.chains.in_group(job):
                            job = await self.chains.run_group(conn, job)
                        elif job.attempt is not None and self.lookup.threaded(job.event) is None:
                            job = await self.chains.run_job(conn, job)
                        else:
                            break
            except Exception as exc:  # no connection: the row comes back after the hold
                if job is not None:
                    job.batch.finish(exc)
                return

    async def _run_suspect(self, job: _Job) -> None:
        """A row whose last attempt never finished may be what killed its worker: run
        it with nothing else in flight in this process, so that if it kills this one
        too, only its own attempt is charged."""
        self.queue.isolating += 1
        try:
            async with self._isolation:
                for _ in range(self.concurrency):
                    await self._slots.acquire()
                try:
                    await self._run_chain(job)  # takes no other job: _isolating is set
                finally:
                    for _ in range(self.concurrency):
                        self._slots.release()
        except Exception as exc:
            job.batch.finish(exc)
        finally:
            self.queue.isolating -= 1
            self._spawn_chains()

    async def _process_group(self, ids: list[int], events: dict[int, InboxEvent]) -> None:
        """At most ``concurrency`` of these run at once."""
        async with self._slots:
            await self.batches.start_and_process(ids, events)

    async def _process_suspect(self, inbox_id: int, events: dict[int, InboxEvent]) -> None:
        """A suspect runs alone (see :meth:`_run_suspect`)."""
        async with self._isolation:
            for _ in range(self.concurrency):
                await self._slots.acquire()
            try:
                await self.batches.start_and_process([inbox_id], events)
            finally:
                for _ in range(self.concurrency):
                    self._slots.release()
