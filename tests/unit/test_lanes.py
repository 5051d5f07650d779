"""The dispatcher's lane scheduler, without a database or an event loop."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from relaybox.outbound.channels.base import Delivery
from relaybox.outbound.lanes import LaneScheduler

_ids = itertools.count(1)


def row(lane: str, tenant: str | None = "t", deadline: float = 30.0) -> Delivery:
    return Delivery(
        id=next(_ids),
        channel="webhook",
        key="k",
        payload=None,
        tenant=tenant,
        attempt=1,
        lease_token=1,
        uncertain=False,
        deadline=deadline,
        lane=lane,
    )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


GIVEN_BACK: list[Delivery] = []


def scheduler(limit: int = 10, tenant_cap: int = 10, clock: Clock | None = None) -> LaneScheduler:
    GIVEN_BACK.clear()
    return LaneScheduler(
        limit=limit,
        tenant_cap=tenant_cap,
        tenant_hold=tenant_cap,
        give_back=GIVEN_BACK.append,
        clock=clock or Clock(),
    )


def drain_all(s: LaneScheduler) -> list[Delivery]:
    out = []
    while (d := s.next_row()) is not None:
        out.append(d)
    return out


def test_lanes_take_turns_within_a_tenant() -> None:
    s = scheduler()
    s.leased([row("a"), row("a"), row("a"), row("b"), row("b")], {}, 0.0)
    lanes = [d.lane for d in drain_all(s)]
    assert lanes == ["a", "b", "a", "b", "a"]


def test_tenants_take_turns_before_lanes() -> None:
    s = scheduler()
    s.leased([row("a1", "A"), row("a2", "A"), row("a1", "A"), row("b1", "B")], {}, 0.0)
    tenants = [d.tenant for d in drain_all(s)]
    assert tenants[:2] == ["A", "B"]
    assert sorted(tenants) == ["A", "A", "A", "B"]


def test_a_lane_runs_at_most_its_allowance() -> None:
    s = scheduler()
    s.leased([row("a") for _ in range(5)], {"a": 2}, 0.0)
    assert len(drain_all(s)) == 2
    s.finished("a")
    assert len(drain_all(s)) == 1
    assert s.running["a"] == 2 and s.held_n == 2


def test_a_tenant_runs_at_most_its_cap_and_others_go_on() -> None:
    s = scheduler(tenant_cap=2)
    s.leased([row(f"a{i}", "A") for i in range(5)] + [row("b", "B")], {}, 0.0)
    started = drain_all(s)
    assert [d.tenant for d in started].count("A") == 2
    assert [d.tenant for d in started].count("B") == 1
    s.finished(started[0].lane or "")
    assert [d.tenant for d in drain_all(s)] == ["A"]


def test_a_row_that_waited_too_long_is_given_back() -> None:
    clock = Clock()
    s = scheduler(clock=clock)
    stale, fresh = row("a", deadline=1.2), row("a", deadline=30.0)
    s.leased([stale, fresh], {}, 0.0)
    clock.now = 0.6  # 1.2 - 0.6 < 1 s left: given back; the other has its deadline cut
    [d] = drain_all(s)
    assert GIVEN_BACK == [stale]
    assert d.id == fresh.id and abs(d.deadline - 29.4) < 1e-9


def test_untake_puts_a_row_back_in_front() -> None:
    s = scheduler()
    first, second = row("a"), row("a")
    s.leased([first, second], {}, 0.0)
    d = s.next_row()
    assert d is first
    s.untake(d, 0.0)
    assert s.busy == 0 and s.held_n == 2
    assert s.next_row() is first


def test_fairness_counts_what_each_tenant_holds() -> None:
    s = scheduler(tenant_cap=4)
    s.leased([row("a", "A"), row("a", "A"), row("b", "B")], {}, 0.0)
    s.next_row()
    fair = s.fairness(cap=10)
    assert fair.rows == 4 and fair.cap == 10
    assert fair.held == {"A": 2, "B": 3}


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(st.tuples(st.sampled_from("abcd"), st.sampled_from("XY")), max_size=40),
    caps=st.dictionaries(st.sampled_from("abcd"), st.integers(1, 3)),
    tenant_cap=st.integers(1, 5),
    finish=st.lists(st.integers(0, 100), max_size=60),
)
def test_bounds_hold_and_nothing_is_lost(
    rows: list[tuple[str, str]], caps: dict[str, int], tenant_cap: int, finish: list[int]
) -> None:
    """Whatever the order of leases and finishes: no lane above its allowance, no
    tenant above its cap, and every row runs exactly once."""
    s = scheduler(limit=100, tenant_cap=tenant_cap)
    lane_tenant = {lane: tenant for lane, tenant in rows}  # a lane has one tenant
    s.leased([row(lane, lane_tenant[lane]) for lane, _ in rows], caps, 0.0)
    running: list[Delivery] = []
    seen: list[int] = []
    steps = iter(finish)
    while True:
        running += drain_all(s)
        for lane, n in s.running.items():
            assert n <= caps.get(lane, 100)
        assert all(n <= tenant_cap for n in s.t_running.values())
        if not running:
            break
        d = running.pop(next(steps, 0) % len(running))
        seen.append(d.id)
        s.finished(d.lane or "")
    assert len(seen) == len(rows) == len(set(seen))
    assert s.busy == 0 and s.held_n == 0 and not s.running
