"""What the dispatcher's statements take and return: a lease's request, the plan it
computes and what it brings back (:class:`LeaseRequest`, :class:`Lane`,
:class:`Fairness`, :func:`allocate`, :class:`Leased`), and one finished attempt
(:class:`Attempt`), the one record that goes from the moment a channel's
:class:`Result` is known to the statements that write it.

An attempt is written by one of two statements, both fed by :func:`attempt_columns`:
``outbox_lease`` (PostgreSQL; a plain success carried to the dispatcher's next lease,
:attr:`LeaseRequest.sent`) or ``outbox_record`` with ``outbox_attempts_insert``
(:meth:`~relaybox.store.dispatch.DispatchStore.outbox_record`: everything else, and
every attempt on SQLite). Each backend passes the columns as it takes lists (arrays on
PostgreSQL, JSON text on SQLite)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from relaybox.store.outbox_rows import Delivery

__all__ = [
    "UNBOUNDED",
    "Attempt",
    "AttemptColumns",
    "Decision",
    "Fairness",
    "Lane",
    "LeaseRequest",
    "Leased",
    "Outcome",
    "Result",
    "allocate",
    "attempt_columns",
    "attempt_log",
]

Outcome = Literal["sent", "retry", "failed", "gone", "blocked"]
"""``sent``: done. ``retry``: transient, try again on the schedule. ``failed``:
permanent, dead letter now. ``gone``: the destination said it no longer exists (410);
the endpoint is disabled. ``blocked``: relaybox refused the destination itself (the
SSRF guard, a URL it cannot use): dead letter now, nothing was sent."""


@dataclass(frozen=True, slots=True)
class Result:
    """What one attempt of a channel came to (:meth:`Channel.deliver` returns it)."""

    outcome: Outcome
    status_code: int | None = None
    error: str | None = None
    response: str | None = None
    """The first bytes of the answer (for the attempt log)."""
    retry_after: float | None = None
    """Seconds the destination asked us to wait (``Retry-After``), if any."""
    timed_out: bool = False
    """No answer within the timeout (metrics tell timeouts from network errors)."""
    headers: str | None = None
    """The request and response headers, as the attempt log keeps them (JSON text:
    ``{"request": [[name, value], …], "response": […]}``), or ``None``."""


@dataclass(frozen=True, slots=True)
class Decision:
    """What a row becomes: ``sent``, ``retry`` (at ``at``), ``dead`` or ``held``
    (with ``reason``); ``label`` is the attempt log's outcome."""

    status: str
    label: str
    reason: str | None = None
    at: float | None = None


_UNKNOWN = "outcome unknown: a dispatcher's lease expired; review, then redeliver"
_EXPIRED = "the lease expired before the outcome was recorded"
_UNCERTAIN = Decision("retry", "uncertain")
"""The log's entry for the attempt before an uncertain one (:func:`attempt_log`)."""


@dataclass(frozen=True, slots=True)
class Attempt:
    """One finished attempt of a leased row: the delivery as leased, what its channel
    returned (``None``: no attempt was made: the row is held, accepted or out of
    attempts), what the row becomes, which dispatcher ran it, when it started (the
    box's clock) and how long it took (seconds)."""

    delivery: Delivery
    result: Result | None
    decision: Decision
    dispatcher: str | None
    started: float
    duration: float

    @property
    def error(self) -> str | None:
        """The row's ``last_error`` (and the attempt log's error): the channel's, or
        why no attempt was made."""
        decision, result = self.decision, self.result
        if decision.status == "held":
            return _UNKNOWN
        if decision.status != "retry" and decision.label == "exhausted" and result is None:
            return f"attempt {self.delivery.attempt - 1} did not finish: the dispatcher died"
        return result.error if result is not None else None

    @property
    def key(self) -> tuple[int, int]:
        """(row id, lease token): how the statements that write it report it written."""
        return self.delivery.id, self.delivery.lease_token


@dataclass(frozen=True, slots=True)
class AttemptColumns:
    """Attempts as one list per column, element i of each the i-th attempt: what the
    statements that write them take (``unnest`` on PostgreSQL, ``json_each`` on
    SQLite). ``status`` is the row's (``pending`` for a retry), ``outcome`` the
    attempt log's."""

    id: list[int]
    lease_token: list[int]
    attempt: list[int]
    endpoint_id: list[str | None]
    dispatcher: list[str | None]
    started: list[float]
    duration: list[float]
    status: list[str]
    next_at: list[float | None]
    reason: list[str | None]
    outcome: list[str]
    status_code: list[int | None]
    error: list[str | None]
    response: list[str | None]
    headers: list[str | None]


def attempt_columns(attempts: Sequence[Attempt]) -> AttemptColumns:
    """The one marshalling of attempts into statement parameters, for every statement
    that writes them (each takes the columns it needs). A column a comprehension: the
    lease runs this for every success it carries."""
    ds = [a.delivery for a in attempts]
    results = [a.result for a in attempts]
    decisions = [a.decision for a in attempts]
    return AttemptColumns(
        id=[d.id for d in ds],
        lease_token=[d.lease_token for d in ds],
        attempt=[d.attempt for d in ds],
        endpoint_id=[d.endpoint.id if d.endpoint is not None else None for d in ds],
        dispatcher=[a.dispatcher for a in attempts],
        started=[a.started for a in attempts],
        duration=[a.duration for a in attempts],
        status=["pending" if c.status == "retry" else c.status for c in decisions],
        next_at=[c.at for c in decisions],
        reason=[c.reason for c in decisions],
        outcome=[c.label for c in decisions],
        status_code=[r.status_code if r is not None else None for r in results],
        # Attempt.error, inlined for an attempt made: the channel's error, unless held
        error=[
            a.error if r is None or c.status == "held" else r.error
            for a, r, c in zip(attempts, results, decisions, strict=True)
        ],
        response=[r.response if r is not None else None for r in results],
        headers=[r.headers if r is not None else None for r in results],
    )


def attempt_log(
    attempts: Sequence[Attempt], written: Collection[tuple[int, int]], now: float
) -> list[Attempt]:
    """What the attempt log keeps of attempts whose outcomes were recorded (``written``,
    by :attr:`Attempt.key`), in order: for a row whose previous lease expired
    unrecorded, that attempt first (``uncertain``, no dispatcher, at ``now``); then
    each attempt a channel made, ``fenced`` when its outcome was not written (another
    dispatcher had taken the row over)."""
    log: list[Attempt] = []
    for a in attempts:
        d = a.delivery
        if d.uncertain:
            before = dataclasses.replace(
                d, attempt=d.attempt - 1, lease_token=d.lease_token - 1, uncertain=False
            )
            log.append(Attempt(before, Result("retry", error=_EXPIRED), _UNCERTAIN, None, now, 0.0))
        if a.result is not None:
            if a.key not in written:
                a = dataclasses.replace(a, decision=dataclasses.replace(a.decision, label="fenced"))
            log.append(a)
    return log


@dataclass(frozen=True)
class Lane:
    lane: str
    max_in_flight: int
    rate_limit: float | None
    tokens: float
    refilled_at: float
    in_flight: int
    tenant: str | None = None
    """The endpoint's tenant; ``None`` for a channel's lane (no tenant bound)."""

    def room(self, now: float) -> tuple[int, float]:
        """(rows it may take now, tokens in its bucket now). The bucket holds at most
        one second of its rate (at least one token): bursts stay small."""
        room = self.max_in_flight - self.in_flight
        if self.rate_limit is None:
            return room, 1.0
        refill = (now - self.refilled_at) * self.rate_limit
        tokens = min(max(1.0, self.rate_limit), self.tokens + refill)
        return min(room, int(tokens)), tokens


@dataclass(frozen=True)
class Fairness:
    """What one lease may take per tenant and per lane: every lane's cap is at most
    ``cap`` (the dispatcher's concurrency), and one tenant's lanes take at most
    ``rows`` rows, or ``held[tenant]`` for a tenant listed there (what the dispatcher
    already holds of it counted; 0: none, its lanes are not even looked at)."""

    cap: int = 2**31 - 1
    rows: int = 2**31 - 1
    held: Mapping[str, int] = field(default_factory=dict)

    def full(self) -> list[str]:
        return sorted(t for t, n in self.held.items() if n <= 0)


UNBOUNDED = Fairness()


def allocate(
    lanes: Sequence[Lane], slots: int, now: float, fair: Fairness = UNBOUNDED
) -> dict[str, int]:
    """Share ``slots`` among ``lanes`` in order: one row per lane per round, within
    each lane's room; a tenant's turns are numbered over its lanes' rounds (at most
    ``fair``'s rows for it), and turns go tenant by tenant (``outbox_lease``'s plan)."""
    entries: list[tuple[int, int, int, str]] = []  # (turn, round, lane order, lane)
    turns: dict[tuple[str | None, str | None], int] = {}
    room = {lane.lane: min(lane.room(now)[0], fair.cap - lane.in_flight) for lane in lanes}
    most = max(room.values(), default=0)
    for rnd in range(1, most + 1):
        for order, lane in enumerate(lanes):
            if room[lane.lane] < rnd:
                continue
            group = (lane.tenant, None if lane.tenant is not None else lane.lane)
            turn = turns[group] = turns.get(group, 0) + 1
            if lane.tenant is not None and turn > fair.held.get(lane.tenant, fair.rows):
                continue
            entries.append((turn, rnd, order, lane.lane))
    entries.sort()
    plan: dict[str, int] = {}
    for _, _, _, name in entries[: max(slots, 0)]:
        plan[name] = plan.get(name, 0) + 1
    return plan


@dataclass(frozen=True, slots=True)
class LeaseRequest:
    """One lease: up to ``slots`` due rows of ``channels`` for ``owner`` until
    ``until``; each delivery may take ``deadline`` seconds. ``sent``: plain successes
    to record with the lease (their dispatcher is ``owner``), ``ahead``: channels whose lanes may be
    leased up to ``factor`` times their cap (both only where the store
    :attr:`~OutboxStore.lease_records`)."""

    owner: str
    slots: int
    channels: Sequence[str]
    now: float
    until: float
    deadline: float
    fair: Fairness = UNBOUNDED
    sent: Sequence[Attempt] = ()
    ahead: Sequence[str] = ()
    factor: int = 1


@dataclass(frozen=True, slots=True)
class Leased:
    """A lease's deliveries (by id), the (id, lease token) pairs its ``sent`` wrote
    (the others were fenced), and per lane leased how many attempts the dispatcher may
    run in it at once (empty: as many as were leased)."""

    deliveries: list[Delivery]
    written: set[tuple[int, int]]
    allowed: dict[str, int]
