"""The transaction runners: one event per transaction (:meth:`Runners._run_job`),
PostgreSQL groups of events per transaction, run optimistically (no savepoint) or
carefully (a savepoint per event) (:meth:`Runners._run_group`), and SQLite's claimed
batch in one transaction with a savepoint per event (:meth:`Runners._process_batch`)."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox import tracing
from relaybox.errors import OperationConflict, PermanentError
from relaybox.inbound.worker.context import Context, Handler, Registration, process_attributes
from relaybox.inbound.worker.outcomes import (
    _ABORTED,
    _IN_FAILED_TRANSACTION,
    _contended,
    _NotOurs,
    _Outcome,
    _Regroup,
    _Report,
    _RolledBack,
    _sqlstate_in,
)
from relaybox.inbound.worker.threaded import Threaded
from relaybox.log import error_text, short_error
from relaybox.store import InboxEvent

if TYPE_CHECKING:
    from relaybox.inbound.worker.loop import _StartMarks

log = structlog.get_logger("relaybox.worker")

_CAREFUL_GROUPS = 16
"""Groups run with a savepoint per event after a handler failed in a group without."""


class _Batch:
    """One claim's events, run by whichever chains take them: ``run_once`` returns
    when all of them have finished, raising the first failure."""

    __slots__ = ("done", "failures", "left")

    def __init__(self, n: int) -> None:
        self.left = n
        self.failures: list[BaseException] = []
        self.done = asyncio.get_running_loop().create_future()
        if n == 0:
            self.done.set_result(None)

    def finish(self, failure: BaseException | None = None) -> None:
        if failure is not None:
            self.failures.append(failure)
        self.left -= 1
        if self.left == 0 and not self.done.done():
            self.done.set_result(None)

    async def wait(self) -> None:
        await self.done
        if self.failures:
            raise self.failures[0]


@dataclass(slots=True)
class _Job:
    event: InboxEvent  # as claimed
    batch: _Batch
    attempt: int | None = None  # set once the attempt is counted (started)
    alone: bool = False  # its group rolled back: it runs in a transaction of its own
    # Its handler failed in a group that then rolled back: the outcome to record (the
    # handler does not run again for this attempt).
    failed: tuple[Context, _Outcome] | None = None
    # Its group's BEGIN could not claim every declared business key (one existed, or
    # two events named one): its next group asks with a round trip per ctx.once().
    plain: bool = False


class HandlerTimeout(Exception):
    """A handler ran past ``worker.handler_timeout``: a transient failure."""


class Runners(Threaded):
    """The worker's transaction runners (a base of :class:`~relaybox.inbound.worker.loop.Worker`,
    which owns the queue of claimed events and the chains that take from it)."""

    group: int
    savepoints: bool
    concurrency: int
    handler_timeout: float
    _careful: int
    _ready: deque[_Job]
    _isolating: int
    _marks: _StartMarks
    _handlers: dict[tuple[str, str], Registration | None]
    _handlers_known: int

    def _spawn_chains(self) -> None:
        raise NotImplementedError  # Worker: chains take the claimed events

    def _take(self) -> _Job | None:
        """The next claimed event, unless a suspect is waiting to run alone."""
        if self._isolating or not self._ready:
            return None
        return self._ready.popleft()

    async def _run_job(self, conn: AsyncConnection, job: _Job) -> _Job | None:
        """One event, one transaction, no savepoint: a failure rolls the whole
        transaction back (the effect), then a second short transaction records the
        outcome, only while the row is still pending.

        Its attempt is counted already. Returns the next job for this chain (counted
        with this COMMIT), or ``None``. A database failure ends the chain; the job's
        row comes back after the hold."""
        store = self.box.store
        clock = self.box.clock
        attempt = job.attempt
        assert attempt is not None
        event = job.event
        threaded = self._threaded(event)
        if threaded is not None:  # a plain def: its own synchronous transaction
            return await self._run_threaded_job(job, attempt, threaded)
        object.__setattr__(event, "attempts", attempt)  # this worker's own copy of the row
        started = clock.now()
        nxt: _Job | None = None
        folded = committed = False  # nxt's start rides on this COMMIT; it went through
        reports: list[_Report] = []
        try:
            try:
                async with store.inbox.event_transaction(conn):
                    if not await store.inbox.begin(conn, event.id, attempt=attempt, now=started):
                        raise _NotOurs
                    if job.failed is not None:  # failed in a group: recorded, not run again
                        ctx, outcome = job.failed
                    else:
                        ctx, outcome = await self._run(conn, event, savepoint=False)
                    if outcome.kind != "done":
                        raise _RolledBack(ctx, outcome)
                    await store.inbox.outbox_insert_rows(conn, ctx.outbox_rows, now=clock.now())
                    await self._record(conn, event, ctx, outcome, started, reports)
                    await self.hooks.fire("before_commit", [event.id])
                    nxt, folded = await self._start_next(conn)
                committed = True
                if ctx.outbox_created:
                    store.db.wake("outbox")
            except _RolledBack as failed:
                reports.clear()
                async with conn.begin():
                    for locked in await store.inbox.lock(conn, [event.id]):
                        await self._record(
                            conn, locked, failed.ctx, failed.outcome, started, reports
                        )
                    nxt, folded = await self._start_next(conn)
                committed = True
            except _NotOurs:
                # Completed meanwhile, or started again by another worker whose hold
                # ran out: nothing to do here.
                job.batch.finish()
                return self._take()
            self._report(reports)
            if nxt is not None and folded:
                nxt.attempt = nxt.event.attempts + 1
            await self.hooks.fire("after_commit", [event.id])
        except Exception as exc:
            # The COMMIT's answer may be lost: nothing is applied again here. The row
            # comes back after the hold, and its business keys say what happened.
            log.warning(
                "worker_commit_uncertain", worker=self.name, ids=[event.id], error=short_error(exc)
            )
            job.batch.finish(exc)
            if nxt is not None:
                if folded and not committed:
                    nxt.attempt = None  # counted or not: inbox_start says which
                self._ready.appendleft(nxt)
                self._spawn_chains()
            return None
        job.batch.finish()
        return nxt

    async def _run_group(self, conn: AsyncConnection, first: _Job) -> _Job | None:
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
        store = self.box.store
        jobs = await self._start_group(first)
        if not jobs:
            return self._take()
        careful = self.savepoints or self._careful > 0 or any(j.failed for j in jobs)
        if careful and self._careful > 0:
            self._careful -= 1
        started = self.box.clock.now()
        for job in jobs:
            object.__setattr__(job.event, "attempts", job.attempt)
        ids = [job.event.id for job in jobs]
        done: list[tuple[_Job, Context, _Outcome]] = []
        failed: list[tuple[_Job, Context, _Outcome]] = []
        alone: list[_Job] = []
        nxt: list[_Job] = []
        reports: list[_Report] = []
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
                        contexts = {} if plain else self._declared(conn, jobs)
                        claims = [
                            (c._key, c._fingerprint, c.event.id, c.event.source, c.event.tenant)
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
                            await self._run_careful(conn, jobs, done, failed, alone)
                        else:
                            await self._run_optimistic(conn, jobs, done, failed, contexts)
                        for job, ctx, outcome in failed:
                            await self._record(conn, job.event, ctx, outcome, started, reports)
                        for job, ctx, outcome in done:
                            await self._record(conn, job.event, ctx, outcome, started, reports)
                        await self.hooks.fire("before_commit", ids)
                        nxt = self._take_group(self.group)
                        await store.inbox.finish_group_on_commit(
                            conn,
                            [job.event.id for job, _, _ in done],
                            [(j.event.id, j.event.attempts) for j in nxt if j.attempt is None],
                            [row for _, ctx, _ in done for row in ctx.outbox_rows],
                            now=self.box.clock.now(),
                            released=[c._key for c in contexts.values() if c._claimed and c._key],
                        )
                except _Regroup:
                    raise
                except Exception as exc:
                    # A handler without a savepoint swallowed a database error: the
                    # COMMIT's statements find the transaction aborted, nothing applied.
                    if careful or not _sqlstate_in(exc, _IN_FAILED_TRANSACTION):
                        raise
                    self._put_back(nxt)
                    nxt = []
                    raise _Regroup("a handler went on after a database error", again=True) from exc
                for job in nxt:  # their start marks rode on the COMMIT
                    if job.attempt is None:
                        job.attempt = job.event.attempts + 1
            except _Regroup as regroup:
                if regroup.plain:
                    log.debug("worker_group_plain", worker=self.name, ids=ids, reason=str(regroup))
                    for job in jobs:
                        job.plain = True
                    self._put_back(jobs)
                    return self._take()
                if regroup.again:
                    # Run again as a careful group, this chain first.
                    log.debug("worker_group_again", worker=self.name, ids=ids, reason=str(regroup))
                    self._careful = _CAREFUL_GROUPS
                    self._put_back(sorted(jobs, key=lambda job: job.alone))  # alone: last
                    return self._take()
                log.debug("worker_group_alone", worker=self.name, ids=ids, reason=str(regroup))
                for job in jobs:
                    job.alone = True
                self._put_back(jobs)
                return self._take()
            self._report(reports)
            if any(ctx.outbox_created for _, ctx, _ in done):
                store.db.wake("outbox")
            await self.hooks.fire("after_commit", ids)
        except Exception as exc:
            log.warning(
                "worker_commit_uncertain", worker=self.name, ids=ids, error=short_error(exc)
            )
            for job in jobs:
                job.batch.finish(exc)
            # Start marks that rode on a COMMIT whose answer was lost: counted or not,
            # inbox_start says which.
            self._put_back(nxt)
            if nxt:
                self._spawn_chains()
            return None
        again = {id(job) for job in alone}
        for job in jobs:
            job.failed = None
            if id(job) not in again:
                job.batch.finish()
            else:
                job.alone = True
        # This chain runs next: the events that must run alone (started, locked until
        # this COMMIT), then the group started with it.
        self._put_back(alone + nxt)
        return self._take()

    async def _start_group(self, first: _Job) -> list[_Job]:
        """``first`` and up to ``group - 1`` more claimed events, their attempts counted:
        those not counted yet (``first`` too, when a chain starts with it) in one
        statement, shared with chains starting together. Events no longer pending, or
        whose count failed, are finished and left out."""
        jobs = [first, *self._take_group(self.group - 1)]
        fresh = [job for job in jobs if job.attempt is None]  # not started yet
        if fresh:
            marks = await asyncio.gather(
                *(self._marks.start(job.event.id) for job in fresh), return_exceptions=True
            )
            for job, mark in zip(fresh, marks, strict=True):
                if isinstance(mark, BaseException):
                    job.batch.finish(mark)
                elif mark is None:  # no longer pending
                    job.batch.finish()
                else:
                    job.attempt = mark
        return [job for job in jobs if job.attempt is not None]

    def _put_back(self, jobs: list[_Job]) -> None:
        """Return ``jobs`` to the front of the queue, in order."""
        for job in reversed(jobs):
            self._ready.appendleft(job)

    async def _run_optimistic(
        self,
        conn: AsyncConnection,
        jobs: list[_Job],
        done: list[tuple[_Job, Context, _Outcome]],
        failed: list[tuple[_Job, Context, _Outcome]],
        contexts: dict[int, Context],
    ) -> None:
        """The group's handlers one after another, no savepoint. The first failure
        rolls the group back (:class:`_Regroup`): its outcome is kept for the careful
        run unless the failure may not be its own (a transaction that an earlier
        handler left aborted); a handler that gave up waiting for a lock runs alone.
        An event with no handler ran nothing: it is recorded in the group.
        ``contexts``: by id, the contexts of the events whose declared business keys
        the BEGIN claimed."""
        for job in jobs:
            ctx, outcome = await self._run(
                conn, job.event, savepoint=False, grouped=True, ctx=contexts.get(job.event.id)
            )
            if outcome.kind == "done":
                done.append((job, ctx, outcome))
                continue
            if outcome.kind == "unhandled":
                failed.append((job, ctx, outcome))
                continue
            if outcome.kind == "contended":
                job.alone = True  # it will wait for the lock again: no time limit there
            elif not outcome.aborted:
                job.failed = (ctx, outcome)
            raise _Regroup(f"a handler failed ({outcome.kind})", again=True)

    async def _run_careful(
        self,
        conn: AsyncConnection,
        jobs: list[_Job],
        done: list[tuple[_Job, Context, _Outcome]],
        failed: list[tuple[_Job, Context, _Outcome]],
        alone: list[_Job],
    ) -> None:
        """Each handler in a savepoint (``RELEASE`` of the previous one and the next
        ``SAVEPOINT`` share a round trip). A failing handler is rolled back to its
        savepoint and its outcome recorded in the group, as in a transaction of its
        own; a handler that gave up waiting for a lock (or lost a deadlock) is rolled
        back and runs again alone, where nothing times out. An event that failed in an
        earlier run of this group keeps that outcome."""
        store = self.box.store
        failed.extend((job, *job.failed) for job in jobs if job.failed is not None)
        runs = [job for job in jobs if job.failed is None]

        async def savepoint(*, release: bool, again: bool = True) -> None:
            """Release the previous event's savepoint (it succeeded) and set the next
            one. A handler that went on after a database error left the transaction
            aborted: the RELEASE says so."""
            try:
                await store.inbox.savepoint(conn, release=release, again=again)
            except Exception as exc:
                if getattr(exc, "sqlstate", None) != "25P02" or not done:
                    raise
                await store.inbox.rollback_to_savepoint(conn)
                job, ctx, _ = done.pop()
                failed.append((job, ctx, _Outcome("retry", _ABORTED)))

        for k, job in enumerate(runs):
            await savepoint(release=k > 0)
            ctx, outcome = await self._run(conn, job.event, savepoint=False, grouped=True)
            if outcome.kind == "done":
                done.append((job, ctx, outcome))
                continue
            await store.inbox.rollback_to_savepoint(conn)
            if outcome.kind == "contended":
                log.debug(
                    "worker_group_alone", worker=self.name, ids=[job.event.id], reason=outcome.error
                )
                alone.append(job)
            else:
                failed.append((job, ctx, outcome))
        if done and done[-1][0] is runs[-1]:
            await savepoint(release=True, again=False)

    def _take_group(self, most: int) -> list[_Job]:
        """Up to ``most`` claimed events for a group, stopping at one that runs alone."""
        taken: list[_Job] = []
        while len(taken) < most:
            job = self._take()
            if job is None:
                break
            if job.alone:
                self._ready.appendleft(job)
                break
            taken.append(job)
        return taken

    async def _start_next(self, conn: AsyncConnection) -> tuple[_Job | None, bool]:
        """Take the next claimed event and count its attempt with this COMMIT; returns
        it and whether its count rides on this COMMIT."""
        nxt = self._take()
        if nxt is None or nxt.attempt is not None:  # counted already (put back)
            return nxt, False
        await self.box.store.inbox.start_on_commit(
            conn, nxt.event.id, attempts=nxt.event.attempts, now=self.box.clock.now()
        )
        return nxt, True

    # -- several events per transaction (SQLite) --------------------------------------

    async def _start_and_process(self, ids: list[int], events: dict[int, InboxEvent]) -> None:
        # The attempt is counted as the events start, not at the claim: rows still
        # waiting for a slot are not charged if the process dies meanwhile.
        started = await self.box.store.inbox.start(ids, self.box.clock.now())
        ids = [i for i in ids if i in started]
        if not ids:
            return
        # Plain-def handlers run in synchronous transactions of their own, after the
        # batch (one writer: never while the batch holds the write lock).
        threaded = {i: r for i in ids if (r := self._threaded(events[i])) is not None}
        batch = [i for i in ids if i not in threaded]
        if batch:
            await self._process_batch(batch)
        await self._run_threaded_events(threaded, started, events)

    async def _process_batch(self, ids: list[int]) -> None:
        """Several events in one transaction, each in a savepoint (SQLite: one
        COMMIT, one fsync, for the whole group)."""
        store = self.box.store
        try:
            async with store.transaction() as conn:
                events = await store.inbox.lock(conn, ids)
                done: list[int] = []
                created = False
                reports: list[_Report] = []
                for event in events:
                    outcome = await self.process(conn, event, reports)
                    if outcome.kind == "done":
                        done.append(event.id)
                    created = created or outcome.outbox_created
                if done:
                    await store.inbox.complete(conn, done, self.box.clock.now())
                await self.hooks.fire("before_commit", [e.id for e in events])
            self._report(reports)
            if created:
                store.db.wake("outbox")
            await self.hooks.fire("after_commit", [e.id for e in events])
        except Exception as exc:
            log.warning(
                "worker_commit_uncertain", worker=self.name, ids=ids, error=short_error(exc)
            )
            raise

    async def process(
        self, conn: AsyncConnection, event: InboxEvent, reports: list[_Report] | None = None
    ) -> _Outcome:
        """Run the handler for one locked event inside a savepoint, then record its
        outcome in the enclosing transaction. The caller marks ``done`` rows complete
        (and emits ``reports`` after its COMMIT, when given)."""
        started = self.box.clock.now()
        ctx, outcome = await self._run(conn, event, savepoint=True)
        await self._record(conn, event, ctx, outcome, started, reports)
        outcome.outbox_created = outcome.kind == "done" and ctx.outbox_created
        return outcome

    async def _run(
        self,
        conn: AsyncConnection,
        event: InboxEvent,
        *,
        savepoint: bool,
        grouped: bool = False,
        ctx: Context | None = None,
    ) -> tuple[Context, _Outcome]:
        """The handler of ``event`` in ``conn``'s transaction, traced as
        ``relaybox.process``: a child of the context the event was received in (and
        linked to it), current while the handler runs, so that what it publishes
        carries it."""
        if not tracing.enabled():
            return await self._run_handler(
                conn, event, savepoint=savepoint, grouped=grouped, ctx=ctx
            )
        with tracing.span(
            "relaybox.process",
            kind="consumer",
            parent=event.traceparent,
            attributes=process_attributes(event),
        ) as span:
            ctx, outcome = await self._run_handler(
                conn, event, savepoint=savepoint, grouped=grouped, ctx=ctx
            )
            if span.is_recording():
                span.set_attributes(
                    {"relaybox.outcome": outcome.kind, "relaybox.outbox_rows": len(ctx.outbox_rows)}
                )
                ctx._trace = tracing.traceparent()
            return ctx, outcome

    async def _run_handler(
        self,
        conn: AsyncConnection,
        event: InboxEvent,
        *,
        savepoint: bool,
        grouped: bool,
        ctx: Context | None,
    ) -> tuple[Context, _Outcome]:
        registration = self._registration(event.source, event.event_type)
        if ctx is None:
            ctx = Context(self.box, conn, event)
            if registration is not None:
                ctx._declare(registration)
        if registration is None:
            return ctx, _Outcome("unhandled", f"no handler for {event.source}/{event.event_type}")
        if registration.sync:  # plain defs run in threads (_run_threaded), not here
            return ctx, _Outcome("retry", "a plain def handler runs in a synchronous transaction")
        handler = cast(Handler, registration.handler)
        try:
            if savepoint:
                async with conn.begin_nested():
                    await self._call_async(handler, ctx)
                    await ctx._flush_session()
                    await self.box.store.inbox.outbox_insert_rows(
                        conn, ctx.outbox_rows, now=self.box.clock.now()
                    )
            else:
                await self._call_async(handler, ctx)
                await ctx._flush_session()
            return ctx, _Outcome("done")
        except OperationConflict as exc:
            return ctx, _Outcome("conflict", str(exc))
        except PermanentError as exc:
            return ctx, _Outcome("invalid", str(exc) or type(exc).__name__)
        except Exception as exc:
            if grouped and _contended(exc):
                return ctx, _Outcome("contended", error_text(exc))
            aborted = grouped and _sqlstate_in(exc, _IN_FAILED_TRANSACTION)
            return ctx, _Outcome("retry", error_text(exc), aborted=aborted)
        finally:
            await ctx._close_session()

    async def _call_async(self, handler: Handler, ctx: Context) -> None:
        """``handler(ctx)``, cancelled past ``worker.handler_timeout``: a handler that
        hangs (a call without a timeout of its own) fails its attempt as a transient
        error, and its transaction is rolled back, instead of holding its rows, their
        locks and a chain for good while the worker renews their hold."""
        limit = asyncio.timeout(self.handler_timeout)
        try:
            async with limit:
                await handler(ctx)
        except TimeoutError:
            if not limit.expired():
                raise  # the handler's own
            raise HandlerTimeout(
                f"the handler ran longer than worker.handler_timeout"
                f" ({self.handler_timeout:g} s) and was cancelled"
            ) from None

    def _registration(self, source: str, event_type: str) -> Registration | None:
        """``box.inbound.registration_for``, remembered until a handler is registered."""
        known = len(self.box.inbound.handlers)
        if known != self._handlers_known:
            self._handlers.clear()
            self._handlers_known = known
        key = (source, event_type)
        try:
            return self._handlers[key]
        except KeyError:
            found = self._handlers[key] = self.box.inbound.registration_for(source, event_type)
            return found

    def _declared(self, conn: AsyncConnection, jobs: list[_Job]) -> dict[int, Context]:
        """Contexts for the events whose handler declares a business key, by id."""
        contexts: dict[int, Context] = {}
        for job in jobs:
            registration = self._registration(job.event.source, job.event.event_type)
            if registration is not None and registration.business_key is not None:
                ctx = contexts[job.event.id] = Context(self.box, conn, job.event)
                ctx._declare(registration)
        return contexts
