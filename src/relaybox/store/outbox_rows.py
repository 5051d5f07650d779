"""Records of the sending side that the store builds for the dispatcher: a leased
row as the channels take it (:class:`Delivery`, with its :class:`MessageBody` and its
endpoint's :class:`Target`), and what a lease may take (:class:`Lane`,
:class:`Fairness`, :func:`allocate`, the plan ``outbox_lease`` computes in SQL on
PostgreSQL and the SQLite store in Python)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "UNBOUNDED",
    "Delivery",
    "Fairness",
    "Lane",
    "MessageBody",
    "Target",
    "allocate",
]


@dataclass(frozen=True, slots=True)
class Target:
    """A webhook endpoint as the dispatcher loaded it for one attempt."""

    id: str
    tenant: str
    url: str
    signature: Literal["standard", "sha256"]
    timeout: float | None
    schedule: tuple[float, ...] | None
    secrets: tuple[str, ...] = ()
    locked: str | None = None  # why the secrets could not be opened (outbound.vault)

    def __repr__(self) -> str:  # never print secret material
        return f"Target(id={self.id!r}, tenant={self.tenant!r}, secrets=<{len(self.secrets)}>)"


@dataclass(frozen=True, slots=True)
class MessageBody:
    """A published message: its id (the ``webhook-id``) and the exact bytes to send."""

    id: str
    event_type: str
    body: bytes


@dataclass(frozen=True, slots=True)
class Delivery:
    """One attempt of one outbox row, handed to :meth:`Channel.deliver`."""

    id: int
    channel: str
    key: str
    """Stable across attempts: the idempotency key the destination deduplicates on."""
    payload: Any
    tenant: str | None
    attempt: int
    lease_token: int
    uncertain: bool
    deadline: float
    """Seconds this attempt may take: the channel's timeout, capped so the result is
    recorded before the lease runs out."""
    message: MessageBody | None = None
    endpoint: Target | None = None
    lane: str | None = None
    """Its lane (the endpoint id, or the channel for a handler's row)."""


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
