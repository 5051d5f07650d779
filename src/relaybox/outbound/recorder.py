"""Recording what attempts came to: every outcome goes through :meth:`Recorder.record`.

Outcomes are written in batches, one transaction per batch (group commit: one COMMIT,
one fsync, for every attempt that finished meanwhile): each row's outcome fenced by
its lease token, one multi-row insert of the attempt log, the endpoints' failure
streaks (disabling an endpoint that keeps failing or answers 410). A dispatcher whose
lease expired and was taken over writes nothing (its attempt is still logged, as
``fenced``). On PostgreSQL, while the dispatcher loops, plain successes are not
written here: they are *carried* to the next lease, whose one statement records them
and leases into their slots (:meth:`Recorder.settle`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from relaybox.hooks import DispatchHooks
from relaybox.log import debug_enabled, short_error
from relaybox.outbound import operational
from relaybox.outbound.channels.base import Result
from relaybox.outbound.endpoints import disable_in
from relaybox.outbound.leases import lease_recording
from relaybox.outbound.registry import outbound
from relaybox.store.outbox_rows import Delivery

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = ["Decision", "Finished", "Recorder", "plain_success", "sent_row"]

log = structlog.get_logger("relaybox.dispatcher")


@dataclass(frozen=True, slots=True)
class Decision:
    """What a row becomes: ``sent``, ``retry`` (at ``at``), ``dead`` or ``held``
    (with ``reason``); ``label`` is the attempt log's outcome."""

    status: str
    label: str
    reason: str | None = None
    at: float | None = None


@dataclass(slots=True)
class Finished:
    """One attempt waiting to be recorded: its outcome, and the future its
    :meth:`Dispatcher.handle` awaits (resolved with the attempt log's label); none for
    a plain success carried to the next lease (see :meth:`Recorder.record`)."""

    d: Delivery
    result: Result | None
    decision: Decision
    started: float
    duration: float
    done: asyncio.Future[str] | None = field(default=None, repr=False)


class Recorder:
    """Writes the outcomes of one dispatcher's attempts (``owner``: its name)."""

    def __init__(
        self,
        box: Runtime,
        owner: str,
        wake: Callable[[], None],
        hooks: DispatchHooks | None = None,
    ) -> None:
        self.box = box
        self.hooks = hooks or DispatchHooks()
        self.outbound = outbound(box)
        self.owner = owner
        self._wake = wake  # the dispatcher's loop: a carried success wants a lease
        self.folding = False
        """PostgreSQL, while the dispatcher loops: plain successes are carried to the
        next lease (:attr:`carry`) instead of being written here."""
        self.carry: list[Finished] = []
        self.loop: asyncio.AbstractEventLoop | None = None
        self._finished: list[Finished] = []
        self._task: asyncio.Task[None] | None = None
        self._attempts: dict[tuple[str, str], Any] = {}  # labelled counters, looked up once

    def take_carry(self) -> list[Finished]:
        carry, self.carry = self.carry, []
        return carry

    def settle(
        self, carry: list[Finished], written: Collection[tuple[Any, int]]
    ) -> list[tuple[Delivery, str]]:
        """The lease that carried ``carry`` committed: ``written`` are the rows it
        recorded (the others' leases were taken over). Returns each row's label."""
        labels: list[tuple[Delivery, str]] = []
        for f in carry:
            label = "sent" if (f.d.id, f.d.lease_token) in written else "fenced"
            labels.append((f.d, label))
            self.observe(f.d, f.result, f.decision, label, f.duration)
            if f.done is not None and not f.done.done():
                f.done.set_result(label)
        return labels

    async def after_record(self, recorded: list[tuple[Delivery, str]]) -> None:
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

    async def record(
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

        On PostgreSQL, while the dispatcher loops (:attr:`folding`), a plain success is
        not waited for: the next lease records it in its own statement
        (``outbox_lease``) and leases into its place, whose lease the database counts
        until then; the slot moves on at once (no future to resolve, no task to wake
        again).
        """
        f = Finished(d, result, decision, started, duration)
        if self.folding and plain_success(f):
            self.carry.append(f)
            self._wake()
            return
        done = f.done = (self.loop or asyncio.get_running_loop()).create_future()
        self.hand([f])
        await done

    def hand(self, finished: list[Finished]) -> None:
        self._finished.extend(finished)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._record_batches())

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
                            dispatcher=self.owner,
                            error=short_error(exc),
                        )
                continue
            for f, label in zip(batch, labels, strict=True):
                self.observe(f.d, f.result, f.decision, label, f.duration)
            if self.hooks.after_record:
                await self.after_record([(f.d, lbl) for f, lbl in zip(batch, labels, strict=True)])
            for f, label in zip(batch, labels, strict=True):
                if f.done is not None and not f.done.done():
                    f.done.set_result(label)

    async def _write(self, batch: list[Finished]) -> list[str]:
        """One transaction: every outcome (fenced per row), the attempt log, the
        endpoints' failure streaks. Returns each attempt's label."""
        store, now = self.box.store, self.box.clock.now()
        if store.lease_records and all(plain_success(f) for f in batch):
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
                        (d.id, d.attempt, d.lease_token, self.owner, f.started, f.duration,
                         label, mark[6], mark[5], result.response, result.headers)
                    )  # fmt: skip
            if log_rows:
                await store.outbox_attempts_insert(conn, log_rows)
            await self._endpoints_health(conn, batch, labels, now)
            for f, mark, label in zip(batch, marks, labels, strict=True):
                if label == "exhausted":  # with the dead letter, in its transaction
                    await operational.attempt_exhausted(self.box, conn, f.d, f.result, mark[5])
        return labels

    async def _write_sent(self, batch: list[Finished], now: float) -> list[str]:
        """PostgreSQL, a batch of plain successes outside run()'s loop (run_once, a
        stopping loop, a lease that failed): ``outbox_lease`` for no slot, which only
        records (the rows, the attempt log, the endpoints' streaks): one round trip,
        one commit."""
        _, written, _ = await lease_recording(
            self.box,
            owner=self.owner,
            slots=0,
            channels=[],
            lease_ttl=self.outbound.settings.lease_ttl,
            sent=[sent_row(f) for f in batch if f.result is not None],
        )
        return ["sent" if (f.d.id, f.d.lease_token) in written else "fenced" for f in batch]

    async def _endpoints_health(
        self, conn: Any, batch: list[Finished], labels: list[str], now: float
    ) -> None:
        """Endpoints that only succeeded in this batch: one statement clears their
        streaks; an endpoint with a failure in it gets its outcomes applied in order."""
        mixed: dict[str, list[tuple[Delivery, Result]]] = {}
        for f, label in zip(batch, labels, strict=True):
            if label != "fenced" and f.d.endpoint is not None and f.result is not None:
                mixed.setdefault(f.d.endpoint.id, []).append((f.d, f.result))
        clean = sorted(e for e, rs in mixed.items() if all(r.outcome == "sent" for _, r in rs))
        # Endpoints announced failing when leased recover (once); the others only end
        # their runs. (A success carried to a lease only ends the run: a later one
        # recovers the endpoint.)
        failing = [e for e in clean if _failing(mixed[e])]
        if failing:
            await operational.endpoint_recovered(self.box, conn, failing, now=now)
            clean = [e for e in clean if e not in failing]
        if clean:
            await self.box.store.endpoints_succeeded(conn, clean, now=now)
        for endpoint_id in sorted(mixed):
            if endpoint_id not in clean and endpoint_id not in failing:
                for d, result in mixed[endpoint_id]:
                    await self._endpoint_health(conn, d, result, now)

    async def _endpoint_health(self, conn: Any, d: Delivery, result: Result, now: float) -> None:
        """Track the endpoint's failure streak: announce each threshold of failures in a
        row it reaches (``relaybox.endpoint.failing``), its recovery after one; disable
        it on 410, or once it has failed without a success for ``disable_after``
        seconds."""
        assert d.endpoint is not None
        store = self.box.store
        if result.outcome == "sent":
            if d.endpoint.failing:
                await operational.endpoint_recovered(self.box, conn, [d.endpoint.id], now=now)
            else:
                await store.endpoint_succeeded(conn, d.endpoint.id, now=now)
            return
        streak = await store.endpoint_failed(conn, d.endpoint.id, now=now)
        if streak is not None:
            level = 0
            for threshold in self.outbound.settings.failing_thresholds:
                if threshold <= streak.failures:
                    level = threshold
            if level > streak.failing_level:
                await operational.endpoint_failing(
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

    def observe(
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
            "dispatcher": self.owner,
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


def plain_success(f: Finished) -> bool:
    """A success the lease may record (not one that ends an announced failure)."""
    return (
        f.result is not None
        and f.result.outcome == "sent"
        and f.decision.status == "sent"
        and not f.d.uncertain
        and (f.d.endpoint is None or not f.d.endpoint.failing)
    )


def _failing(outcomes: list[tuple[Delivery, Result]]) -> bool:
    target = outcomes[0][0].endpoint
    return target is not None and target.failing


def sent_row(f: Finished) -> tuple[Any, ...]:
    """A plain success as outbox_lease's columns of successes to record."""
    d, result = f.d, f.result
    assert result is not None
    return (d.id, d.lease_token, d.attempt, d.endpoint.id if d.endpoint else None,
            f.started, f.duration, result.status_code, result.error, result.response,
            result.headers)  # fmt: skip
