"""Outcome recording: what became of an event's attempt (its kind), written in the
attempt's transaction (:meth:`OutcomeRecorder.record`: reschedule with backoff, dead
letters, the attempts history), and its log line and metric once that transaction
commits (:meth:`OutcomeRecorder.report`)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox import tracing
from relaybox.inbound.worker.context import Handling
from relaybox.retry import Backoff
from relaybox.store import InboxEvent
from relaybox.store.inbox_rows import NewAttempt

if TYPE_CHECKING:
    from relaybox.clock import Clock
    from relaybox.metrics import Metrics
    from relaybox.runtime import Announce, AnnounceSync
    from relaybox.store import Store

log = structlog.get_logger("relaybox.worker")


@dataclass
class _Outcome:
    kind: str  # done | retry | invalid | exhausted | conflict | unhandled | contended
    error: str | None = None
    outbox_created: bool = False  # wake the dispatchers once this commits
    aborted: bool = False  # the transaction was aborted already (maybe by another handler)


@dataclass(slots=True)
class _Plan:
    """What recording an attempt's outcome writes: a new time (``retry_at``), dead
    letters (``dead``: ``kind`` is the reason), an attempts-history row; and, once
    that commits, its log line (``fields``) and metric (``source``, ``kind``):
    :meth:`OutcomeRecorder.report`."""

    source: str
    kind: str
    error: str
    raw_error: str | None
    now: float
    started: float
    retry_at: float | None
    history: bool
    fields: dict[str, Any]

    @property
    def dead(self) -> bool:
        return self.kind in ("invalid", "exhausted", "conflict", "unhandled")

    def attempt_row(self, event: InboxEvent, worker: str) -> NewAttempt:
        """The row of the attempts history (the store's ``attempt_insert``)."""
        return NewAttempt(
            inbox_id=event.id,
            attempt=event.attempts,
            outcome=self.kind,
            error=self.raw_error,
            worker=worker,
            started_at=self.started,
            finished_at=self.now,
        )


class _NotOurs(Exception):
    """The row is no longer pending at the attempt this worker started."""


class _RolledBack(Exception):
    """Leaves the event's transaction so that its effect rolls back."""

    def __init__(self, ctx: Handling, outcome: _Outcome) -> None:
        self.ctx = ctx
        self.outcome = outcome


def dead_event(
    inbox_id: int, key: tuple[str, str, str], event_type: str | None, tenant: str | None
) -> dict[str, Any]:
    """The ``data`` of ``relaybox.inbox.dead`` (reason, attempts and error added)."""
    source, account, event_id = key
    return {
        "inboxId": inbox_id,
        "source": source,
        "account": account,
        "eventId": event_id,
        "eventType": event_type,
        "tenant": tenant,
    }


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


@dataclass(eq=False)
class OutcomeRecorder:
    """Records what became of one worker's attempts (``worker``: its name, in the
    attempts history): the writes in the attempt's transaction (:meth:`record` on an
    async connection, :meth:`write_sync` on a synchronous one, both from one
    :meth:`plan`), and the log line and metric once it commits (:meth:`report`). The
    worker's runners hold it and call it; it calls none of them."""

    store: Store
    clock: Clock
    metrics: Metrics
    announce: Announce
    """Publishes ``relaybox.inbox.dead`` with the dead letter (the receiving side's
    announcer, ``box.inbound.announce``)."""
    announce_sync: AnnounceSync
    """The same in a synchronous transaction (plain-def handlers)."""
    backoff: Backoff
    rng: random.Random
    worker: str
    _counters: dict[tuple[str, str], Any] = field(default_factory=dict, init=False, repr=False)

    def _count(self, source: str, label: str) -> None:
        counter = self._counters.get((source, label))
        if counter is None:
            counter = self._counters[(source, label)] = self.metrics.processed.labels(source, label)
        counter.inc()

    async def record(
        self,
        conn: AsyncConnection,
        event: InboxEvent,
        ctx: Handling,
        outcome: _Outcome,
        started: float,
        reports: list[_Plan] | None = None,
    ) -> None:
        """Write the outcome in ``conn``'s transaction. Its plan goes to ``reports``
        when given, for the caller to emit once the transaction commits
        (:meth:`report`); otherwise now."""
        plan = self.plan(event, ctx, outcome, started)
        if ctx._trace is not None:  # the decision, a child of the handler's span
            with tracing.span("relaybox.outcome", parent=ctx._trace, link=False) as span:
                span.set_attributes(outcome_attributes(plan))
                await self._write_plan(conn, event, plan)
        else:
            await self._write_plan(conn, event, plan)
        if reports is None:
            self.report([plan])
        else:
            reports.append(plan)

    async def _write_plan(self, conn: AsyncConnection, event: InboxEvent, plan: _Plan) -> None:
        store = self.store
        if plan.retry_at is not None:
            await store.inbox.retry_later(
                conn, event.id, at=plan.retry_at, error=plan.error, now=plan.now
            )
        if plan.dead:
            await store.inbox.kill(conn, event.id, reason=plan.kind, error=plan.error, now=plan.now)
            # relaybox.inbox.dead, with the dead letter (relaybox.outbound.announce)
            data = self._dead_letter(event, plan)
            await self.announce(conn, "relaybox.inbox.dead", data, inbox_id=event.id)
        if plan.history:
            await store.inbox.attempt_insert(conn, plan.attempt_row(event, self.worker))

    @staticmethod
    def _dead_letter(event: InboxEvent, plan: _Plan) -> dict[str, Any]:
        """The ``data`` of ``relaybox.inbox.dead`` for ``event`` dead-lettered by ``plan``."""
        data = dead_event(event.id, event.key, event.event_type, event.tenant)
        data.update(reason=plan.kind, attempts=event.attempts, error=plan.raw_error)
        return data

    def write_sync(self, conn: Connection, event: InboxEvent, plan: _Plan) -> None:
        """:meth:`record`'s writes on a synchronous connection (plain-def handlers)."""
        store = self.store.sync
        if plan.retry_at is not None:
            store.inbox.retry_later(
                conn, event.id, at=plan.retry_at, error=plan.error, now=plan.now
            )
        if plan.dead:
            store.inbox.kill(conn, event.id, reason=plan.kind, error=plan.error, now=plan.now)
            data = self._dead_letter(event, plan)
            self.announce_sync(conn, "relaybox.inbox.dead", data, inbox_id=event.id)
        if plan.history:
            store.inbox.attempt_insert(conn, plan.attempt_row(event, self.worker))

    def plan(self, event: InboxEvent, ctx: Handling, outcome: _Outcome, started: float) -> _Plan:
        """What recording ``outcome`` writes (the same for every kind of handler and
        transaction; :meth:`record` writes it on an async connection)."""
        now = self.clock.now()
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
        at = None
        if kind == "retry":
            at = self.backoff.next_attempt(
                attempt=event.attempts, received_at=event.received_at, now=now, rng=self.rng
            )
            if at is None:
                kind = "exhausted"
            else:
                fields["next_attempt_in"] = round(at - now, 3)
        return _Plan(
            source=event.source,
            kind=kind,
            error=outcome.error or "",
            raw_error=outcome.error,
            now=now,
            started=started,
            retry_at=at,
            # The row itself records a first-try success (done_at, attempts = 1); the
            # attempts table keeps the history of events that needed more than one.
            history=kind != "done" or event.attempts > 1,
            fields=fields,
        )

    def report(self, reports: list[_Plan]) -> None:
        """Log lines and metrics of recorded outcomes (after their COMMIT)."""
        for plan in reports:
            kind = plan.kind
            label = "done" if kind == "done" else ("retry" if kind == "retry" else f"dead_{kind}")
            self._count(plan.source, label)
            if kind == "done":
                log.info("event_done", **plan.fields)
            elif kind == "retry":
                log.warning("event_retry", error=plan.raw_error, **plan.fields)
            else:
                log.error("event_dead", reason=kind, error=plan.raw_error, **plan.fields)


def outcome_attributes(plan: _Plan) -> dict[str, str | float | bool]:
    """The attributes of an attempt's ``relaybox.outcome`` span: the decision, and the
    retry's delay in seconds (the error's text stays in the database)."""
    attributes: dict[str, str | float | bool] = {
        "relaybox.outcome": plan.kind,
        "relaybox.dead": plan.dead,
    }
    if plan.retry_at is not None:
        attributes["relaybox.retry.delay"] = round(plan.retry_at - plan.now, 3)
    return attributes
