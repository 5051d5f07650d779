"""The outbox dispatcher (``relaybox dispatch``; the ``dispatcher`` role of ``serve``).

A remote call cannot be part of a database transaction, so every row goes through
three short steps and no transaction is open while a channel talks to the world:

1. **lease** (:mod:`relaybox.outbound.leases`): owner, fencing token, lease end,
   attempt counted; per-lane caps decide how many rows of each destination;
2. **deliver**: the channel makes one attempt, bounded by its timeout and the lease;
3. **record**: one transaction writes the outcome ``WHERE id = ? AND lease_token = ?``
   plus the attempt log. A dispatcher whose lease expired and was taken over writes
   nothing (its attempt is still logged, as ``fenced``).

A lease that expires unrecorded (the dispatcher died, or lost the database) makes the
outcome uncertain: the row comes back flagged and its channel's policy decides —
``resend`` under the same idempotency key / ``webhook-id``, ``review`` (the row is
``held`` for a human), or ``accept`` (counted as sent).

Isolation: the loop keeps up to ``concurrency`` attempts in flight and leases again
whenever a slot frees, never waiting for a whole batch; each lane (endpoint) holds at
most its ``max_in_flight`` of those slots, so a hanging endpoint ties up only its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import secrets
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from relaybox.log import error_text, short_error
from relaybox.outbound import db
from relaybox.outbound.channels.base import Channel, Delivery, Result
from relaybox.outbound.endpoints import disable_in
from relaybox.outbound.leases import lease
from relaybox.outbound.registry import outbound
from relaybox.outbound.schedule import Schedule

if TYPE_CHECKING:
    from relaybox.app import Relaybox

__all__ = ["Decision", "Dispatcher"]

log = structlog.get_logger("relaybox.dispatcher")


@dataclass(frozen=True)
class Decision:
    """What a row becomes: ``sent``, ``retry`` (at ``at``), ``dead`` or ``held``
    (with ``reason``); ``label`` is the attempt log's outcome."""

    status: str
    label: str
    reason: str | None = None
    at: float | None = None


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
        self.rng = rng or random.Random()
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._lanes_ready = False

    # -- loop -------------------------------------------------------------------

    def stop(self) -> None:
        """Finish the attempts in flight (and record them), then return from run()."""
        self._stopping.set()
        self._wake.set()

    async def run(self) -> None:
        listener = await self._listen()
        tasks: set[asyncio.Task[None]] = set()
        try:
            while not self._stopping.is_set():
                self._wake.clear()
                free = self.concurrency - len(tasks)
                for delivery in await self._lease_safely(free) if free > 0 else []:
                    task = asyncio.create_task(self.handle(delivery))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                if self._stopping.is_set():
                    break
                # Wake on new rows, on a freed slot (its lane may have more), or poll.
                waiter = asyncio.create_task(self._wake.wait())
                await asyncio.wait(
                    {waiter, *tasks},
                    timeout=self.outbound.settings.poll_interval,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                waiter.cancel()
        finally:
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
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

    async def _lease_safely(self, slots: int) -> list[Delivery]:
        try:
            return await self._lease(slots)
        except Exception as exc:  # the database went away: poll again later
            log.warning("outbox_lease_failed", dispatcher=self.name, error=short_error(exc))
            return []

    async def _lease(self, slots: int) -> list[Delivery]:
        if not self._lanes_ready:
            await self._ensure_lanes()
        return await lease(
            self.box,
            owner=self.name,
            slots=slots,
            channels=list(self.outbound.channels),
            lease_ttl=self.outbound.settings.lease_ttl,
        )

    async def _ensure_lanes(self) -> None:
        """Channels other than webhooks are one lane each, configured by code."""
        store = self.box.store
        async with store.transaction() as conn:
            for name, channel in self.outbound.channels.items():
                if name != "webhook":
                    await db.execute(
                        conn, store, "lane_upsert", name, channel.max_in_flight, channel.rate_limit
                    )
        self._lanes_ready = True

    async def _listen(self) -> Any:
        """Wake up on published rows: PostgreSQL LISTEN, or SQLite's in-process signal.
        Polling finds the rows anyway; this only shortens the wait."""
        store = self.box.store
        if store.backend == "sqlite":
            signal = store.wakeup("outbox")  # type: ignore[attr-defined]

            async def relay() -> None:
                while True:
                    await signal.wait()
                    signal.clear()
                    self._wake.set()

            task = asyncio.create_task(relay())

            class _Closer:
                async def close(self) -> None:
                    task.cancel()

            return _Closer()
        try:
            import asyncpg

            from relaybox.store.postgres import dsn

            conn = await asyncpg.connect(dsn(store.url), timeout=5)
            await conn.add_listener("relaybox_outbox", lambda *_: self._wake.set())
            return conn
        except Exception as exc:
            log.warning("dispatcher_listen_failed", error=short_error(exc))
            return None

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
            result = await asyncio.wait_for(channel.deliver(d), d.deadline)
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
        store, now = self.box.store, self.box.clock.now()
        error = result.error if result else None
        status = result.status_code if result else None
        async with store.transaction() as conn:
            if d.uncertain:
                await db.execute(
                    conn, store, "outbox_attempt_insert", d.id, d.attempt - 1, d.lease_token - 1,
                    None, now, 0.0, "uncertain", None,
                    "the lease expired before the outcome was recorded", None,
                )  # fmt: skip
            if decision.status == "retry":
                row = await db.first(
                    conn, store, "outbox_mark_retry", d.id, d.lease_token, now, decision.at,
                    error, status,
                )  # fmt: skip
            else:
                if decision.status == "held":
                    error = "outcome unknown: a dispatcher's lease expired; review, then redeliver"
                elif decision.label == "exhausted" and result is None:
                    error = f"attempt {d.attempt - 1} did not finish: the dispatcher died"
                row = await db.first(
                    conn, store, "outbox_mark_final", d.id, d.lease_token, now, decision.status,
                    decision.reason, error, status,
                )  # fmt: skip
            label = decision.label if row is not None else "fenced"
            if result is not None:
                await db.execute(
                    conn, store, "outbox_attempt_insert", d.id, d.attempt, d.lease_token,
                    self.name, started, duration, label, status, error, result.response,
                )  # fmt: skip
            if row is not None and d.endpoint is not None and result is not None:
                await self._endpoint_health(conn, d, result, now)
        self._observe(d, result, decision, label, duration)

    async def _endpoint_health(self, conn: Any, d: Delivery, result: Result, now: float) -> None:
        """Track the endpoint's failure streak; disable it on 410, or once it has failed
        without a success for ``disable_after`` seconds."""
        assert d.endpoint is not None
        store = self.box.store
        if result.outcome == "sent":
            await db.execute(conn, store, "endpoint_succeeded", d.endpoint.id)
            return
        streak = await db.first(conn, store, "endpoint_failed", d.endpoint.id, now)
        if result.outcome == "gone":
            await disable_in(self.box, conn, d.endpoint.id, reason="gone")
        elif (
            streak is not None
            and streak["status"] == "enabled"
            and now - streak["failing_since"] >= self.outbound.settings.disable_after
        ):
            await disable_in(self.box, conn, d.endpoint.id, reason="failing")

    def _observe(
        self, d: Delivery, result: Result | None, decision: Decision, label: str, duration: float
    ) -> None:
        self.outbound.attempts.labels(d.channel, label).inc()
        if result is not None:
            self.box.metrics.observe_delivery(
                d.endpoint.id if d.endpoint is not None else d.channel,
                result.status_code,
                duration,
                error="timeout" if result.timed_out else result.error,
            )
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
            log.info("outbox_sent", **fields)
        elif decision.status == "retry":
            log.warning("outbox_retry", **fields)
        else:
            log.error("outbox_" + decision.status, reason=decision.reason, **fields)
