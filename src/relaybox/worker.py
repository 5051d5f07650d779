"""Processing the inbox: claim due rows, run handlers, commit effect and completion together.

One batch is two short phases:

1. **claim** (its own transaction): count one more attempt on up to ``batch`` due rows
   and hold them back ``claim_hold`` seconds. The attempt is durable *before* any
   handler runs, so an event that kills its worker (segfault, SIGKILL, OOM) still uses
   its budget; its row comes back after the hold, and once the budget is used up the
   next claim dead-letters it as ``exhausted`` instead of running it again.
2. **process** (one transaction holding the rows' locks until COMMIT): each event runs
   in a SAVEPOINT; the handler's own writes, its business keys, its outbox rows and
   the row's completion commit together, or roll back together. A failing event rolls
   back only its savepoint: transient errors reschedule it (backoff + jitter), a
   :class:`~relaybox.errors.PermanentError` sends it to dead letters as ``invalid``.

No remote call happens inside phase 2: handlers record outgoing actions in the outbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox import projections
from relaybox.errors import OperationConflict, PermanentError
from relaybox.log import error_text, short_error
from relaybox.retry import Backoff
from relaybox.store import InboxEvent

if TYPE_CHECKING:
    from relaybox.app import Relaybox

__all__ = ["Context", "Handler", "Hooks", "Outbox", "Worker"]

log = structlog.get_logger("relaybox.worker")

Handler = Callable[["Context"], Awaitable[None]]


class Outbox:
    """Outgoing actions recorded in the handler's transaction."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx

    async def add(self, channel: str, key: str, payload: Any) -> bool:
        """Record an outgoing action once per ``(channel, key)``; return whether it
        was new. It is delivered after COMMIT by the dispatcher, never before."""
        ctx = self._ctx
        created = await ctx.box.store.outbox_insert(
            ctx.conn,
            channel=channel,
            key=key,
            payload=json.dumps(payload),
            tenant=ctx.event.tenant,
            inbox_id=ctx.event.id,
            now=ctx.box.clock.now(),
        )
        ctx.outbox_keys.append(f"{channel}:{key}")
        if created is not None and ctx.box.store.backend == "sqlite":
            # PostgreSQL notifies within outbox_insert itself; SQLite wakes in-process.
            await ctx.box.store.notify(ctx.conn, "outbox")
        return created is not None


@dataclass
class Context:
    """What a handler gets: the event and the transaction it runs in."""

    box: Relaybox
    conn: AsyncConnection
    event: InboxEvent
    business_keys: list[str] = field(default_factory=list)
    outbox_keys: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.outbox = Outbox(self)
        self._payload: Any = None

    @property
    def payload(self) -> Any:
        """The delivery's JSON body."""
        if self._payload is None:
            self._payload = self.event.json()
        return self._payload

    @property
    def tenant(self) -> str | None:
        return self.event.tenant

    async def once(self, business_key: str, *, fingerprint: str = "") -> bool:
        """Record that the operation named by ``business_key`` happens now.

        Returns ``True`` the first time (apply the effect), ``False`` when the
        operation already happened (skip it). The UNIQUE key in the operations table
        decides, so two workers racing on one key cannot both get ``True``. Raises
        :class:`OperationConflict` when the key exists with another ``fingerprint``
        (a different operation is reusing this key). Keys are kept forever.
        """
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
    kind: str  # done | retry | invalid | exhausted | conflict | unhandled
    error: str | None = None


class _RolledBack(Exception):
    """Leaves the event's transaction so that its effect rolls back."""

    def __init__(self, ctx: Context, outcome: _Outcome) -> None:
        self.ctx = ctx
        self.outcome = outcome


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
        self.batch = batch or s.batch
        # Events per transaction. PostgreSQL: one, so an event's row locks (a shared
        # balance, say) are held only for its own handler; a batch transaction holds
        # every event's locks until COMMIT and serialises (or deadlocks) concurrent
        # batches on hot rows (bench/README.md). SQLite: the whole claim, since its
        # single writer serialises anyway and one COMMIT (fsync) serves the batch.
        self.group = group or s.group or (self.batch if sqlite else 1)
        self._slots = asyncio.Semaphore(self.concurrency)
        self._isolation = asyncio.Lock()
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
        while not self._stopping.is_set():
            try:
                n = await self.run_once()
            except Exception as exc:  # the database went away: back off and retry
                log.warning("worker_batch_failed", worker=self.name, error=short_error(exc))
                n = 0
            if n == 0 and not self._stopping.is_set():
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.poll_interval)

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
        groups = [claim.ids[i : i + self.group] for i in range(0, len(claim.ids), self.group)]
        results = await asyncio.gather(
            *(self._process_group(ids) for ids in groups),
            *(self._process_suspect(inbox_id) for inbox_id in claim.suspects),
            return_exceptions=True,
        )
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            raise failures[0]
        return len(claim.ids) + len(claim.suspects) + len(claim.exhausted)

    async def _process_group(self, ids: list[int]) -> None:
        """At most ``concurrency`` of these run at once."""
        async with self._slots:
            await self._start_and_process(ids)

    async def _process_suspect(self, inbox_id: int) -> None:
        """A row whose last attempt never finished may be what killed its worker: run
        it with nothing else in flight in this process, so that if it kills this one
        too, only its own attempt is charged."""
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
        if not ids:
            return
        if self.group == 1:
            for inbox_id in ids:
                await self._process_alone(inbox_id)
        else:
            await self._process_batch(ids)

    async def _process_alone(self, inbox_id: int) -> None:
        """One event, one transaction, no savepoint: a failure rolls the whole
        transaction back (the effect), then a second short transaction records the
        outcome, only while the row is still pending (seed 000's retry rule)."""
        store = self.box.store
        started = self.box.clock.now()
        try:
            async with store.transaction() as conn:
                events = await store.inbox_lock(conn, [inbox_id])
                if not events:
                    return  # completed meanwhile by a late worker: nothing to do
                event = events[0]
                ctx, outcome = await self._run(conn, event, savepoint=False)
                if outcome.kind != "done":
                    raise _RolledBack(ctx, outcome)
                await self._record(conn, event, ctx, outcome, started)
                await store.inbox_complete(conn, [event.id], self.box.clock.now())
                await self.hooks.fire("before_commit", [event.id])
            await self.hooks.fire("after_commit", [event.id])
        except _RolledBack as failed:
            async with store.transaction() as conn:
                for event in await store.inbox_lock(conn, [inbox_id]):
                    await self._record(conn, event, failed.ctx, failed.outcome, started)
        except Exception as exc:
            # The COMMIT's answer may be lost: nothing is applied again here. The row
            # comes back after the hold, and its business keys say what happened.
            log.warning(
                "worker_commit_uncertain", worker=self.name, ids=[inbox_id], error=short_error(exc)
            )
            raise

    async def _process_batch(self, ids: list[int]) -> None:
        """Several events in one transaction, each in a savepoint (SQLite: one
        COMMIT, one fsync, for the whole group)."""
        store = self.box.store
        try:
            async with store.transaction() as conn:
                events = await store.inbox_lock(conn, ids)
                done: list[int] = []
                for event in events:
                    outcome = await self.process(conn, event)
                    if outcome.kind == "done":
                        done.append(event.id)
                if done:
                    await store.inbox_complete(conn, done, self.box.clock.now())
                await self.hooks.fire("before_commit", [e.id for e in events])
            await self.hooks.fire("after_commit", [e.id for e in events])
        except Exception as exc:
            log.warning(
                "worker_commit_uncertain", worker=self.name, ids=ids, error=short_error(exc)
            )
            raise

    async def process(self, conn: AsyncConnection, event: InboxEvent) -> _Outcome:
        """Run the handler for one locked event inside a savepoint, then record its
        outcome in the enclosing transaction. The caller marks ``done`` rows complete."""
        started = self.box.clock.now()
        ctx, outcome = await self._run(conn, event, savepoint=True)
        await self._record(conn, event, ctx, outcome, started)
        return outcome

    async def _run(
        self, conn: AsyncConnection, event: InboxEvent, *, savepoint: bool
    ) -> tuple[Context, _Outcome]:
        handler = self.box.handler_for(event.source, event.event_type)
        ctx = Context(self.box, conn, event)
        if handler is None:
            return ctx, _Outcome("unhandled", f"no handler for {event.source}/{event.event_type}")
        try:
            if savepoint:
                async with conn.begin_nested():
                    await handler(ctx)
            else:
                await handler(ctx)
            return ctx, _Outcome("done")
        except OperationConflict as exc:
            return ctx, _Outcome("conflict", str(exc))
        except PermanentError as exc:
            return ctx, _Outcome("invalid", str(exc) or type(exc).__name__)
        except Exception as exc:
            return ctx, _Outcome("retry", error_text(exc))

    async def _record(
        self,
        conn: AsyncConnection,
        event: InboxEvent,
        ctx: Context,
        outcome: _Outcome,
        started: float,
    ) -> None:
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
        label = "done" if kind == "done" else ("retry" if kind == "retry" else f"dead_{kind}")
        self.box.metrics.processed.labels(event.source, label).inc()
        if kind == "done":
            log.info("event_done", **fields)
        elif kind == "retry":
            log.warning("event_retry", error=outcome.error, **fields)
        else:
            log.error("event_dead", reason=kind, error=outcome.error, **fields)
