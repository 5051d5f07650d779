"""Recording what attempts came to: every finished attempt is one
:class:`~relaybox.store.dispatch_rows.Attempt`, handed to
:meth:`AttemptRecorder.record`.

Outcomes are written in batches, one transaction per batch (group commit: one COMMIT,
one fsync, for every attempt that finished meanwhile): each row's outcome fenced by
its lease token, one multi-row insert of the attempt log, the endpoints' failure
streaks (disabling an endpoint that keeps failing or answers 410). A dispatcher whose
lease expired and was taken over writes nothing (its attempt is still logged, as
``fenced``). On PostgreSQL, while the dispatcher loops, plain successes are not
written here: they are *carried* to the dispatcher's next lease, whose one statement
records them and leases into their slots; the dispatcher takes them
(:meth:`AttemptRecorder.take_carry`) and reports what its lease wrote
(:meth:`AttemptRecorder.settle`).

The dispatcher holds its recorder and calls it; the recorder never calls the
dispatcher.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

import structlog

from relaybox.log import debug_enabled, short_error
from relaybox.outbound import announce
from relaybox.outbound.endpoints import disable_in
from relaybox.outbound.leases import lease_recording
from relaybox.outbound.probes import DispatchHooks
from relaybox.outbound.registry import outbound
from relaybox.store.dispatch_rows import Attempt
from relaybox.store.outbox_rows import Delivery

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = ["AttemptRecorder", "plain_success"]

log = structlog.get_logger("relaybox.dispatcher")


class AttemptRecorder:
    """Writes the finished attempts of one dispatcher (``owner``: its name)."""

    def __init__(self, box: Runtime, owner: str, hooks: DispatchHooks | None = None) -> None:
        self.box = box
        self.hooks = hooks or DispatchHooks()
        self.outbound = outbound(box)
        self.owner = owner
        self.folding = False
        """PostgreSQL, while the dispatcher loops (:meth:`start`): plain successes are
        carried to the next lease (:attr:`carry`) instead of being written here."""
        self.carry: list[Attempt] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._batch: list[Attempt] = []
        self._waiting: list[asyncio.Future[str] | None] = []  # element i: _batch[i]'s
        self._task: asyncio.Task[None] | None = None
        self._attempts: dict[tuple[str, str], Any] = {}  # labelled counters, looked up once

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """The dispatcher's loop runs on ``loop``: where the store records with its
        lease (:attr:`DispatchStore.lease_records`), plain successes are carried to it."""
        self._loop = loop
        self.folding = self.box.store.dispatch.lease_records

    def stop(self) -> None:
        """The dispatcher's loop ended: every attempt is written here again."""
        self.folding = False
        self._loop = None

    def take_carry(self) -> list[Attempt]:
        """The plain successes for the dispatcher's next lease to record."""
        carry, self.carry = self.carry, []
        return carry

    async def settle(self, carry: list[Attempt], written: Collection[tuple[int, int]]) -> None:
        """The lease that carried ``carry`` committed: ``written`` are the rows it
        recorded (the others' leases were taken over: ``fenced``)."""
        if not carry:
            return
        recorded: list[tuple[Delivery, str]] = []
        for a in carry:
            label = "sent" if a.key in written else "fenced"
            recorded.append((a.delivery, label))
            self.observe(a, label)
        if self.hooks.after_record:
            await self._after_record(recorded)

    async def _after_record(self, recorded: list[tuple[Delivery, str]]) -> None:
        """Run the ``after_record`` hooks (tests only): the outcomes are committed and
        stand whatever a hook does; one that raises is logged."""
        try:
            for hook in self.hooks.after_record:
                await hook(recorded)
        except Exception as exc:
            log.error("dispatch_hook_failed", hook="after_record", error=short_error(exc))

    async def drain(self) -> None:
        """Write everything still waiting (the dispatcher stops)."""
        if self.carry:
            self.hand(self.take_carry())
        while self._task is not None and not self._task.done():
            await asyncio.gather(self._task, return_exceptions=True)

    async def record(self, attempt: Attempt) -> None:
        """Hand the attempt to the recorder and wait until it is committed.

        Outcomes are written in batches, one transaction per batch (group commit: one
        COMMIT, one fsync, for every attempt that finished meanwhile). Durability is
        unchanged: an attempt whose outcome is not yet committed when the process dies
        is exactly the uncertain outcome the lease already covers; its lease expires and
        the channel's policy decides (``resend`` under the same webhook-id /
        idempotency key, ``review`` or ``accept``). The row's slot (and its lane's
        in-flight count) is held until the outcome is committed.

        On PostgreSQL, while the dispatcher loops (:attr:`folding`), a plain success is
        not waited for: the dispatcher's next lease records it in its own statement
        (``outbox_lease``) and leases into its place, whose lease the database counts
        until then; the slot moves on at once (no future to resolve, no task to wake
        again).
        """
        if self.folding and plain_success(attempt):
            self.carry.append(attempt)
            return
        done = (self._loop or asyncio.get_running_loop()).create_future()
        self._batch.append(attempt)
        self._waiting.append(done)
        self._schedule()
        await done

    def hand(self, attempts: list[Attempt]) -> None:
        """Write ``attempts``, which nobody waits for (a carry whose lease failed, or
        left when the dispatcher stops)."""
        self._batch.extend(attempts)
        self._waiting.extend([None] * len(attempts))
        self._schedule()

    def _schedule(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._record_batches())

    async def _record_batches(self) -> None:
        """Write what finished, in batches, until nothing waits: attempts that finish
        while a batch is being written form the next one."""
        while self._batch:
            await asyncio.sleep(0)  # attempts finishing in this turn join the batch
            batch, self._batch = self._batch, []
            waiting, self._waiting = self._waiting, []
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
                for a, done in zip(batch, waiting, strict=True):
                    if done is None:  # nobody waits for it: say what was lost
                        log.error(
                            "outbox_record_failed",
                            outbox_id=a.delivery.id,
                            dispatcher=self.owner,
                            error=short_error(exc),
                        )
                    elif not done.done():
                        done.set_exception(exc)
                continue
            for a, label in zip(batch, labels, strict=True):
                self.observe(a, label)
            if self.hooks.after_record:
                recorded = [(a.delivery, label) for a, label in zip(batch, labels, strict=True)]
                await self._after_record(recorded)
            for done, label in zip(waiting, labels, strict=True):
                if done is not None and not done.done():
                    done.set_result(label)

    async def _write(self, batch: list[Attempt]) -> list[str]:
        """Write one batch; returns each attempt's label (``fenced`` where another
        dispatcher had taken its row over). On PostgreSQL a batch of plain successes
        is ``outbox_lease`` for no slot, which only records (the rows, the attempt
        log, the endpoints' streaks): one round trip, one commit. Otherwise one
        transaction: every outcome and the attempt log (``outbox_record``), the
        endpoints' failure streaks, the dead letters' events."""
        store, now = self.box.store, self.box.clock.now()
        if store.dispatch.lease_records and all(plain_success(a) for a in batch):
            _, written, _ = await lease_recording(
                self.box,
                owner=self.owner,
                slots=0,
                channels=[],
                lease_ttl=self.outbound.settings.lease_ttl,
                sent=batch,
            )
            return ["sent" if a.key in written else "fenced" for a in batch]
        async with store.transaction() as conn:
            written = await store.dispatch.outbox_record(conn, batch, now=now)
            labels = [a.decision.label if a.key in written else "fenced" for a in batch]
            await self._endpoints_health(conn, batch, labels, now)
            for a, label in zip(batch, labels, strict=True):
                if label == "exhausted":  # with the dead letter, in its transaction
                    await announce.attempt_exhausted(self.box, conn, a.delivery, a.result, a.error)
        return labels

    async def _endpoints_health(
        self, conn: Any, batch: list[Attempt], labels: list[str], now: float
    ) -> None:
        """Endpoints that only succeeded in this batch: one statement clears their
        streaks; an endpoint with a failure in it gets its outcomes applied in order."""
        mixed: dict[str, list[Attempt]] = {}
        for a, label in zip(batch, labels, strict=True):
            endpoint = a.delivery.endpoint
            if label != "fenced" and endpoint is not None and a.result is not None:
                mixed.setdefault(endpoint.id, []).append(a)
        clean = sorted(e for e, made in mixed.items() if all(_outcome(a) == "sent" for a in made))
        # Endpoints announced failing when leased recover (once); the others only end
        # their runs. (A success carried to a lease only ends the run: a later one
        # recovers the endpoint.)
        failing = [e for e in clean if _failing(mixed[e])]
        if failing:
            await announce.endpoint_recovered(self.box, conn, failing, now=now)
            clean = [e for e in clean if e not in failing]
        if clean:
            await self.box.store.dispatch.endpoints_succeeded(conn, clean, now=now)
        for endpoint_id in sorted(mixed):
            if endpoint_id not in clean and endpoint_id not in failing:
                for a in mixed[endpoint_id]:
                    await self._endpoint_health(conn, a, now)

    async def _endpoint_health(self, conn: Any, a: Attempt, now: float) -> None:
        """Track the endpoint's failure streak: announce each threshold of failures in a
        row it reaches (``relaybox.endpoint.failing``), its recovery after one; disable
        it on 410, or once it has failed without a success for ``disable_after``
        seconds."""
        d, result = a.delivery, a.result
        assert d.endpoint is not None and result is not None
        store = self.box.store
        if result.outcome == "sent":
            if d.endpoint.failing:
                await announce.endpoint_recovered(self.box, conn, [d.endpoint.id], now=now)
            else:
                await store.dispatch.endpoint_succeeded(conn, d.endpoint.id, now=now)
            return
        streak = await store.dispatch.endpoint_failed(conn, d.endpoint.id, now=now)
        if streak is not None:
            level = 0
            for threshold in self.outbound.settings.failing_thresholds:
                if threshold <= streak.failures:
                    level = threshold
            if level > streak.failing_level:
                await announce.endpoint_failing(
                    self.box, conn, d.endpoint.id, streak.failures, level, result, d.id
                )
        if result.outcome == "gone":
            await disable_in(self.box, conn, d.endpoint.id, reason="gone")
        elif (
            streak is not None
            and streak.status == "enabled"
            and now - streak.failing_since >= self.outbound.settings.disable_after
        ):
            await disable_in(self.box, conn, d.endpoint.id, reason="failing")

    def observe(self, a: Attempt, label: str) -> None:
        """Count the attempt (``label``: what it was recorded as), time it, and log it
        unless it is a plain success (the attempt log is their audit trail)."""
        d, result, decision = a.delivery, a.result, a.decision
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
                a.duration,
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
            "dispatcher": self.owner,
        }
        if d.message is not None:
            fields["message_id"] = d.message.id
        if d.endpoint is not None:
            fields["endpoint_id"] = d.endpoint.id
        if result is not None:
            fields.update(status_code=result.status_code, duration=round(a.duration, 4))
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


def plain_success(a: Attempt) -> bool:
    """A success the lease may record (not one that ends an announced failure)."""
    d, result = a.delivery, a.result
    return (
        result is not None
        and result.outcome == "sent"
        and a.decision.status == "sent"
        and not d.uncertain
        and (d.endpoint is None or not d.endpoint.failing)
    )


def _outcome(a: Attempt) -> str | None:
    return a.result.outcome if a.result is not None else None


def _failing(made: list[Attempt]) -> bool:
    target = made[0].delivery.endpoint
    return target is not None and target.failing
