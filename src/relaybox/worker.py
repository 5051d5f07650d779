"""Processing the inbox: claim due rows, run handlers, commit effect and completion together.

1. **claim** (one autocommit statement): hold up to ``batch`` due rows back
   ``claim_hold`` seconds, returning their columns; the same statement dead-letters
   rows whose budget was used up by workers that died (``exhausted``). Nothing is
   charged yet: a claimed row waiting for its turn costs no attempt if the process dies.
2. **start**: an attempt is counted (``attempts + 1``, ``started_at``) and committed as
   the event starts, before its handler runs, so an event that kills its worker
   (segfault, SIGKILL, OOM) still uses its budget. Events that start together share one
   statement; on PostgreSQL the next event of a connection is started by the previous
   event's COMMIT itself (the same round trip), right as it starts.
3. **process**, PostgreSQL: a group of events (``group``, 16 by default) per
   transaction, at most ``concurrency`` groups at once: one COMMIT, one WAL flush, for
   the group. Its BEGIN locks the rows (fenced by the attempts counted in 2); the
   handlers run one after another, and their outbox rows, the completions and the
   next group's start marks go with the COMMIT. When a handler fails, the group rolls
   back and runs again with a savepoint per event (so do the next 16 groups): the
   failed event keeps its outcome, recorded in the group: transient errors reschedule
   it (backoff + jitter), a :class:`~relaybox.errors.PermanentError` sends it to dead
   letters as ``invalid``. The group gives up waiting for a row lock after 50 ms
   (another group holds it, or a deadlock): that event runs again alone. With
   ``group = 1`` an event is its own transaction and its BEGIN carries its
   completion. SQLite: the claimed batch in one transaction (one writer, one
   fsync), each event in a SAVEPOINT.

A row whose attempt started and never recorded an outcome comes back as a *suspect*
and runs with nothing else in flight in its process: a poison event charges only itself.
No remote call happens inside a transaction: handlers record outgoing actions in the
outbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from relaybox import projections
from relaybox.errors import OperationConflict, PermanentError
from relaybox.log import error_text, short_error
from relaybox.retry import Backoff
from relaybox.store import InboxEvent, OutboxRow

if TYPE_CHECKING:
    from relaybox.app import Relaybox

__all__ = ["Context", "Handler", "Hooks", "Outbox", "Registration", "Worker"]

log = structlog.get_logger("relaybox.worker")

Handler = Callable[["Context"], Awaitable[None]]


class Registration(NamedTuple):
    """A handler as registered (:meth:`Relaybox.handler`)."""

    source: str
    event_type: str
    handler: Handler
    business_key: Callable[[Context], str | None] | None = None
    fingerprint: str = ""


_PG_GROUP = 16
"""Events per transaction on PostgreSQL by default (``worker.group``)."""


class Outbox:
    """Outgoing actions recorded in the handler's transaction."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx

    async def add(self, channel: str, key: str, payload: Any) -> None:
        """Record an outgoing action, once per ``(channel, key)``: a key recorded
        before (by this event or any other) is left as it is. The row is written in
        the handler's transaction, with its COMMIT (on PostgreSQL in the COMMIT's own
        round trip), and delivered after it by the dispatcher, never before. A payload
        that is not JSON, or a channel or key that is not text, fails here."""
        for name, value in (("channel", channel), ("key", key)):
            if not isinstance(value, str) or "\x00" in value:
                raise TypeError(f"outbox {name} must be text without NUL characters")
            value.encode()  # lone surrogates cannot be stored: fail in the handler
        ctx = self._ctx
        event = ctx.event
        _check_channel(ctx.box, channel)
        ctx.outbox_rows.append((channel, key, json.dumps(payload), event.tenant, event.id))
        ctx.outbox_keys.append(f"{channel}:{key}")


_UNKNOWN_CHANNELS_SAID: set[str] = set()


def _check_channel(box: Relaybox, channel: str) -> None:
    """Say once per process (an error line) that rows are recorded for a channel no
    dispatcher of this app delivers: they stay pending until it is registered.
    ``relaybox doctor`` names them too."""
    if channel in _UNKNOWN_CHANNELS_SAID:
        return
    from relaybox.outbound.registry import outbound

    if channel not in outbound(box).channels:
        _UNKNOWN_CHANNELS_SAID.add(channel)
        log.error(
            "outbox_channel_not_registered",
            channel=channel,
            detail="its rows stay pending until a channel of that name is registered"
            f" (box.outbound.channel({channel!r}, ...))",
        )


@dataclass
class Context:
    """What a handler gets: the event and the transaction it runs in."""

    box: Relaybox
    conn: AsyncConnection
    event: InboxEvent
    business_keys: list[str] = field(default_factory=list)
    outbox_keys: list[str] = field(default_factory=list)
    outbox_rows: list[OutboxRow] = field(default_factory=list)  # written before COMMIT

    def __post_init__(self) -> None:
        self.outbox = Outbox(self)
        self._payload: Any = None
        # The handler's declared business key (Relaybox.handler), its fingerprint, the
        # error its function raised, and whether the group's BEGIN inserted it and no
        # ctx.once() has answered for it yet.
        self._key: str | None = None
        self._fingerprint = ""
        self._key_error: Exception | None = None
        self._claimed = False
        self._session: Any = None

    @property
    def session(self) -> AsyncSession:
        """An ORM ``AsyncSession`` on :attr:`conn`, in the same transaction: what it
        writes commits with the handler's business keys and the event's completion,
        or rolls back with them. relaybox flushes it when the handler returns; the
        handler does not commit it."""
        if self._session is None:
            # SQLAlchemy's default joining: the session works inside the handler's
            # transaction (or its savepoint) and never commits it.
            self._session = AsyncSession(bind=self.conn)
        return self._session

    async def _flush_session(self) -> None:
        if self._session is not None:
            await self._session.flush()

    async def _close_session(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    def _declare(self, registration: Registration) -> None:
        if registration.business_key is None:
            return
        self._fingerprint = registration.fingerprint
        try:
            key = registration.business_key(self)
        except Exception as exc:  # ctx.once() raises it, inside the handler
            self._key_error = exc
            return
        if key is not None and not isinstance(key, str):
            self._key_error = TypeError(f"business_key returned {type(key).__name__}, not str")
            return
        self._key = key

    @property
    def payload(self) -> Any:
        """The delivery's body as its source decodes it: JSON, or a dict for form,
        multipart and XML bodies (the raw bytes are ``ctx.event.payload``)."""
        if self._payload is None:
            event = self.event
            source = self.box.sources.get(event.source)
            if source is None or event.payload is None:
                self._payload = event.json()
            else:
                self._payload = source.decode(event.headers, event.payload)
        return self._payload

    @property
    def tenant(self) -> str | None:
        return self.event.tenant

    @property
    def outbox_created(self) -> bool:
        """Outbox rows were recorded: the worker wakes the dispatchers after COMMIT."""
        return bool(self.outbox_rows)

    async def once(
        self, business_key: str | None = None, *, fingerprint: str | None = None
    ) -> bool:
        """Record that the operation named by ``business_key`` happens now.

        Returns ``True`` the first time (apply the effect), ``False`` when the
        operation already happened (skip it). The UNIQUE key in the operations table
        decides, so two workers racing on one key cannot both get ``True``. Raises
        :class:`OperationConflict` when the key exists with another ``fingerprint``
        (a different operation is reusing this key). Keys are kept forever.

        Without ``business_key``: the key the handler's registration declares
        (``business_key=``, with its ``fingerprint``), which the worker may have
        claimed already with the group's BEGIN (then no round trip here).
        """
        if business_key is None:
            if self._key_error is not None:
                raise self._key_error
            if self._key is None:
                raise TypeError("ctx.once() needs a business key: the handler declares none")
            business_key = self._key
        if business_key == self._key:
            if fingerprint is None:
                fingerprint = self._fingerprint
            elif fingerprint != self._fingerprint:
                raise ValueError(
                    f"business key {business_key!r} is declared with fingerprint "
                    f"{self._fingerprint!r}, not {fingerprint!r}"
                )
            if self._claimed:  # inserted by the group's BEGIN: the first time
                self._claimed = False
                self.business_keys.append(business_key)
                return True
        elif fingerprint is None:
            fingerprint = ""
        created, stored = await self.box.store.operation_insert(
            self.conn,
            business_key=business_key,
            fingerprint=fingerprint,
            inbox_id=self.event.id,
            source=self.event.source,
            tenant=self.event.tenant,
            now=self.box.clock.now(),
        )
        self.business_keys.append(business_key)
        if not created and stored != fingerprint:
            raise OperationConflict(business_key, stored, fingerprint)
        return created

    async def project(
        self, resource_key: str, version: str | int | None, state: Any, **options: Any
    ) -> bool:
        """Write ``state`` as ``resource_key``'s current state only if ``version`` is
        newer than the stored one; a stale event is marked superseded and still
        completes (:mod:`relaybox.projections`)."""
        return await projections.project(self, resource_key, version, state, **options)


class Hooks:
    """Points where tests wait or inject faults (a SIGKILL before or after COMMIT,
    a lost commit answer). Empty, and free, in production."""

    def __init__(self) -> None:
        self.before_commit: list[Callable[[list[int]], Awaitable[None]]] = []
        self.after_commit: list[Callable[[list[int]], Awaitable[None]]] = []

    async def fire(self, name: str, ids: list[int]) -> None:
        for hook in getattr(self, name):
            await hook(ids)


@dataclass
class _Outcome:
    kind: str  # done | retry | invalid | exhausted | conflict | unhandled | contended
    error: str | None = None
    outbox_created: bool = False  # wake the dispatchers once this commits
    aborted: bool = False  # the transaction was aborted already (maybe by another handler)


class _NotOurs(Exception):
    """The row is no longer pending at the attempt this worker started."""


class _RolledBack(Exception):
    """Leaves the event's transaction so that its effect rolls back."""

    def __init__(self, ctx: Context, outcome: _Outcome) -> None:
        self.ctx = ctx
        self.outcome = outcome


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


_Report = tuple[str, str, str | None, dict[str, Any]]
"""A recorded outcome's log line and metric: source, kind, error, log fields."""


class _Regroup(Exception):
    """A group's transaction rolls back. ``again``: the group runs again with a
    savepoint per event (a handler failed in a group without); otherwise every event
    runs again, each in a transaction of its own."""

    def __init__(self, reason: str, *, again: bool = False, plain: bool = False):
        super().__init__(reason)
        self.again = again
        self.plain = plain


_ABORTED = "the handler went on after a database error: PostgreSQL had aborted its transaction"

_CONTENDED = frozenset({"55P03", "40P01"})  # lock_not_available, deadlock_detected
_IN_FAILED_TRANSACTION = frozenset({"25P02"})

_CAREFUL_GROUPS = 16
"""Groups run with a savepoint per event after a handler failed in a group without."""


def _sqlstate_in(exc: BaseException, states: frozenset[str]) -> bool:
    """Whether PostgreSQL's error behind ``exc`` has one of ``states``."""
    seen: BaseException | None = exc
    for _ in range(8):  # the driver's error, wrapped by SQLAlchemy, maybe by the handler
        if seen is None:
            return False
        for candidate in (seen, getattr(seen, "orig", None)):
            if getattr(candidate, "sqlstate", None) in states:
                return True
        seen = seen.__cause__ or seen.__context__
    return False


def _contended(exc: BaseException) -> bool:
    """A lock wait gave up (a group's lock_timeout) or PostgreSQL broke a deadlock:
    nothing is wrong with the event; it runs again in a transaction of its own."""
    return _sqlstate_in(exc, _CONTENDED)


class _StartMarks:
    """Start marks of events that start together, in one statement: whoever asks
    while a mark is in flight goes in the next one (group commit)."""

    def __init__(self, box: Relaybox) -> None:
        self.box = box
        self._waiting: list[tuple[int, asyncio.Future[int | None]]] = []
        self._flusher: asyncio.Task[None] | None = None

    async def start(self, inbox_id: int) -> int | None:
        """Count an attempt on ``inbox_id``; its attempt number, or ``None`` when the
        row is no longer pending."""
        future: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self._waiting.append((inbox_id, future))
        if self._flusher is None:
            self._flusher = asyncio.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                try:
                    started = await self.box.store.inbox_start(
                        [i for i, _ in batch], self.box.clock.now()
                    )
                except Exception as exc:
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for inbox_id, future in batch:
                    if not future.done():
                        future.set_result(started.get(inbox_id))
        finally:
            self._flusher = None


class Worker:
    """Runs handlers for due inbox rows. ``run()`` loops until stopped;
    ``run_once()`` processes one batch (tests drive it with a frozen clock)."""

    def __init__(
        self,
        box: Relaybox,
        *,
        name: str | None = None,
        concurrency: int | None = None,
        batch: int | None = None,
        group: int | None = None,
        rng: random.Random | None = None,
    ) -> None:
        s = box.settings.worker
        self.box = box
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        sqlite = box.store.backend == "sqlite"
        # SQLite has one writer: concurrent transactions would only queue.
        self.concurrency = 1 if sqlite else (concurrency or s.concurrency)
        # A claim feeds every chain's groups: run_once waits for its whole batch, so
        # a batch of only concurrency x group rows would leave chains idle at its end.
        self.batch = batch or s.batch or (32 if sqlite else 128)
        # Events per transaction. PostgreSQL: a group of 16 per chain, one COMMIT (one
        # WAL flush) for all; a group holds its events' row locks (a shared balance,
        # say) until that COMMIT, so it gives up after 50 ms of waiting for a lock
        # (another group's, or a deadlock) and that event runs in a transaction of its
        # own (_run_group). SQLite: the whole claim, since its single writer serialises
        # anyway and one COMMIT (fsync) serves the batch.
        self.group = group or s.group or (self.batch if sqlite else _PG_GROUP)
        self._grouped = self.group > 1 and not sqlite  # chains run groups (PostgreSQL)
        # A group runs its handlers without savepoints until one fails (_run_group);
        # then the next _CAREFUL_GROUPS groups take a savepoint per event.
        self.savepoints = s.savepoints
        self._careful = 0
        self._slots = asyncio.Semaphore(self.concurrency)
        self._isolation = asyncio.Lock()
        self._isolating = 0  # suspects waiting to run alone: chains stop taking events
        self._ready: deque[_Job] = deque()  # claimed events waiting for a chain
        self._chains = 0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._marks = _StartMarks(box)
        self.poll_interval = s.poll_interval
        self.claim_hold = s.claim_hold
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
        self._handlers: dict[tuple[str, str], Registration | None] = {}
        self._handlers_known = -1  # registrations seen when _handlers was filled
        self._counters: dict[tuple[str, str], Any] = {}
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()

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

    async def _listen(self) -> Any:
        """Wake up on new rows (PostgreSQL LISTEN, SQLite's in-process signal); polling
        finds them anyway."""
        return await self.box.store.listen("inbox", self._wake)

    # -- one batch ------------------------------------------------------------

    async def run_once(self) -> int:
        """Claim and process one batch; return how many rows were claimed."""
        store = self.box.store
        now = self.box.clock.now()
        claim = await store.inbox_claim(
            now=now, limit=self.batch, max_attempts=self.backoff.max_attempts, hold=self.claim_hold
        )
        for inbox_id, source, account, event_id, attempts in claim.exhausted:
            self.box.metrics.processed.labels(source, "dead_exhausted").inc()
            log.error(
                "event_dead",
                reason="exhausted",
                inbox_id=inbox_id,
                event_key=[source, account, event_id],
                attempts=attempts,
                error="the worker died during its last attempt",
            )
        if not claim.ids and not claim.suspects:
            return len(claim.exhausted)
        stop_keeping = asyncio.Event()
        keeper = None
        if store.backend == "postgres":
            keeper = asyncio.create_task(
                self._keep_hold([*claim.ids, *claim.suspects], now + self.claim_hold, stop_keeping)
            )
        try:
            await self._run_claim(claim)
        finally:
            stop_keeping.set()
            if keeper is not None:
                await asyncio.gather(keeper, return_exceptions=True)
        return len(claim.ids) + len(claim.suspects) + len(claim.exhausted)

    async def _keep_hold(self, ids: list[int], until: float, stop: asyncio.Event) -> None:
        """While the claim runs, renew its rows' hold every third of ``claim_hold``
        (``inbox_keep_hold``): a row that waits its turn, or waits for a lock, longer
        than the hold does not come back to other workers as if this one had died (nor,
        its budget counted, go to dead letters as ``exhausted``). This process dying
        stops the renewals: its rows come back a hold later, as before."""
        held = [until]
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.claim_hold / 3)
            if stop.is_set():
                return
            until = self.box.clock.now() + self.claim_hold
            try:
                await self.box.store.inbox_keep_hold(ids, held, until)
            except Exception as exc:  # the database went away: the rows come back
                log.warning("worker_hold_failed", worker=self.name, error=short_error(exc))
                continue
            held.append(until)

    async def _run_claim(self, claim: Any) -> None:
        if self.group == 1 or self._grouped:
            batch = _Batch(len(claim.ids) + len(claim.suspects))
            self._ready.extend(_Job(claim.events[i], batch) for i in claim.ids)
            self._spawn_chains()
            for inbox_id in claim.suspects:
                self._spawn(self._run_suspect(_Job(claim.events[inbox_id], batch)))
            await batch.wait()
        else:
            groups = [claim.ids[i : i + self.group] for i in range(0, len(claim.ids), self.group)]
            results = await asyncio.gather(
                *(self._process_group(ids) for ids in groups),
                *(self._process_suspect(inbox_id) for inbox_id in claim.suspects),
                return_exceptions=True,
            )
            failures = [r for r in results if isinstance(r, BaseException)]
            if failures:
                raise failures[0]

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
        while self._ready and self._chains < self.concurrency and not self._isolating:
            self._chains += 1
            self._spawn(self._chain())

    def _take(self) -> _Job | None:
        """The next claimed event, unless a suspect is waiting to run alone."""
        if self._isolating or not self._ready:
            return None
        return self._ready.popleft()

    async def _chain(self) -> None:
        """Runs claimed events one after another on one connection, at most
        ``concurrency`` chains at once. Each event's COMMIT also counts the attempt of
        the event this chain runs next (it starts right then): one round trip for both,
        and no event is charged while it waits for its turn."""
        try:
            async with self._slots:
                await self._run_chain(self._take())
        finally:
            self._chains -= 1
            self._spawn_chains()

    async def _run_chain(self, job: _Job | None) -> None:
        while job is not None:
            if job.attempt is None:
                # Counted with no connection held (SQLite's pool has one connection);
                # chains starting together share one statement.
                try:
                    job.attempt = await self._marks.start(job.event.id)
                except Exception as exc:
                    job.batch.finish(exc)
                    return
                if job.attempt is None:  # no longer pending: completed by a late worker
                    job.batch.finish()
                    job = self._take()
                    continue
            try:
                async with self.box.store.engine.connect() as conn:
                    while job is not None and job.attempt is not None:
                        if self._grouped and not job.alone:
                            job = await self._run_group(conn, job)
                        else:
                            job = await self._run_job(conn, job)
            except Exception as exc:  # no connection: the row comes back after the hold
                if job is not None:
                    job.batch.finish(exc)
                return

    async def _run_suspect(self, job: _Job) -> None:
        """A row whose last attempt never finished may be what killed its worker: run
        it with nothing else in flight in this process, so that if it kills this one
        too, only its own attempt is charged."""
        self._isolating += 1
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
            self._isolating -= 1
            self._spawn_chains()

    async def _run_job(self, conn: AsyncConnection, job: _Job) -> _Job | None:
        """One event, one transaction, no savepoint: a failure rolls the whole
        transaction back (the effect), then a second short transaction records the
        outcome, only while the row is still pending (seed 000's retry rule).

        Its attempt is counted already. Returns the next job for this chain (counted
        with this COMMIT), or ``None``. A database failure ends the chain; the job's
        row comes back after the hold."""
        store = self.box.store
        clock = self.box.clock
        attempt = job.attempt
        assert attempt is not None
        event = job.event
        object.__setattr__(event, "attempts", attempt)  # this worker's own copy of the row
        started = clock.now()
        nxt: _Job | None = None
        folded = committed = False  # nxt's start rides on this COMMIT; it went through
        reports: list[_Report] = []
        try:
            try:
                async with store.event_transaction(conn):
                    if not await store.inbox_begin(conn, event.id, attempt=attempt, now=started):
                        raise _NotOurs
                    if job.failed is not None:  # failed in a group: recorded, not run again
                        ctx, outcome = job.failed
                    else:
                        ctx, outcome = await self._run(conn, event, savepoint=False)
                    if outcome.kind != "done":
                        raise _RolledBack(ctx, outcome)
                    await store.outbox_insert_rows(conn, ctx.outbox_rows, now=clock.now())
                    await self._record(conn, event, ctx, outcome, started, reports)
                    await self.hooks.fire("before_commit", [event.id])
                    nxt, folded = await self._start_next(conn)
                committed = True
                if ctx.outbox_created:
                    store.wake("outbox")
            except _RolledBack as failed:
                reports.clear()
                async with conn.begin():
                    for locked in await store.inbox_lock(conn, [event.id]):
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
        store: Any = self.box.store
        jobs = await self._start_group(first)
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
                    async with store.event_transaction(conn):
                        pairs = [(job.event.id, job.attempt) for job in jobs]
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
                            ours = await store.inbox_lock_group(
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
                        await store.inbox_finish_group_on_commit(
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
                store.wake("outbox")
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
        """``first`` and up to ``group - 1`` more claimed events, their attempts counted
        (chains starting together share one start statement)."""
        taken = self._take_group(self.group - 1)
        jobs = [first, *(job for job in taken if job.attempt is not None)]
        fresh = [job for job in taken if job.attempt is None]  # not started yet
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
                    jobs.append(job)
        return jobs

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
        store: Any = self.box.store
        failed.extend((job, *job.failed) for job in jobs if job.failed is not None)
        runs = [job for job in jobs if job.failed is None]

        async def savepoint(*, release: bool, again: bool = True) -> None:
            """Release the previous event's savepoint (it succeeded) and set the next
            one. A handler that went on after a database error left the transaction
            aborted: the RELEASE says so."""
            try:
                await store.savepoint(conn, release=release, again=again)
            except Exception as exc:
                if getattr(exc, "sqlstate", None) != "25P02" or not done:
                    raise
                await store.rollback_to_savepoint(conn)
                job, ctx, _ = done.pop()
                failed.append((job, ctx, _Outcome("retry", _ABORTED)))

        for k, job in enumerate(runs):
            await savepoint(release=k > 0)
            ctx, outcome = await self._run(conn, job.event, savepoint=False, grouped=True)
            if outcome.kind == "done":
                done.append((job, ctx, outcome))
                continue
            await store.rollback_to_savepoint(conn)
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
        await self.box.store.inbox_start_on_commit(
            conn, nxt.event.id, attempts=nxt.event.attempts, now=self.box.clock.now()
        )
        return nxt, True

    # -- several events per transaction (SQLite) --------------------------------------

    async def _process_group(self, ids: list[int]) -> None:
        """At most ``concurrency`` of these run at once."""
        async with self._slots:
            await self._start_and_process(ids)

    async def _process_suspect(self, inbox_id: int) -> None:
        """A suspect runs alone (see :meth:`_run_suspect`)."""
        async with self._isolation:
            for _ in range(self.concurrency):
                await self._slots.acquire()
            try:
                await self._start_and_process([inbox_id])
            finally:
                for _ in range(self.concurrency):
                    self._slots.release()

    async def _start_and_process(self, ids: list[int]) -> None:
        # The attempt is counted as the events start, not at the claim: rows still
        # waiting for a slot are not charged if the process dies meanwhile.
        started = await self.box.store.inbox_start(ids, self.box.clock.now())
        ids = [i for i in ids if i in started]
        if ids:
            await self._process_batch(ids)

    async def _process_batch(self, ids: list[int]) -> None:
        """Several events in one transaction, each in a savepoint (SQLite: one
        COMMIT, one fsync, for the whole group)."""
        store = self.box.store
        try:
            async with store.transaction() as conn:
                events = await store.inbox_lock(conn, ids)
                done: list[int] = []
                created = False
                reports: list[_Report] = []
                for event in events:
                    outcome = await self.process(conn, event, reports)
                    if outcome.kind == "done":
                        done.append(event.id)
                    created = created or outcome.outbox_created
                if done:
                    await store.inbox_complete(conn, done, self.box.clock.now())
                await self.hooks.fire("before_commit", [e.id for e in events])
            self._report(reports)
            if created:
                store.wake("outbox")
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
        registration = self._registration(event.source, event.event_type)
        if ctx is None:
            ctx = Context(self.box, conn, event)
            if registration is not None:
                ctx._declare(registration)
        if registration is None:
            return ctx, _Outcome("unhandled", f"no handler for {event.source}/{event.event_type}")
        handler = registration.handler
        try:
            if savepoint:
                async with conn.begin_nested():
                    await handler(ctx)
                    await ctx._flush_session()
                    await self.box.store.outbox_insert_rows(
                        conn, ctx.outbox_rows, now=self.box.clock.now()
                    )
            else:
                await handler(ctx)
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

    def _registration(self, source: str, event_type: str) -> Registration | None:
        """``box.registration_for``, remembered until a handler is registered."""
        known = len(self.box._handlers)
        if known != self._handlers_known:
            self._handlers.clear()
            self._handlers_known = known
        key = (source, event_type)
        try:
            return self._handlers[key]
        except KeyError:
            found = self._handlers[key] = self.box.registration_for(source, event_type)
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

    def _count(self, source: str, label: str) -> None:
        counter = self._counters.get((source, label))
        if counter is None:
            counter = self._counters[(source, label)] = self.box.metrics.processed.labels(
                source, label
            )
        counter.inc()

    async def _record(
        self,
        conn: AsyncConnection,
        event: InboxEvent,
        ctx: Context,
        outcome: _Outcome,
        started: float,
        reports: list[_Report] | None = None,
    ) -> None:
        """Write the outcome in ``conn``'s transaction. Its log line and metric go to
        ``reports`` when given, for the caller to emit once the transaction commits
        (:meth:`_report`); otherwise now."""
        store = self.box.store
        now = self.box.clock.now()
        fields: dict[str, Any] = {
            "inbox_id": event.id,
            "event_key": list(event.key),
            "event_type": event.event_type,
            "attempt": event.attempts,
            "business_keys": ctx.business_keys,
        }
        if ctx.outbox_keys and outcome.kind == "done":
            fields["outbox_keys"] = ctx.outbox_keys
        kind = outcome.kind
        if kind == "retry":
            at = self.backoff.next_attempt(
                attempt=event.attempts, received_at=event.received_at, now=now, rng=self.rng
            )
            if at is None:
                kind = "exhausted"
            else:
                await store.inbox_retry_later(
                    conn, event.id, at=at, error=outcome.error or "", now=now
                )
                fields["next_attempt_in"] = round(at - now, 3)
        if kind in ("invalid", "exhausted", "conflict", "unhandled"):
            await store.inbox_kill(conn, event.id, reason=kind, error=outcome.error or "", now=now)
        # The row itself records a first-try success (done_at, attempts = 1); the
        # attempts table keeps the history of events that needed more than one.
        if kind != "done" or event.attempts > 1:
            await store.attempt_insert(
                conn,
                inbox_id=event.id,
                attempt=event.attempts,
                outcome=kind,
                error=outcome.error,
                worker=self.name,
                started_at=started,
                finished_at=now,
            )
        report = (event.source, kind, outcome.error, fields)
        if reports is None:
            self._report([report])
        else:
            reports.append(report)

    def _report(self, reports: list[_Report]) -> None:
        """Log lines and metrics of recorded outcomes (after their COMMIT)."""
        for source, kind, error, fields in reports:
            label = "done" if kind == "done" else ("retry" if kind == "retry" else f"dead_{kind}")
            self._count(source, label)
            if kind == "done":
                log.info("event_done", **fields)
            elif kind == "retry":
                log.warning("event_retry", error=error, **fields)
            else:
                log.error("event_dead", reason=kind, error=error, **fields)
