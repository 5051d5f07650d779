"""The outbox dispatcher (``relaybox dispatch``; the ``dispatcher`` role of ``serve``).

A remote call cannot be part of a database transaction, so every row goes through
three short steps and no transaction is open while a channel talks to the world:

1. **lease** (:mod:`relaybox.outbound.leases`): owner, fencing token, lease end,
   attempt counted; per-lane caps decide how many rows of each destination;
2. **deliver**: the channel makes one attempt, bounded by its timeout and the lease;
3. **record**: finished attempts are gathered and written together (group commit):
   one short transaction updates every outcome fenced per row (``id`` and
   ``lease_token`` from ``unnest`` arrays) plus one multi-row insert of the attempt
   log, while leasing keeps the next rows flowing. A dispatcher whose lease expired
   and was taken over writes nothing (its attempt is still logged, as ``fenced``).
   On PostgreSQL plain successes ride on the next lease instead: its one statement
   records them and leases into their slots.

A lease that expires unrecorded (the dispatcher died, or lost the database) makes the
outcome uncertain: the row comes back flagged and its channel's policy decides —
``resend`` under the same idempotency key / ``webhook-id``, ``review`` (the row is
``held`` for a human), or ``accept`` (counted as sent).

Isolation: ``concurrency`` slots run one attempt after another, and the loop leases
again whenever a slot frees, never waiting for a whole batch; each lane (endpoint)
holds at most its ``max_in_flight`` of those slots (at most ``concurrency``), so a
hanging endpoint ties up only its own, and each tenant's webhook lanes together at
most ``tenant_share`` of them, so a tenant whose endpoints hang ties up only its
share. A slot that frees takes the next tenant's row in turn, and within a tenant the
next lane's, never its own lane's next row ahead of lanes waiting. On PostgreSQL a
dispatcher alone in a lane may hold more of its rows than its cap (``lease_ahead``),
so that a slot finishing an attempt takes the next row at once; it still runs at most
the cap (see :meth:`Dispatcher.run`).

Each dispatcher also runs replay-missing jobs (:class:`~relaybox.outbound.replays.ReplayRunner`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import random
import secrets
import socket
import time
from typing import TYPE_CHECKING, Any

import structlog

from relaybox import tracing
from relaybox.config.outbound import tenant_cap
from relaybox.log import error_text, short_error
from relaybox.outbound.channels.base import Channel, Result
from relaybox.outbound.lanes import LaneScheduler
from relaybox.outbound.leases import lease, lease_recording, release
from relaybox.outbound.probes import DispatchHooks
from relaybox.outbound.recorder import AttemptRecorder
from relaybox.outbound.registry import outbound
from relaybox.outbound.replays import ReplayRunner
from relaybox.outbound.spans import decision_attributes, delivery_attributes
from relaybox.retry import Schedule
from relaybox.store.dispatch_rows import Attempt, Decision, Fairness
from relaybox.store.outbox_rows import Delivery

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = ["Dispatcher"]

log = structlog.get_logger("relaybox.dispatcher")

_DUE_MARGIN = 0.002
"""Seconds past a row's due time at which the loop leases it: a timer may fire a
little before the wall clock reaches the time (the event loop's clock is another)."""

_LEASES_IN_FLIGHT = 1
"""Leases running at once. On PostgreSQL a lease is one statement (one round trip):
slots freed meanwhile wait for that statement only, then go into the next lease. Two
leases in flight lock each other's lanes (SKIP LOCKED) and come back short or empty:
4 in flight measured ~45 % empty leases and ~25 % more PostgreSQL CPU per delivery."""


_SENT = Decision("sent", "sent")
"""Every success's decision (frozen: one for all)."""


class Dispatcher:
    """Delivers due outbox rows. ``run()`` loops until :meth:`stop`; ``run_once()``
    leases one batch and delivers it (tests drive it with a frozen clock)."""

    def __init__(
        self,
        box: Runtime,
        *,
        name: str | None = None,
        concurrency: int | None = None,
        batch: int | None = None,
        rng: random.Random | None = None,
        hooks: DispatchHooks | None = None,
    ) -> None:
        self.box = box
        self.hooks = hooks or DispatchHooks()
        """Where tests wait or inject faults (:class:`relaybox.outbound.probes.DispatchHooks`)."""
        self.outbound = outbound(box)
        s = self.outbound.settings
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self.concurrency = concurrency or s.concurrency
        self.batch = batch or s.batch
        self.tenant_cap = tenant_cap(self.concurrency, s.tenant_share)
        """Webhook attempts one tenant may have running at once in this dispatcher."""
        self.rng = rng or random.Random()
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._lanes_ready = False
        self._lease_failures = 0  # leases failed in a row (the database is away): back off
        self.recorder = AttemptRecorder(box, self.name, self.hooks)
        """Writes this dispatcher's finished attempts; it never calls back here."""
        self._loop: asyncio.AbstractEventLoop | None = None  # while run() runs
        self._ahead: list[str] = []  # channels whose lanes run() leases ahead
        self._unstarted: list[Delivery] = []  # leased ahead, never started: to release
        self._releaser: asyncio.Task[None] | None = None
        # The earliest due time known (a retry this dispatcher scheduled, or the
        # store's next due row) and the timer that wakes the loop then, so that a row
        # goes when it comes due, not at the next poll.
        self._due_at: float | None = None
        self._due_timer: asyncio.TimerHandle | None = None
        self._ask_due = True  # look up the store's next due row after the next short lease

    # -- loop -------------------------------------------------------------------

    def stop(self) -> None:
        """Finish the attempts in flight (and record them), then return from run()."""
        self._stopping.set()
        self._wake.set()

    async def run(self) -> None:
        """Deliver until :meth:`stop`: ``concurrency`` slots, a lease whenever some free
        (:class:`_Run`).

        Leasing ahead (PostgreSQL, channels whose uncertain policy is resend), a lane
        may have up to ``lease_ahead`` times its cap leased by this dispatcher while no
        other holds leases in it, and this dispatcher runs at most the cap minus the
        leases the others held when it last leased in the lane (``allowed``, which
        ``outbox_lease`` returns). Of two dispatchers, the one that leased last counted
        the other's leases, which can only have fallen since: together they stay
        within the cap."""
        self.outbound.vault.check()  # a broken key file: KeyFileError, before any lease
        listener = await self._listen()
        recorder = self.recorder
        self._loop = asyncio.get_running_loop()
        recorder.start(self._loop)
        # PostgreSQL: lanes of channels whose uncertain policy is resend may be leased
        # up to lease_ahead times their cap (outbox_lease), so that an attempt's end
        # starts the next row at once instead of waiting for the lease that records it
        # and brings the next one (bench/README.md). A row leased ahead that a crash
        # leaves unstarted comes back uncertain and is sent: what resend does anyway.
        ahead = self.outbound.settings.lease_ahead if recorder.folding else 1
        self._ahead = [
            name
            for name, channel in self.outbound.channels.items()
            if channel.uncertain == "resend" and ahead > 1
        ]
        lanes = LaneScheduler(
            limit=ahead * self.concurrency if self._ahead else self.concurrency,
            tenant_cap=self.tenant_cap,
            tenant_hold=self.tenant_cap * (ahead if "webhook" in self._ahead else 1),
            give_back=self._release_later,
            clock=time.monotonic,
        )
        run = _Run(self, lanes)
        # Replay-missing jobs run beside the deliveries, one at a time, in bounded
        # batches whose filter checks are off the event loop (relaybox.outbound.replays).
        replaying = asyncio.create_task(
            ReplayRunner(self.box, self.name).run(self._stopping), name="relaybox-replays"
        )
        try:
            await run.loop()
        finally:
            self._stopping.set()  # also when run() itself is cancelled
            await asyncio.gather(replaying, return_exceptions=True)
            if self._due_timer is not None:
                self._due_timer.cancel()
            recorder.stop()
            await run.wind_down()
            self._loop = None
            # Rows leased ahead and never started go back at once (not after their
            # lease runs out, and not as uncertain).
            self._unstarted.extend(lanes.drain())
            await self._release_unstarted()
            if self._releaser is not None:
                await asyncio.gather(self._releaser, return_exceptions=True)
            await recorder.drain()  # what finished while the loop stopped, too
            await self.close()
            if listener is not None:
                with contextlib.suppress(Exception):
                    await listener.close()

    async def run_once(self) -> int:
        """Lease up to ``batch`` due rows, deliver them concurrently, record each;
        return how many were leased."""
        deliveries = await self._lease(self.batch)
        await asyncio.gather(*(self.handle(d) for d in deliveries))
        return len(deliveries)

    async def close(self) -> None:
        await self.outbound.close()

    async def _lease_safely(
        self, slots: int, carry: list[Attempt], fair: Fairness
    ) -> tuple[list[Delivery], dict[str, int]]:
        """One lease for run(): the deliveries, and per lane leased how many attempts
        may run in it at once (PostgreSQL; empty: as many as were leased)."""
        try:
            if not self.recorder.folding:
                leased = await self._lease(slots, fair)
                self._lease_failures = 0
                if len(leased) < slots:
                    await self._learn_next_due()
                return leased, {}
            if not self._lanes_ready:
                await self._ensure_lanes()
            found, written, allowed = await lease_recording(
                self.box,
                owner=self.name,
                slots=slots,
                channels=list(self.outbound.channels),
                lease_ttl=self.outbound.settings.lease_ttl,
                sent=carry,
                ahead=self._ahead,
                factor=self.outbound.settings.lease_ahead,
                fair=fair,
            )
        except Exception as exc:  # the database went away: back off, then try again
            self._lease_failures += 1
            if self._lease_failures == 1 or self._lease_failures % 10 == 0:
                log.warning(
                    "outbox_lease_failed",
                    dispatcher=self.name,
                    failures=self._lease_failures,
                    error=short_error(exc),
                )
            if carry:  # the statement rolled back: the recorder writes them (and retries)
                self.recorder.hand(carry)
            return [], {}
        self._lease_failures = 0
        await self.recorder.settle(carry, written)
        if len(found) < slots:
            await self._learn_next_due()
        return found, allowed

    def _expect(self, at: float) -> None:
        """A row comes due at ``at`` (the box's clock): wake the loop then, unless it
        wakes for an earlier one already."""
        loop = self._loop
        if loop is None or (self._due_timer is not None and self._due_at is not None
                            and self._due_at <= at):  # fmt: skip
            return
        if self._due_timer is not None:
            self._due_timer.cancel()
        self._due_at = at
        delay = max(at - self.box.clock.now(), 0.0) + _DUE_MARGIN
        self._due_timer = loop.call_later(delay, self._due)

    def _due(self) -> None:
        self._due_timer = self._due_at = None
        self._ask_due = True  # the lease this wakes may leave later rows: look them up
        self._wake.set()

    async def _learn_next_due(self) -> None:
        """After a lease that found fewer rows than it had slots for: when the store's
        next row comes due (a retry another dispatcher scheduled, or one of this
        dispatcher's behind its earliest), once per wake by a due time or a poll."""
        if not self._ask_due:
            return
        self._ask_due = False
        try:
            at = await self.box.store.dispatch.outbox_next_due(
                channels=list(self.outbound.channels), now=self.box.clock.now()
            )
        except Exception as exc:  # the lease's own failure handling covers the database
            log.debug("outbox_next_due_failed", dispatcher=self.name, error=short_error(exc))
            return
        if at is not None:
            self._expect(at)

    def _release_later(self, d: Delivery) -> None:
        """A row leased ahead whose lease is too short to start it in now."""
        self._unstarted.append(d)
        if self._releaser is None or self._releaser.done():
            self._releaser = asyncio.create_task(self._release_unstarted())

    async def _release_unstarted(self) -> None:
        while self._unstarted:
            batch, self._unstarted = self._unstarted, []
            try:
                await release(self.box, batch)
            except Exception as exc:  # their leases run out instead: resent as uncertain
                log.warning(
                    "outbox_release_failed",
                    dispatcher=self.name,
                    rows=len(batch),
                    error=short_error(exc),
                )

    async def _lease(self, slots: int, fair: Fairness | None = None) -> list[Delivery]:
        """Lease up to ``slots`` rows; without ``fair`` (run_once), each tenant's lanes
        take at most its cap of them."""
        if not self._lanes_ready:
            await self._ensure_lanes()
        return await lease(
            self.box,
            owner=self.name,
            slots=slots,
            channels=list(self.outbound.channels),
            lease_ttl=self.outbound.settings.lease_ttl,
            fair=fair or Fairness(cap=self.concurrency, rows=self.tenant_cap),
        )

    async def _ensure_lanes(self) -> None:
        """Channels other than webhooks are one lane each, configured by code."""
        store = self.box.store
        async with store.transaction() as conn:
            for name, channel in self.outbound.channels.items():
                if name != "webhook":
                    await store.outbox.lane_upsert(
                        conn, name, channel.max_in_flight, channel.rate_limit
                    )
        self._lanes_ready = True

    async def _listen(self) -> Any:
        """Wake up on new rows (PostgreSQL LISTEN, SQLite's in-process signal); polling
        finds them anyway."""
        return await self.box.store.db.listen("outbox", self._wake)

    # -- one row ------------------------------------------------------------------

    async def handle(self, delivery: Delivery) -> None:
        """Apply the uncertain-outcome policy, deliver, decide, record. Never raises:
        a failure to record leaves the lease to expire (the uncertain path)."""
        try:
            await self._handle(delivery)
        except Exception as exc:
            log.error(
                "outbox_record_failed",
                outbox_id=delivery.id,
                dispatcher=self.name,
                error=short_error(exc),
            )

    async def _handle(self, d: Delivery) -> None:
        """One attempt, traced as ``relaybox.deliver``: a child of the context its
        message was published in (and linked to it), whatever process leased it."""
        if not tracing.enabled():
            return await self._deliver(d)
        with tracing.span(
            "relaybox.deliver",
            kind="producer",
            parent=d.message.traceparent if d.message is not None else None,
        ) as span:
            if span.is_recording():  # sampled: the attributes are built only then
                span.set_attributes(delivery_attributes(d))
            await self._deliver(d)

    async def _deliver(self, d: Delivery) -> None:
        channel = self.outbound.channels[d.channel]
        schedule = self._schedule(d, channel)
        if d.uncertain and channel.uncertain == "review":
            await self._record(d, None, Decision("held", "held", "uncertain"), 0.0, 0.0)
            return
        if d.uncertain and channel.uncertain == "accept":
            await self._record(d, None, Decision("sent", "accepted"), 0.0, 0.0)
            return
        if d.attempt > schedule.max_attempts:
            decision = Decision("dead", "exhausted", "exhausted")
            await self._record(d, None, decision, 0.0, 0.0)
            return
        started, t0 = self.box.clock.now(), time.perf_counter()
        try:
            if self.hooks.before_send:  # tests only: a hook that raises fails the attempt
                for hook in self.hooks.before_send:
                    await hook(d)
            if channel.bounded:
                result = await channel.deliver(d)
            else:
                async with asyncio.timeout(d.deadline):  # no extra task, unlike wait_for
                    result = await channel.deliver(d)
        except TimeoutError:
            result = Result("retry", error=f"no answer within {d.deadline:g} s", timed_out=True)
        except Exception as exc:  # a channel bug is a transient failure, with its trace
            result = Result("retry", error=error_text(exc))
        duration = time.perf_counter() - t0
        decision = self.decide(d, result, schedule)
        await self._record(d, result, decision, started, duration)
        if decision.at is not None and decision.status == "retry":
            self._expect(decision.at)

    async def _record(
        self, d: Delivery, result: Result | None, decision: Decision, started: float, took: float
    ) -> None:
        """Record the attempt; its span (when traced) gets the decision."""
        span = tracing.current_span()
        if span.is_recording():
            span.set_attributes(decision_attributes(decision, result, self.box.clock.now()))
        await self.recorder.record(Attempt(d, result, decision, self.name, started, took))

    def _schedule(self, d: Delivery, channel: Channel) -> Schedule:
        if d.endpoint is not None and d.endpoint.schedule is not None:
            return self.outbound.schedule(d.endpoint.schedule)
        return self.outbound.schedule(channel.schedule)

    def decide(self, d: Delivery, result: Result, schedule: Schedule) -> Decision:
        if result.outcome == "sent":
            return _SENT
        if result.outcome == "failed":
            return Decision("dead", "failed", "rejected")
        if result.outcome == "gone":
            return Decision("dead", "gone", "gone")
        if result.outcome == "blocked":  # retrying would be refused the same way
            return Decision("dead", "blocked", "blocked")
        delay = schedule.delay(d.attempt, retry_after=result.retry_after, rng=self.rng)
        if delay is None:
            return Decision("dead", "exhausted", "exhausted")
        return Decision("retry", "retry", at=self.box.clock.now() + delay)


class _Run:
    """One :meth:`Dispatcher.run`: its slots, the lanes they take rows from, and the
    lease in flight.

    ``concurrency`` slots, each a task that runs one attempt after another (no task
    per delivery); an idle slot waits on a future in ``idle``. :meth:`loop` starts a
    lease whenever slots are free (or successes wait to be recorded) and no lease is
    running; a lease (:meth:`leases`) hands its rows to idle slots and, while
    successes finished meanwhile, leases again in the same task. Each freed slot,
    finished lease, NOTIFY or due time wakes :meth:`loop`; otherwise it polls."""

    def __init__(self, dispatcher: Dispatcher, lanes: LaneScheduler) -> None:
        self.dispatcher = dispatcher
        self.lanes = lanes
        self.limit = lanes.limit
        self.recorder = dispatcher.recorder
        self.stopping = dispatcher._stopping
        self.idle: collections.deque[asyncio.Future[Delivery | None]] = collections.deque()
        self.slots: list[asyncio.Task[None]] = []
        self.leasing: set[asyncio.Task[None]] = set()
        self.reserved = 0
        """Rows asked of leases still running."""
        self.deferred = False
        """Slots were free while every lease slot was busy: lease again after."""

    def free(self) -> int:
        """Rows the next lease may ask for: the limit less rows running, held and asked."""
        lanes = self.lanes
        return self.limit - lanes.busy - lanes.held_n - self.reserved

    async def loop(self) -> None:
        d = self.dispatcher
        stopping, wake, recorder = self.stopping, d._wake, self.recorder
        poll_interval = d.outbound.settings.poll_interval
        self.slots = [asyncio.create_task(self.slot()) for _ in range(d.concurrency)]
        while not stopping.is_set():
            if d._lease_failures and not self.leasing:
                # The database is failing: doubling pauses up to 10 s before the next
                # lease, which no wake-up cuts short (it would only fail again).
                pause = poll_interval * 2 ** min(d._lease_failures, 10)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), min(pause, 10.0))
                if stopping.is_set():
                    break
            wake.clear()
            # Up to _LEASES_IN_FLIGHT leases in flight, each for every slot free when
            # it starts (the successes it records freed theirs); slots freed meanwhile
            # go into the next.
            if self.free() > 0 or recorder.carry:
                if len(self.leasing) < _LEASES_IN_FLIGHT:
                    self.start_lease()
                else:
                    self.deferred = True
            elif self.leasing:
                # Every free slot is asked for by a lease in flight, whose statement
                # may have begun before what woke this loop (a NOTIFY for a row it
                # does not see): it wakes the loop when it ends, to look again.
                self.deferred = True
            # Wake on new rows, on a freed slot, on a lease done, or poll. (Slots set
            # the event: waiting on every slot costs O(slots).)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(poll_interval):
                    await wake.wait()
            if not wake.is_set():  # a poll: rows may have come due unannounced
                d._ask_due = True

    async def wind_down(self) -> None:
        """After :meth:`loop` (``stopping`` set): the lease in flight ends, idle slots
        end, busy ones finish their attempt first."""
        if self.leasing:
            await asyncio.gather(*self.leasing, return_exceptions=True)
        for waiter in self.idle:
            if not waiter.done():
                waiter.set_result(None)
        await asyncio.gather(*self.slots, return_exceptions=True)

    async def slot(self) -> None:
        lanes, stopping, idle = self.lanes, self.stopping, self.idle
        handle, wake = self.dispatcher.handle, self.dispatcher._wake
        loop = asyncio.get_running_loop()
        while True:
            d = None if stopping.is_set() else lanes.next_row()
            if d is None:
                if stopping.is_set():
                    return
                waiter: asyncio.Future[Delivery | None] = loop.create_future()
                idle.append(waiter)
                d = await waiter
                if d is None:
                    return
            lane = d.lane or d.channel
            try:
                await handle(d)
            finally:
                lanes.finished(lane)
            wake.set()  # a slot is free: another lane may go, or a lease

    def hand(self, d: Delivery) -> bool:
        """Give ``d`` (already counted as running) to an idle slot."""
        idle = self.idle
        while idle:
            waiter = idle.popleft()
            if not waiter.done():
                waiter.set_result(d)
                return True
        return False

    def next_lease(self) -> tuple[int, list[Attempt], Fairness]:
        """The next lease's rows asked (every free slot, the successes it records
        freeing theirs, and, leasing ahead, as many again to hold), counted as
        reserved, the successes it carries, and its bounds."""
        carry = self.recorder.take_carry()
        asked = max(self.free(), 0)
        self.reserved += asked
        return asked, carry, self.lanes.fairness(self.dispatcher.concurrency)

    def start_lease(self) -> None:
        self.leasing.add(asyncio.create_task(self.leases(*self.next_lease())))

    async def leases(self, asked: int, carry: list[Attempt], fair: Fairness) -> None:
        """Lease, hand the rows to idle slots, and while successes finished meanwhile
        lease again at once, in this task: the next statement is sent in the same step
        as the last one's rows are handed out, with no pass of the event loop in
        between (a pass of a busy loop runs every slot's ready callbacks first)."""
        d, lanes, idle = self.dispatcher, self.lanes, self.idle
        stopping, recorder, monotonic = self.stopping, self.recorder, time.monotonic
        try:
            while True:
                try:
                    found, allowances = await d._lease_safely(asked, carry, fair)
                finally:
                    self.reserved -= asked
                now = monotonic()
                lanes.leased(found, allowances, now)  # held, then handed out below
                full = len(found) == asked
                # Successes that finished during this lease: the next lease goes before
                # the slots start the deliveries just leased, so that PostgreSQL runs it
                # while they send them.
                again = bool(recorder.carry) and not (stopping.is_set() or d._lease_failures)
                if again:
                    self.deferred = False  # the next lease asks for every free slot
                    asked, carry, fair = self.next_lease()
                while idle and lanes.turns and not stopping.is_set():
                    row = lanes.next_row()
                    if row is None:
                        break
                    if not self.hand(row):  # no slot waits after all: back to its lane's front
                        lanes.untake(row, now)
                        break
                if not again:
                    if full or self.deferred:
                        self.deferred = False
                        d._wake.set()  # more may be due, or slots freed meanwhile
                    # else nothing more is due or no lane has room: a freed slot, a
                    # NOTIFY or the poll interval wakes the loop (no busy loop on an
                    # empty outbox).
                    return
        finally:
            # At once, not in a done callback: the loop, once woken, counts the leases
            # in flight.
            self.leasing.discard(asyncio.current_task())
