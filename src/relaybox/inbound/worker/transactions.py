"""The chains' transaction runner (:class:`ChainRunner`, PostgreSQL, and one event per
transaction anywhere): one event per transaction (:meth:`ChainRunner.run_job`), groups
of events per transaction, run optimistically (no savepoint) or carefully (a savepoint
per event) (:meth:`ChainRunner.run_group`), and a chain's plain-def event
(:meth:`ChainRunner.run_threaded`). SQLite's claimed batches are
:mod:`~relaybox.inbound.worker.batches`'."""

from __future__ import annotations

import asyncio
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox.inbound.worker.context import Context, Registration
from relaybox.inbound.worker.handlers import HandlerLookup, HandlerRunner
from relaybox.inbound.worker.outcomes import (
    _ABORTED,
    _IN_FAILED_TRANSACTION,
    OutcomeRecorder,
    _contended,
    _NotOurs,
    _Outcome,
    _Plan,
    _Regroup,
    _RolledBack,
    _sqlstate_in,
)
from relaybox.inbound.worker.queue import ReadyQueue, StartMarks, _Job
from relaybox.inbound.worker.threaded import ThreadedRunner
from relaybox.log import short_error
from relaybox.store.inbox_rows import NewOperation

if TYPE_CHECKING:
    from relaybox.clock import Clock
    from relaybox.inbound.worker.context import Hooks
    from relaybox.store import Store

log = structlog.get_logger("relaybox.worker")

__all__ = ["ChainRunner"]

_CAREFUL_GROUPS = 16
"""Groups run with a savepoint per event after a handler failed in a group without."""


@dataclass(slots=True)
class _Ran:
    """What a group's handlers came to: the events ``done`` and those ``failed`` (both
    recorded in the group's transaction), and those that must run ``alone`` (a handler
    gave up waiting for a lock: it runs again after the COMMIT, in a group of its own)."""

    done: list[tuple[_Job, Context, _Outcome]] = field(default_factory=list)
    failed: list[tuple[_Job, Context, _Outcome]] = field(default_factory=list)
    alone: list[_Job] = field(default_factory=list)


@dataclass(eq=False)
class ChainRunner:
    """Runs the events a chain takes from ``queue`` on the chain's connection. It
    holds what it calls: ``marks`` (counting attempts), the ``handlers``' runner, the
    ``threaded`` runner for plain defs, the outcome ``recorder``. ``group``: events per
    transaction; ``grouped``: whether the store runs groups (PostgreSQL);
    ``savepoints``: a savepoint per event always; ``worker``: the worker's name, in
    log lines. A chain's caller starts chains again once it returns: nothing here
    calls back."""

    store: Store
    clock: Clock
    hooks: Hooks
    _: KW_ONLY
    queue: ReadyQueue
    marks: StartMarks
    lookup: HandlerLookup
    handlers: HandlerRunner
    threaded: ThreadedRunner
    recorder: OutcomeRecorder
    group: int
    grouped: bool
    savepoints: bool
    worker: str
    # A group runs its handlers without savepoints until one fails (run_group);
    # then the next _CAREFUL_GROUPS groups take a savepoint per event.
    _careful: int = field(default=0, init=False, repr=False)

    def in_group(self, job: _Job) -> bool:
        """Whether ``job`` runs in a group (PostgreSQL), whose start counts the
        attempts of all its fresh events in one statement (:meth:`_start_group`)."""
        return self.grouped and not job.alone and self.lookup.threaded(job.event) is None

    async def run_threaded(
        self, job: _Job, attempt: int, registration: Registration
    ) -> _Job | None:
        """A chain's plain-def event (:meth:`ThreadedRunner.run`); returns the chain's
        next job, its attempt not counted yet."""
        try:
            await self.threaded.run(job.event, attempt, registration)
        except Exception as exc:
            # The COMMIT's answer may be lost: the row comes back after the hold, and
            # its business keys say what happened.
            log.warning(
                "worker_commit_uncertain",
                worker=self.worker,
                ids=[job.event.id],
                error=short_error(exc),
            )
            job.batch.finish(exc)
            return None
        job.batch.finish()
        return self.queue.take()

    async def run_job(self, conn: AsyncConnection, job: _Job) -> _Job | None:
        """One event, one transaction, no savepoint: a failure rolls the whole
        transaction back (the effect), then a second short transaction records the
        outcome, only while the row is still pending.

        Its attempt is counted already. Returns the next job for this chain (counted
        with this COMMIT), or ``None``. A database failure ends the chain; the job's
        row comes back after the hold."""
        store = self.store
        clock = self.clock
        attempt = job.attempt
        assert attempt is not None
        event = job.event
        threaded = self.lookup.threaded(event)
        if threaded is not None:  # a plain def: its own synchronous transaction
            return await self.run_threaded(job, attempt, threaded)
        object.__setattr__(event, "attempts", attempt)  # this worker's own copy of the row
        started = clock.now()
        nxt: _Job | None = None
        folded = committed = False  # nxt's start rides on this COMMIT; it went through
        reports: list[_Plan] = []
        try:
            try:
                async with store.inbox.event_transaction(conn):
                    if not await store.inbox.begin(conn, event.id, attempt=attempt, now=started):
                        raise _NotOurs
                    if job.failed is not None:  # failed in a group: recorded, not run again
                        ctx, outcome = job.failed
                    else:
                        ctx, outcome = await self.handlers.run(conn, event, savepoint=False)
                    if outcome.kind != "done":
                        raise _RolledBack(ctx, outcome)
                    await store.inbox.outbox_insert_rows(conn, ctx.outbox_rows, now=clock.now())
                    await self.recorder.record(conn, event, ctx, outcome, started, reports)
                    await self.hooks.fire("before_commit", [event.id])
                    nxt, folded = await self._start_next(conn)
                committed = True
                if ctx.outbox_created:
                    store.db.wake("outbox")
            except _RolledBack as failed:
                reports.clear()
                async with conn.begin():
                    for locked in await store.inbox.lock(conn, [event.id]):
                        await self.recorder.record(
                            conn, locked, failed.ctx, failed.outcome, started, reports
                        )
                    nxt, folded = await self._start_next(conn)
                committed = True
            except _NotOurs:
                # Completed meanwhile, or started again by another worker whose hold
                # ran out: nothing to do here.
                job.batch.finish()
                return self.queue.take()
            self.recorder.report(reports)
            if nxt is not None and folded:
                nxt.attempt = nxt.event.attempts + 1
            await self.hooks.fire("after_commit", [event.id])
        except Exception as exc:
            # The COMMIT's answer may be lost: nothing is applied again here. The row
            # comes back after the hold, and its business keys say what happened.
            log.warning(
                "worker_commit_uncertain",
                worker=self.worker,
                ids=[event.id],
                error=short_error(exc),
            )
            job.batch.finish(exc)
            if nxt is not None:
                if folded and not committed:
                    nxt.attempt = None  # counted or not: inbox_start says which
                self.queue.put_back([nxt])
            return None
        job.batch.finish()
        return nxt

    async def run_group(self, conn: AsyncConnection, first: _Job) -> _Job | None:
        """Several events in one transaction (PostgreSQL, ``group`` > 1): one COMMIT
        (one WAL flush) for all of them.

        Its BEGIN locks the rows, fenced by the attempts this worker counted, with a
        50 ms ``lock_timeout``: a group holds its events' row locks (a shared balance,
        say) until its COMMIT, so waiting on another group gives up quickly instead of
        deadlocking. The handlers run one after another with no savepoint: a round trip
        per event saved. When one fails, the group rolls back and runs again with a
        savepoint per event (:meth:`_run_careful`), the failed event's outcome kept
        rather than its handler run again; so do the next ``_CAREFUL_GROUPS`` groups,
        which bounds the handlers run twice while failures go on. The COMMIT carries
        the outbox rows, the completions and the next group's start marks. Returns the
        next job for this chain."""
        store = self.store
        jobs = await self._start_group(first)
        if not jobs:
            return self.queue.take()
        careful = self.savepoints or self._careful > 0 or any(j.failed for j in jobs)
        if careful and self._careful > 0:
            self._careful -= 1
        started = self.clock.now()
        for job in jobs:
            object.__setattr__(job.event, "attempts", job.attempt)
        ids = [job.event.id for job in jobs]
        ran = _Ran()
        nxt: list[_Job] = []
        reports: list[_Plan] = []
        try:
            try:
                try:
                    async with store.inbox.event_transaction(conn):
                        # (id, attempt): each event's attempts were set to its job's.
                        pairs = [(job.event.id, job.event.attempts) for job in jobs]
                        # Declared business keys are claimed with the BEGIN, all or
                        # none; with a savepoint per event a failing event's key would
                        # outlive its rollback, so careful groups ask per ctx.once().
                        plain = careful or any(job.plain for job in jobs)
                        contexts = (
                            {}
                            if plain
                            else self.handlers.declared(conn, (job.event for job in jobs))
                        )
                        claims = [
                            NewOperation(
                                c._key,
                                c._fingerprint,
                                c.event.id,
                                c.event.source,
                                c.event.tenant,
                                started,
                            )
                            for c in contexts.values()
                            if c._key is not None
                        ]
                        try:
                            ours = await store.inbox.lock_group(
                                conn, pairs, now=started, claims=claims
                            )
                        except Exception as exc:
                            if _contended(exc):
                                raise _Regroup("the rows' locks are taken") from exc
                            raise
                        if not ours and claims:  # a row, or a key: ask again, plainly
                            raise _Regroup("a declared business key was taken", plain=True)
                        if not ours:
                            raise _Regroup("a row is no longer this worker's")
                        for c in contexts.values():
                            c._claimed = c._key is not None
                        if careful:
                            await self._run_careful(conn, jobs, ran)
                        else:
                            await self._run_optimistic(conn, jobs, ran, contexts)
                        for job, ctx, outcome in ran.failed + ran.done:
                            await self.recorder.record(
                                conn, job.event, ctx, outcome, started, reports
                            )
                        await self.hooks.fire("before_commit", ids)
                        nxt = self.queue.take_group(self.group)
                        await store.inbox.finish_group_on_commit(
                            conn,
                            [job.event.id for job, _, _ in ran.done],
                            [(j.event.id, j.event.attempts) for j in nxt if j.attempt is None],
                            [row for _, ctx, _ in ran.done for row in ctx.outbox_rows],
                            now=self.clock.now(),
                            released=[c._key for c in contexts.values() if c._claimed and c._key],
                        )
                except _Regroup:
                    raise
                except Exception as exc:
                    # A handler without a savepoint swallowed a database error: the
                    # COMMIT's statements find the transaction aborted, nothing applied.
                    if careful or not _sqlstate_in(exc, _IN_FAILED_TRANSACTION):
                        raise
                    self.queue.put_back(nxt)
                    nxt = []
                    raise _Regroup("a handler went on after a database error", again=True) from exc
                for job in nxt:  # their start marks rode on the COMMIT
                    if job.attempt is None:
                        job.attempt = job.event.attempts + 1
            except _Regroup as regroup:
                if regroup.plain:
                    log.debug(
                        "worker_group_plain", worker=self.worker, ids=ids, reason=str(regroup)
                    )
                    for job in jobs:
                        job.plain = True
                    self.queue.put_back(jobs)
                    return self.queue.take()
                if regroup.again:
                    # Run again as a careful group, this chain first.
                    log.debug(
                        "worker_group_again", worker=self.worker, ids=ids, reason=str(regroup)
                    )
                    self._careful = _CAREFUL_GROUPS
                    self.queue.put_back(sorted(jobs, key=lambda job: job.alone))  # alone: last
                    return self.queue.take()
                log.debug("worker_group_alone", worker=self.worker, ids=ids, reason=str(regroup))
                for job in jobs:
                    job.alone = True
                self.queue.put_back(jobs)
                return self.queue.take()
            self.recorder.report(reports)
            if any(ctx.outbox_created for _, ctx, _ in ran.done):
                store.db.wake("outbox")
            await self.hooks.fire("after_commit", ids)
        except Exception as exc:
            log.warning(
                "worker_commit_uncertain", worker=self.worker, ids=ids, error=short_error(exc)
            )
            for job in jobs:
                job.batch.finish(exc)
            # Start marks that rode on a COMMIT whose answer was lost: counted or not,
            # inbox_start says which.
            self.queue.put_back(nxt)
            return None
        again = {id(job) for job in ran.alone}
        for job in jobs:
            job.failed = None
            if id(job) not in again:
                job.batch.finish()
            else:
                job.alone = True
        # This chain runs next: the events that must run alone (started, locked until
        # this COMMIT), then the group started with it.
        self.queue.put_back(ran.alone + nxt)
        return self.queue.take()

    async def _start_group(self, first: _Job) -> list[_Job]:
        """``first`` and up to ``group - 1`` more claimed events, their attempts counted:
        those not counted yet (``first`` too, when a chain starts with it) in one
        statement, shared with chains starting together. Events no longer pending, or
        whose count failed, are finished and left out."""
        jobs = [first, *self.queue.take_group(self.group - 1)]
        fresh = [job for job in jobs if job.attempt is None]  # not started yet
        if fresh:
            marks = await asyncio.gather(
                *(self.marks.start(job.event.id) for job in fresh), return_exceptions=True
            )
            for job, mark in zip(fresh, marks, strict=True):
                if isinstance(mark, BaseException):
                    job.batch.finish(mark)
                elif mark is None:  # no longer pending
                    job.batch.finish()
                else:
                    job.attempt = mark
        return [job for job in jobs if job.attempt is not None]

    async def _run_optimistic(
        self,
        conn: AsyncConnection,
        jobs: list[_Job],
        ran: _Ran,
        contexts: dict[int, Context],
    ) -> None:
        """The group's handlers one after another, no savepoint. The first failure
        rolls the group back (:class:`_Regroup`): its outcome is kept for the careful
        run unless the failure may not be its own (a transaction that an earlier
        handler left aborted); a handler that gave up waiting for a lock runs alone.
        An event with no handler ran nothing: it is recorded in the group.
        ``contexts``: by id, the contexts of the events whose declared business keys
        the BEGIN claimed; ``ran`` collects the outcomes."""
        for job in jobs:
            ctx, outcome = await self.handlers.run(
                conn, job.event, savepoint=False, grouped=True, ctx=contexts.get(job.event.id)
            )
            if outcome.kind == "done":
                ran.done.append((job, ctx, outcome))
                continue
            if outcome.kind == "unhandled":
                ran.failed.append((job, ctx, outcome))
                continue
            if outcome.kind == "contended":
                job.alone = True  # it will wait for the lock again: no time limit there
            elif not outcome.aborted:
                job.failed = (ctx, outcome)
            raise _Regroup(f"a handler failed ({outcome.kind})", again=True)

    async def _run_careful(self, conn: AsyncConnection, jobs: list[_Job], ran: _Ran) -> None:
        """Each handler in a savepoint (``RELEASE`` of the previous one and the next
        ``SAVEPOINT`` share a round trip). A failing handler is rolled back to its
        savepoint and its outcome recorded in the group, as in a transaction of its
        own; a handler that gave up waiting for a lock (or lost a deadlock) is rolled
        back and runs again alone, where nothing times out. An event that failed in an
        earlier run of this group keeps that outcome. ``ran`` collects the outcomes."""
        store = self.store
        ran.failed.extend((job, *job.failed) for job in jobs if job.failed is not None)
        runs = [job for job in jobs if job.failed is None]

        async def savepoint(*, release: bool, again: bool = True) -> None:
            """Release the previous event's savepoint (it succeeded) and set the next
            one. A handler that went on after a database error left the transaction
            aborted: the RELEASE says so."""
            try:
                await store.inbox.savepoint(conn, release=release, again=again)
            except Exception as exc:
                if getattr(exc, "sqlstate", None) != "25P02" or not ran.done:
                    raise
                await store.inbox.rollback_to_savepoint(conn)
                job, ctx, _ = ran.done.pop()
                ran.failed.append((job, ctx, _Outcome("retry", _ABORTED)))

        for k, job in enumerate(runs):
            await savepoint(release=k > 0)
            ctx, outcome = await self.handlers.run(conn, job.event, savepoint=False, grouped=True)
            if outcome.kind == "done":
                ran.done.append((job, ctx, outcome))
                continue
            await store.inbox.rollback_to_savepoint(conn)
            if outcome.kind == "contended":
                log.debug(
                    "worker_group_alone",
                    worker=self.worker,
                    ids=[job.event.id],
                    reason=outcome.error,
                )
                ran.alone.append(job)
            else:
                ran.failed.append((job, ctx, outcome))
        if ran.done and ran.done[-1][0] is runs[-1]:
            await savepoint(release=True, again=False)

    async def _start_next(self, conn: AsyncConnection) -> tuple[_Job | None, bool]:
        """Take the next claimed event and count its attempt with this COMMIT; returns
        it and whether its count rides on this COMMIT."""
        nxt = self.queue.take()
        if nxt is None or nxt.attempt is not None:  # counted already (put back)
            return nxt, False
        await self.store.inbox.start_on_commit(
            conn, nxt.event.id, attempts=nxt.event.attempts, now=self.clock.now()
        )
        return nxt, True
