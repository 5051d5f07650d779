"""Which leased row a free slot of the dispatcher runs next (:class:`LaneScheduler`).

The dispatcher leases rows ahead of its slots; they wait here, per lane (a webhook
endpoint, or a channel), until a slot may start one. A lane runs at most its
allowance at once (its cap minus the leases other dispatchers held when this one
last leased there; no allowance known: ``limit``), and the webhook lanes of one
tenant together at most ``tenant_cap``. Rows are handed out round robin: tenant by
tenant (``turns``), and within a tenant lane by lane (``waiting``), so a freed slot
goes to whoever is next, never to its own lane's next row ahead of lanes waiting.
Both round-robin orders are hints, checked when a turn comes: a lane leaves
``waiting`` when it has no row or no room, a tenant leaves ``turns`` at its cap;
they come back when an attempt of theirs ends.

The scheduler does no I/O and never awaits: the dispatcher calls it from its event
loop only, so its state needs no lock.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable

from relaybox.store.dispatch_rows import Fairness
from relaybox.store.outbox_rows import Delivery

__all__ = ["LaneScheduler"]

_STALE_AFTER = 0.5
"""Seconds a row may wait here before its lease's remaining time is recounted."""

_MIN_LEASE_LEFT = 1.0
"""A row whose lease has less than this left when its turn comes is given back."""


class LaneScheduler:
    """The rows leased and waiting for a slot, and the attempts running, per lane
    and per tenant."""

    __slots__ = (
        "_clock",
        "_give_back",
        "allowed",
        "busy",
        "held",
        "held_n",
        "limit",
        "owner",
        "running",
        "t_held",
        "t_running",
        "tenant_cap",
        "tenant_hold",
        "turns",
        "waiting",
    )

    def __init__(
        self,
        *,
        limit: int,
        tenant_cap: int,
        tenant_hold: int,
        give_back: Callable[[Delivery], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        """Attempts a lane may run when no allowance is known (the slots)."""
        self.tenant_cap = tenant_cap
        self.tenant_hold = tenant_hold
        """Rows one tenant may have here, running or waiting (``tenant_cap`` times the
        lease-ahead factor when leasing ahead)."""
        self.running: dict[str, int] = {}
        self.allowed: dict[str, int] = {}
        self.held: dict[str, collections.deque[tuple[Delivery, float]]] = {}
        self.owner: dict[str, str | None] = {}  # lane -> its tenant, while it has rows here
        self.t_running: dict[str, int] = {}
        self.t_held: dict[str, int] = {}
        self.waiting: dict[str | None, dict[str, None]] = {}
        self.turns: dict[str | None, None] = {}
        self.held_n = 0  # rows waiting here
        self.busy = 0  # rows given to a slot and not yet finished
        self._give_back = give_back
        self._clock = clock

    # -- rows in ------------------------------------------------------------------

    def hold(self, d: Delivery, at: float, front: bool = False) -> str:
        """Keep ``d`` (leased at ``at``, monotonic) until a slot may run it; returns
        its lane. ``front``: ahead of the lane's other rows (one taken back)."""
        lane = d.lane or d.channel
        # A webhook lane is an endpoint (its id, never a channel's name) of the
        # row's tenant; a channel's lane is bounded by its own cap only.
        tenant = d.tenant if lane != d.channel else None
        self.owner[lane] = tenant
        queue = self.held.get(lane)
        if queue is None:
            queue = self.held[lane] = collections.deque()
        if front:
            queue.appendleft((d, at))
        else:
            queue.append((d, at))
        self.held_n += 1
        if tenant is not None:
            self.t_held[tenant] = self.t_held.get(tenant, 0) + 1
            self.t_running.setdefault(tenant, 0)
        return lane

    def leased(self, found: list[Delivery], allowances: dict[str, int], now: float) -> None:
        """A lease came back: its rows wait for slots; lanes with a new allowance
        may have room now."""
        self.allowed.update(allowances)
        lanes = dict.fromkeys(allowances)
        for d in found:
            lanes[self.hold(d, now)] = None
        for lane in lanes:
            self.mark_ready(lane)

    def mark_ready(self, lane: str) -> None:
        """``lane`` takes its turn again if it has rows and room."""
        if lane in self.held and self.room(lane):
            tenant = self.owner.get(lane)
            self.waiting.setdefault(tenant, {})[lane] = None
            if self.tenant_room(tenant):
                self.turns[tenant] = None

    # -- rows out -----------------------------------------------------------------

    def room(self, lane: str) -> bool:
        return self.running.get(lane, 0) < self.allowed.get(lane, self.limit)

    def tenant_room(self, tenant: str | None) -> bool:
        return tenant is None or self.t_running.get(tenant, 0) < self.tenant_cap

    def next_row(self) -> Delivery | None:
        """A held row that may start, counted as running: the next tenant's in turn,
        of its next lane. ``None``: no row may start now."""
        turns, waiting = self.turns, self.waiting
        while turns:
            tenant = next(iter(turns))
            del turns[tenant]
            if not self.tenant_room(tenant):
                continue  # its turn again when one of its attempts ends
            lanes = waiting.get(tenant)
            d = None
            while lanes and d is None:
                lane = next(iter(lanes))
                del lanes[lane]
                if lane not in self.held or not self.room(lane):
                    continue  # waiting again when it has rows and room
                d = self._take(lane, tenant)
                if lane in self.held and self.room(lane):
                    lanes[lane] = None  # its turn again after the tenant's others
            if lanes:
                if self.tenant_room(tenant):
                    turns[tenant] = None  # its turn again after the other tenants
            else:
                waiting.pop(tenant, None)
            if d is not None:
                return d
        return None

    def _take(self, lane: str, tenant: str | None) -> Delivery | None:
        """The lane's next held row, counted as running; ``None``: none left (a row
        whose lease ran too short while it waited is given back instead)."""
        queue = self.held.get(lane)
        while queue:
            d, at = queue.popleft()
            self.held_n -= 1
            if tenant is not None:
                self.t_held[tenant] -= 1
            waited = self._clock() - at
            if waited > _STALE_AFTER:  # the lease runs out as it did: so must the attempt
                if d.deadline - waited < _MIN_LEASE_LEFT:
                    self._give_back(d)
                    continue
                d = dataclasses.replace(d, deadline=d.deadline - waited)
            if not queue:
                del self.held[lane]
            self.running[lane] = self.running.get(lane, 0) + 1
            if tenant is not None:
                self.t_running[tenant] = self.t_running.get(tenant, 0) + 1
            self.busy += 1
            return d
        self.held.pop(lane, None)
        return None

    def untake(self, d: Delivery, now: float) -> None:
        """``d`` came from :meth:`next_row` but no slot took it: back to its lane's
        front, no longer counted as running."""
        lane = d.lane or d.channel
        tenant = self.owner.get(lane)
        self.running[lane] -= 1
        self.busy -= 1
        if tenant is not None:
            self.t_running[tenant] -= 1
        self.hold(d, now, front=True)
        self.mark_ready(lane)

    def finished(self, lane: str) -> None:
        """An attempt of ``lane`` ended: its lane and tenant may have room again."""
        self.busy -= 1
        running = self.running
        running[lane] -= 1
        tenant = self.owner.get(lane)
        if tenant is not None:
            self.t_running[tenant] -= 1
            if self.waiting.get(tenant) and self.t_running[tenant] < self.tenant_cap:
                self.turns[tenant] = None
        if lane in self.held:
            self.mark_ready(lane)
        elif not running[lane]:  # nothing of it here any more: forget it
            del running[lane]
            self.allowed.pop(lane, None)
            self.owner.pop(lane, None)
            if tenant is not None and not self.t_running[tenant] and not self.t_held[tenant]:
                del self.t_running[tenant], self.t_held[tenant]

    def drain(self) -> list[Delivery]:
        """Every row still waiting (the dispatcher stops: they go back unstarted)."""
        rows = [d for queue in self.held.values() for d, _ in queue]
        self.held.clear()
        self.held_n = 0
        return rows

    def fairness(self, cap: int) -> Fairness:
        """The next lease's bounds: lanes' caps, and per tenant the rows it may still
        hold (``tenant_hold`` minus those running or held here)."""
        hold, t_held = self.tenant_hold, self.t_held
        return Fairness(
            cap=cap,
            rows=hold,
            held={t: hold - n - t_held[t] for t, n in self.t_running.items()},
        )
