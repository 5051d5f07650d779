"""The database's clock as a process reads it (:class:`DatabaseClock`), and what the
guard (:class:`ClockGuard`) does with the offset: a metric, a log line, no work past
``clock_max_skew``."""

from __future__ import annotations

import pytest

from relaybox import FrozenClock, Relaybox
from relaybox.clock import ClockGuard, DatabaseClock
from relaybox.config import Settings


class Fake:
    """A wall clock and a monotonic clock that move only when told to."""

    def __init__(self, wall: float, mono: float = 100.0) -> None:
        self.wall, self.mono = wall, mono

    def advance(self, seconds: float, *, wall_step: float = 0.0) -> None:
        self.mono += seconds
        self.wall += seconds + wall_step


async def test_now_is_the_databases_time_advanced_by_the_monotonic_clock() -> None:
    host = Fake(wall=1_000.0)
    clock = DatabaseClock(wall=lambda: host.wall, monotonic=lambda: host.mono)
    assert not clock.synced and clock.now() == 1_000.0  # this host's until read

    async def read() -> float:
        host.advance(0.002)  # a 4 ms round trip, the server read in its middle
        db = host.wall + 60.0  # the database's clock is 60 s ahead of this host's
        host.advance(0.002)
        return db

    offset = await clock.sync(read)
    assert offset == pytest.approx(60.0, abs=1e-9)
    assert clock.uncertainty == pytest.approx(0.002)
    assert clock.now() == pytest.approx(host.wall + 60.0, abs=1e-6)
    # The wall clock stepped back 30 s: the database's time goes on regardless.
    host.advance(5.0, wall_step=-30.0)
    assert clock.now() == pytest.approx(host.wall + 90.0, abs=1e-6)


async def test_the_read_with_the_shortest_round_trip_is_kept() -> None:
    host = Fake(wall=1_000.0)
    clock = DatabaseClock(wall=lambda: host.wall, monotonic=lambda: host.mono)
    trips = iter([0.5, 0.01, 0.3])

    async def read() -> float:
        half = next(trips) / 2
        host.advance(half)
        db = host.wall
        host.advance(half)
        return db

    assert await clock.sync(read) == pytest.approx(0.0, abs=1e-9)
    assert clock.uncertainty == pytest.approx(0.005)


async def test_a_box_with_its_own_clock_or_on_sqlite_reads_no_database_clock(
    tmp_path: object,
) -> None:
    frozen = Relaybox(settings=Settings(database_url="sqlite:///:memory:"), clock=FrozenClock())
    default = Relaybox(settings=Settings(database_url="sqlite:///:memory:"))
    try:
        for box in (frozen, default):
            guard = ClockGuard(box)
            assert not guard.applies
            assert await guard.check()  # allowed, and no statement ran
    finally:
        await frozen.close()
        await default.close()
