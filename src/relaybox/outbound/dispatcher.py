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
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import os
import random
import secrets
import socket
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from relaybox.log import debug_enabled, error_text, short_error
from relaybox.outbound.channels.base import Channel, Delivery, Result
from relaybox.outbound.endpoints import disable_in
from relaybox.outbound.leases import Fairness, lease, lease_recording, release
from relaybox.outbound.registry import outbound
from relaybox.outbound.schedule import Schedule
from relaybox.outbound.settings import tenant_cap

if TYPE_CHECKING:
    from relaybox.app import Relaybox

__all__ = ["Decision", "Dispatcher"]

log = structlog.get_logger("relaybox.dispatcher")

_LEASES_IN_FLIGHT = 1
"""Leases running at once. On PostgreSQL a lease is one statement (one round trip):
slots freed meanwhile wait for that statement only, then go into the next lease. Two
leases in flight lock each other's lanes (SKIP LOCKED) and come back short or empty:
4 in flight measured ~45 % empty leases and ~25 % more PostgreSQL CPU per delivery."""


@dataclass(frozen=True, slots=True)
class Decision:
    """What a row becomes: ``sent``, ``retry`` (at ``at``), ``dead`` or ``held``
    (with ``reason``); ``label`` is the attempt log's outcome."""

    status: str
    label: str
    reason: str | None = None
    at: float | None = None


@dataclass(slots=True)
class _Finished:
    """One attempt waiting for the recorder: its outcome, and the future its
    :meth:`Dispatcher.handle` awaits (resolved with the attempt log's label); none for
    a plain success that rides on the next lease (see :meth:`Dispatcher._record`)."""

    d: Delivery
    result: Result | None
    decision: Decision
    started: float
    duration: float
    done: asyncio.Future[str] | None = field(default=None, repr=False)


class Dispatcher:
    """Delivers due outbox rows. ``run()`` loops until :meth:`stop`; ``run_once()``
    leases one batch and delivers it (tests drive it with a frozen clock)."""

    def __init__(
        self,
        box: Relaybox,
        *,
        name: str | None = None,
        concurrency: int | None = None,
        batch: int | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.box = box
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
        self._finished: list[_Finished] = []
        self._lease_failures = 0  # leases failed in a row (the database is away): back off
        self._recorder: asyncio.Task[None] | None = None
        # PostgreSQL, while run() loops: plain successes ride on the next lease (one
        # statement records them and leases into their slots), see _record.
        self._folding = False
        self._carry: list[_Finished] = []
        self._ahead: list[str] = []  # channels whose lanes run() leases ahead
        self._unstarted: list[Delivery] = []  # leased ahead, never started: to release
        self._releaser: asyncio.Task[None] | None = None
        # run()'s loop, remembered (asyncio.get_running_loop() is a getpid() system
        # call per delivery on Python 3.11).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._attempts: dict[tuple[str, str], Any] = {}  # labelled counters, looked up once

    # -- loop -------------------------------------------------------------------

    def stop(self) -> None:
        """Finish the attempts in flight (and record them), then return from run()."""
        self._stopping.set()
        self._wake.set()

    async def run(self) -> None:
        """Deliver until :meth:`stop`: ``concurrency`` slots, a lease whenever some free.

        Leasing ahead (PostgreSQL, channels whose uncertain policy is resend), a lane
        may have up to ``lease_ahead`` times its cap leased by this dispatcher while no
        other holds leases in it, and this dispatcher runs at most the cap minus the
        leases the others held when it last leased in the lane (``allowed``, which
        ``outbox_lease`` returns). Of two dispatchers, the one that leased last counted
        the other's leases, which can only have fallen since: together they stay
        within the cap."""
        self.outbound.vault.check()  # a broken key file: KeyFileError, before any lease
        listener = await self._listen()
        loop = self._loop = asyncio.get_running_loop()
        leasing: set[asyncio.Task[tuple[list[Delivery], dict[str, int]]]] = set()
        reserved = 0  # rows asked of leases still running
        deferred = False  # slots were free while every lease slot was busy: lease again after
        self._folding = self.box.store.lease_records
        # PostgreSQL: lanes of channels whose uncertain policy is resend may be leased
        # up to lease_ahead times their cap (outbox_lease), so that an attempt's end
        # starts the next row at once instead of waiting for the lease that records it
        # and brings the next one (bench/README.md). A row leased ahead that a crash
        # leaves unstarted comes back uncertain and is sent: what resend does anyway.
        ahead = self.outbound.settings.lease_ahead if self._folding else 1
        self._ahead = [
            name
            for name, channel in self.outbound.channels.items()
            if channel.uncertain == "resend" and ahead > 1
        ]
        limit = ahead * self.concurrency if self._ahead else self.concurrency
        monotonic = time.monotonic
        stopping = self._stopping
        # ``concurrency`` slots, each a task that runs one attempt after another (no
        # task per delivery). Per lane: attempts running, how many may run at once (its
        # cap minus the leases other dispatchers held when this one last leased there;
        # unknown: no bound but the slots), and rows leased, waiting for a slot. Per
        # tenant (a webhook lane's; a channel's lane has none): attempts running, at
        # most ``tenant_cap``, and rows held.
        running: dict[str, int] = {}
        allowed: dict[str, int] = {}
        held: dict[str, collections.deque[tuple[Delivery, float]]] = {}
        owner: dict[str, str | None] = {}  # lane -> its tenant, while it has rows here
        t_running: dict[str, int] = {}
        t_held: dict[str, int] = {}
        tenant_cap = self.tenant_cap
        tenant_hold = tenant_cap * (ahead if "webhook" in self._ahead else 1)
        # Slots are handed out round robin: tenant by tenant (``turns``), and within a
        # tenant lane by lane (``waiting``), so a freed slot goes to whoever is next,
        # not to its own lane's next row. Both are hints, checked when a turn comes:
        # a lane leaves ``waiting`` when it has no row or no room, a tenant leaves
        # ``turns`` at its cap; they come back when an attempt of theirs ends.
        waiting: dict[str | None, dict[str, None]] = {}
        turns: dict[str | None, None] = {}
        idle: collections.deque[asyncio.Future[Delivery | None]] = collections.deque()
        held_n = 0  # rows held
        busy = 0  # rows given to a slot and not yet done

        def room(lane: str) -> bool:
            return running.get(lane, 0) < allowed.get(lane, limit)

        def tenant_room(tenant: str | None) -> bool:
            return tenant is None or t_running.get(tenant, 0) < tenant_cap

        def take(lane: str, tenant: str | None) -> Delivery | None:
            """The lane's next held row, counted as running; ``None``: none left (a
            row whose lease ran too short while it waited is given back instead)."""
            nonlocal held_n, busy
            queue = held.get(lane)
            while queue:
                d, at = queue.popleft()
                held_n -= 1
                if tenant is not None:
                    t_held[tenant] -= 1
                waited = monotonic() - at
                if waited > 0.5:  # the lease runs out as it did: so must the attempt
                    if d.deadline - waited < 1.0:
                        self._release_later(d)
                        continue
                    d = dataclasses.replace(d, deadline=d.deadline - waited)
                if not queue:
                    del held[lane]
                running[lane] = running.get(lane, 0) + 1
                if tenant is not None:
                    t_running[tenant] = t_running.get(tenant, 0) + 1
                busy += 1
                return d
            held.pop(lane, None)
            return None

        def next_row() -> Delivery | None:
            """A held row that may start: the next tenant's in turn, of its next lane."""
            while turns:
                tenant = next(iter(turns))
                del turns[tenant]
                if not tenant_room(tenant):
                    continue  # its turn again when one of its attempts ends
                lanes = waiting.get(tenant)
                d = None
                while lanes and d is None:
                    lane = next(iter(lanes))
                    del lanes[lane]
                    if lane not in held or not room(lane):
                        continue  # waiting again when it has rows and room
                    d = take(lane, tenant)
                    if lane in held and room(lane):
                        lanes[lane] = None  # its turn again after the tenant's others
                if lanes:
                    if tenant_room(tenant):
                        turns[tenant] = None  # its turn again after the other tenants
                else:
                    waiting.pop(tenant, None)
                if d is not None:
                    return d
            return None

        def mark_ready(lane: str) -> None:
            if lane in held and room(lane):
                tenant = owner.get(lane)
                waiting.setdefault(tenant, {})[lane] = None
                if tenant_room(tenant):
                    turns[tenant] = None

        def finished(lane: str) -> None:
            """An attempt of ``lane`` ended: its lane and tenant may have room again."""
            nonlocal busy
            busy -= 1
            running[lane] -= 1
            tenant = owner.get(lane)
            if tenant is not None:
                t_running[tenant] -= 1
                if waiting.get(tenant) and t_running[tenant] < tenant_cap:
                    turns[tenant] = None
            if lane in held:
                mark_ready(lane)
            elif not running[lane]:  # nothing of it here any more: forget it
                del running[lane]
                allowed.pop(lane, None)
                owner.pop(lane, None)
                if tenant is not None and not t_running[tenant] and not t_held[tenant]:
                    del t_running[tenant], t_held[tenant]

        def hand(d: Delivery) -> bool:
            """Give ``d`` (already counted as running) to an idle slot."""
            while idle:
                waiter = idle.popleft()
                if not waiter.done():
                    waiter.set_result(d)
                    return True
            return False

        def hold(d: Delivery, at: float, front: bool = False) -> str:
            nonlocal held_n
            lane = d.lane or d.channel
            # A webhook lane is an endpoint (its id, never a channel's name) of the
            # row's tenant; a channel's lane is bounded by its own cap only.
            tenant = d.tenant if lane != d.channel else None
            owner[lane] = tenant
            queue = held.get(lane)
            if queue is None:
                queue = held[lane] = collections.deque()
            if front:
                queue.appendleft((d, at))
            else:
                queue.append((d, at))
            held_n += 1
            if tenant is not None:
                t_held[tenant] = t_held.get(tenant, 0) + 1
                t_running.setdefault(tenant, 0)
            return lane

        async def slot() -> None:
            while True:
                d = None if stopping.is_set() else next_row()
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
                    await self.handle(d)
                finally:
                    finished(lane)
                self._wake.set()  # a slot is free: another lane may go, or a lease

        def fairness() -> Fairness:
            """This lease's bounds: lanes' caps, and per tenant the rows it may still
            hold (``tenant_hold`` minus those running or held here)."""
            return Fairness(
                cap=self.concurrency,
                rows=tenant_hold,
                held={t: tenant_hold - n - t_held[t] for t, n in t_running.items()},
            )

        def start_lease() -> None:
            """Lease every free slot (the successes it records freed theirs) and, leasing
            ahead, as many again to hold."""
            nonlocal reserved
            carry, self._carry = self._carry, []
            asked = max(limit - busy - held_n - reserved, 0)
            reserved += asked
            lease_task = asyncio.create_task(self._lease_safely(asked, carry, fairness()))
            leasing.add(lease_task)
            lease_task.add_done_callback(functools.partial(leased, asked=asked))

        def leased(
            lease_task: asyncio.Task[tuple[list[Delivery], dict[str, int]]], asked: int
        ) -> None:
            nonlocal reserved, deferred, busy
            reserved -= asked
            leasing.discard(lease_task)
            found, allowances = ([], {}) if lease_task.cancelled() else lease_task.result()
            allowed.update(allowances)
            now = monotonic()
            lanes = dict.fromkeys(allowances)  # new rows, or a new allowance
            for d in found:  # held, then handed to idle slots below, in turn
                lanes[hold(d, now)] = None
            for lane in lanes:
                mark_ready(lane)
            if self._carry and len(leasing) < _LEASES_IN_FLIGHT and not stopping.is_set():
                # Successes that finished during this lease: send the next lease before
                # the slots start the deliveries just leased, so that PostgreSQL runs it
                # while they send them.
                start_lease()
            while idle and turns and not stopping.is_set():
                row = next_row()
                if row is None:
                    break
                if not hand(row):  # no slot waits after all: back to its lane's front
                    lane = row.lane or row.channel
                    tenant = owner.get(lane)
                    running[lane] -= 1
                    busy -= 1
                    if tenant is not None:
                        t_running[tenant] -= 1
                    hold(row, now, front=True)
                    mark_ready(lane)
                    break
            if len(found) == asked or deferred:
                deferred = False
                self._wake.set()  # more may be due, or slots freed meanwhile
            # else nothing more is due or no lane has room: a freed slot, a NOTIFY or
            # the poll interval wakes the loop (no busy loop on an empty outbox).

        slots = [asyncio.create_task(slot()) for _ in range(self.concurrency)]
        try:
            while not stopping.is_set():
                if self._lease_failures and not leasing:
                    # The database is failing: doubling pauses up to 10 s before the next
                    # lease, which no wake-up cuts short (it would only fail again).
                    pause = self.outbound.settings.poll_interval * 2 ** min(
                        self._lease_failures, 10
                    )
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stopping.wait(), min(pause, 10.0))
                    if stopping.is_set():
                        break
                self._wake.clear()
                free = limit - busy - held_n - reserved
                # Up to _LEASES_IN_FLIGHT leases in flight, each for every slot free
                # when it starts (the successes it records freed theirs); slots freed
                # meanwhile go into the next.
                if (free > 0 or self._carry) and len(leasing) < _LEASES_IN_FLIGHT:
                    start_lease()
                elif free > 0 or self._carry:
                    deferred = True
                # Wake on new rows, on a freed slot, on a lease done, or poll. (Slots
                # set the event: waiting on every slot costs O(slots).)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.outbound.settings.poll_interval):
                        await self._wake.wait()
        finally:
            stopping.set()  # also when run() itself is cancelled
            self._folding = False
            if leasing:
                await asyncio.gather(*leasing, return_exceptions=True)
            for waiter in idle:  # idle slots end; busy ones finish their attempt first
                if not waiter.done():
                    waiter.set_result(None)
            await asyncio.gather(*slots, return_exceptions=True)
            self._loop = None
            # Rows leased ahead and never started go back at once (not after their
            # lease runs out, and not as uncertain).
            for queue in held.values():
                self._unstarted.extend(d for d, _ in queue)
            held.clear()
            if self._carry:  # finished while the loop stopped: the recorder writes them
                self._hand_to_recorder(self._carry)
                self._carry = []
            await self._release_unstarted()
            if self._releaser is not None:
                await asyncio.gather(self._releaser, return_exceptions=True)
            while self._recorder is not None and not self._recorder.done():
                await asyncio.gather(self._recorder, return_exceptions=True)
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
        for channel in self.outbound.channels.values():
            with contextlib.suppress(Exception):
                await channel.close()

    async def _lease_safely(
        self, slots: int, carry: list[_Finished], fair: Fairness
    ) -> tuple[list[Delivery], dict[str, int]]:
        """One lease for run(): the deliveries, and per lane leased how many attempts
        may run in it at once (PostgreSQL; empty: as many as were leased)."""
        try:
            if not self._folding:
                leased = await self._lease(slots, fair)
                self._lease_failures = 0
                return leased, {}
            if not self._lanes_ready:
                await self._ensure_lanes()
            found, written, allowed = await lease_recording(
                self.box,
                owner=self.name,
                slots=slots,
                channels=list(self.outbound.channels),
                lease_ttl=self.outbound.settings.lease_ttl,
                sent=[_sent_row(f) for f in carry],
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
                self._hand_to_recorder(carry)
            return [], {}
        self._lease_failures = 0
        for f in carry:
            label = "sent" if (f.d.id, f.d.lease_token) in written else "fenced"
            self._observe(f.d, f.result, f.decision, label, f.duration)
            if f.done is not None and not f.done.done():
                f.done.set_result(label)
        return found, allowed

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
                    await store.lane_upsert(conn, name, channel.max_in_flight, channel.rate_limit)
        self._lanes_ready = True

    async def _listen(self) -> Any:
        """Wake up on new rows (PostgreSQL LISTEN, SQLite's in-process signal); polling
        finds them anyway."""
        return await self.box.store.listen("outbox", self._wake)

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
        await self._record(d, result, self.decide(d, result, schedule), started, duration)

    def _schedule(self, d: Delivery, channel: Channel) -> Schedule:
        if d.endpoint is not None and d.endpoint.schedule is not None:
            return self.outbound.schedule(d.endpoint.schedule)
        return self.outbound.schedule(channel.schedule)

    def decide(self, d: Delivery, result: Result, schedule: Schedule) -> Decision:
        if result.outcome == "sent":
            return Decision("sent", "sent")
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

    async def _record(
        self,
        d: Delivery,
        result: Result | None,
        decision: Decision,
        started: float,
        duration: float,
    ) -> None:
        """Hand the outcome to the recorder and wait until it is committed.

        Outcomes are written in batches, one transaction per batch (group commit: one
        COMMIT, one fsync, for every attempt that finished meanwhile). Durability is
        unchanged: an attempt whose outcome is not yet committed when the process dies
        is exactly the uncertain outcome the lease already covers; its lease expires and
        the channel's policy decides (``resend`` under the same webhook-id /
        idempotency key, ``review`` or ``accept``). The row's slot (and its lane's
        in-flight count) is held until the outcome is committed.

        On PostgreSQL, while :meth:`run` loops, a plain success is not waited for: the
        next lease records it in its own statement (``outbox_lease``) and leases into
        its place, whose lease the database counts until then; the slot moves on at
        once (no future to resolve, no task to wake again).
        """
        f = _Finished(d, result, decision, started, duration)
        if self._folding and _plain_success(f):
            self._carry.append(f)
            self._wake.set()
            return
        done = f.done = (self._loop or asyncio.get_running_loop()).create_future()
        self._hand_to_recorder([f])
        await done

    def _hand_to_recorder(self, finished: list[_Finished]) -> None:
        self._finished.extend(finished)
        if self._recorder is None or self._recorder.done():
            self._recorder = asyncio.create_task(self._record_batches())

    async def _record_batches(self) -> None:
        """Write what finished, in batches, until nothing waits: attempts that finish
        while a batch is being written form the next one."""
        while self._finished:
            await asyncio.sleep(0)  # attempts finishing in this turn join the batch
            batch, self._finished = self._finished, []
            try:
                try:
                    labels = await self._write(batch)
                except Exception:
                    if len(batch) == 1:
                        raise
                    # E.g. a deadlock with another dispatcher's batch: the transaction
                    # rolled back, writing it again is safe.
                    labels = await self._write(batch)
            except Exception as exc:
                for f in batch:
                    if f.done is not None and not f.done.done():
                        f.done.set_exception(exc)
                    elif f.done is None:  # nobody waits for it: say what was lost
                        log.error(
                            "outbox_record_failed",
                            outbox_id=f.d.id,
                            dispatcher=self.name,
                            error=short_error(exc),
                        )
                continue
            for f, label in zip(batch, labels, strict=True):
                self._observe(f.d, f.result, f.decision, label, f.duration)
                if f.done is not None and not f.done.done():
                    f.done.set_result(label)

    async def _write(self, batch: list[_Finished]) -> list[str]:
        """One transaction: every outcome (fenced per row), the attempt log, the
        endpoints' failure streaks. Returns each attempt's label."""
        store, now = self.box.store, self.box.clock.now()
        if store.lease_records and all(_plain_success(f) for f in batch):
            return await self._write_sent(batch, now)
        marks: list[tuple[Any, ...]] = []
        for f in batch:
            d, result, decision = f.d, f.result, f.decision
            error = result.error if result else None
            code = result.status_code if result else None
            if decision.status == "held":
                error = "outcome unknown: a dispatcher's lease expired; review, then redeliver"
            elif decision.status != "retry" and decision.label == "exhausted" and result is None:
                error = f"attempt {d.attempt - 1} did not finish: the dispatcher died"
            status = "pending" if decision.status == "retry" else decision.status
            marks.append((d.id, d.lease_token, status, decision.at, decision.reason, error, code))
        async with store.transaction() as conn:
            written = await store.outbox_record(conn, marks, now=now)
            labels: list[str] = []
            log_rows: list[tuple[Any, ...]] = []
            for f, mark in zip(batch, marks, strict=True):
                d, result = f.d, f.result
                label = f.decision.label if (d.id, d.lease_token) in written else "fenced"
                labels.append(label)
                if d.uncertain:
                    log_rows.append(
                        (d.id, d.attempt - 1, d.lease_token - 1, None, now, 0.0, "uncertain",
                         None, "the lease expired before the outcome was recorded", None)
                    )  # fmt: skip
                if result is not None:
                    log_rows.append(
                        (d.id, d.attempt, d.lease_token, self.name, f.started, f.duration,
                         label, mark[6], mark[5], result.response)
                    )  # fmt: skip
            if log_rows:
                await store.outbox_attempts_insert(conn, log_rows)
            await self._endpoints_health(conn, batch, labels, now)
        return labels

    async def _write_sent(self, batch: list[_Finished], now: float) -> list[str]:
        """PostgreSQL, a batch of plain successes outside run()'s loop (run_once, a
        stopping loop, a lease that failed): ``outbox_lease`` for no slot, which only
        records (the rows, the attempt log, the endpoints' streaks): one round trip,
        one commit."""
        _, written, _ = await lease_recording(
            self.box,
            owner=self.name,
            slots=0,
            channels=[],
            lease_ttl=self.outbound.settings.lease_ttl,
            sent=[_sent_row(f) for f in batch if f.result is not None],
        )
        return ["sent" if (f.d.id, f.d.lease_token) in written else "fenced" for f in batch]

    async def _endpoints_health(
        self, conn: Any, batch: list[_Finished], labels: list[str], now: float
    ) -> None:
        """Endpoints that only succeeded in this batch: one statement clears their
        streaks; an endpoint with a failure in it gets its outcomes applied in order."""
        mixed: dict[str, list[tuple[Delivery, Result]]] = {}
        for f, label in zip(batch, labels, strict=True):
            if label != "fenced" and f.d.endpoint is not None and f.result is not None:
                mixed.setdefault(f.d.endpoint.id, []).append((f.d, f.result))
        clean = sorted(e for e, rs in mixed.items() if all(r.outcome == "sent" for _, r in rs))
        if clean:
            await self.box.store.endpoints_succeeded(conn, clean)
        for endpoint_id in sorted(mixed):
            if endpoint_id not in clean:
                for d, result in mixed[endpoint_id]:
                    await self._endpoint_health(conn, d, result, now)

    async def _endpoint_health(self, conn: Any, d: Delivery, result: Result, now: float) -> None:
        """Track the endpoint's failure streak; disable it on 410, or once it has failed
        without a success for ``disable_after`` seconds."""
        assert d.endpoint is not None
        store = self.box.store
        if result.outcome == "sent":
            await store.endpoint_succeeded(conn, d.endpoint.id)
            return
        streak = await store.endpoint_failed(conn, d.endpoint.id, now=now)
        if result.outcome == "gone":
            await disable_in(self.box, conn, d.endpoint.id, reason="gone")
        elif (
            streak is not None
            and streak.status == "enabled"
            and now - streak.failing_since >= self.outbound.settings.disable_after
        ):
            await disable_in(self.box, conn, d.endpoint.id, reason="failing")

    def _observe(
        self, d: Delivery, result: Result | None, decision: Decision, label: str, duration: float
    ) -> None:
        counter = self._attempts.get((d.channel, label))
        if counter is None:
            counter = self._attempts[d.channel, label] = self.outbound.attempts.labels(
                d.channel, label
            )
        counter.inc()
        if result is not None:
            self.box.metrics.observe_delivery(
                d.channel,
                result.status_code,
                duration,
                error="timeout" if result.timed_out else result.error,
            )
        if decision.status == "sent" and label != "fenced" and not debug_enabled():
            return  # the attempt log is the audit trail; a line per success costs CPU
        fields: dict[str, Any] = {
            "outbox_id": d.id,
            "channel": d.channel,
            "key": d.key,
            "attempt": d.attempt,
            "outcome": label,
            "dispatcher": self.name,
        }
        if d.message is not None:
            fields["message_id"] = d.message.id
        if d.endpoint is not None:
            fields["endpoint_id"] = d.endpoint.id
        if result is not None:
            fields.update(status_code=result.status_code, duration=round(duration, 4))
            if result.error:
                fields["error"] = result.error
        if decision.at is not None:
            fields["next_attempt_in"] = round(decision.at - self.box.clock.now(), 3)
        if label == "fenced":
            log.warning("outbox_record_refused", reason="lease taken over", **fields)
        elif decision.status == "sent":
            log.debug("outbox_sent", **fields)
        elif decision.status == "retry":
            log.warning("outbox_retry", **fields)
        else:
            log.error("outbox_" + decision.status, reason=decision.reason, **fields)


def _plain_success(f: _Finished) -> bool:
    return (
        f.result is not None
        and f.result.outcome == "sent"
        and f.decision.status == "sent"
        and not f.d.uncertain
    )


def _sent_row(f: _Finished) -> tuple[Any, ...]:
    """A plain success as outbox_lease's columns of successes to record."""
    d, result = f.d, f.result
    assert result is not None
    return (d.id, d.lease_token, d.attempt, d.endpoint.id if d.endpoint else None,
            f.started, f.duration, result.status_code, result.error, result.response)  # fmt: skip
