"""One injectable clock for backoff, timestamp tolerance, leases and retention, and
the database's clock for processes on several hosts.

Times are float seconds since the Unix epoch everywhere in relaybox, stored as
``double precision`` (PostgreSQL) and ``REAL`` (SQLite) so both backends compare
the same numbers. Tests use :class:`FrozenClock` and never sleep to prove a schedule.

Holds, leases, fencing and retry schedules are compared across every process that
shares a database, so on PostgreSQL they must come from one clock: a host whose
clock runs a minute ahead would see another host's holds as expired and take rows
still being worked. :class:`DatabaseClock` (a box's clock unless one is passed)
reads the database server's clock at start and every :data:`SYNC_INTERVAL` seconds
(:class:`ClockGuard`), and between two reads advances by this process's monotonic
clock: its ``now()`` is the database's time, whatever this host's wall clock says
or does (a step of the wall clock between two reads changes nothing). The offset it
measures (database minus this host) is the ``relaybox_clock_offset_seconds`` gauge;
past ``clock_max_skew`` the worker and the dispatcher take no work on this host and
say why. SQLite is one host: its own clock is the database's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import structlog

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = [
    "SYNC_INTERVAL",
    "Clock",
    "ClockGuard",
    "DatabaseClock",
    "FrozenClock",
    "SystemClock",
    "every",
    "may_take_work",
]

log = structlog.get_logger("relaybox.clock")

SYNC_INTERVAL = 10.0
"""Seconds between two reads of the database's clock: a process's monotonic clock
drifts by parts per million, microseconds in that time."""

_SAMPLES = 3
"""Reads per sync; the one with the shortest round trip is kept (its error is at most
half that round trip)."""


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()


class FrozenClock:
    """A clock that moves only when told to."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    def set(self, when: float) -> None:
        self._now = when


class DatabaseClock:
    """The database server's clock, as last read (:meth:`sync`), advanced by this
    process's monotonic clock since. Until the first read it is this host's clock
    (what a SQLite box, or a PostgreSQL box before its first sync, uses)."""

    def __init__(
        self,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._wall = wall
        self._monotonic = monotonic
        self._anchor: tuple[float, float] | None = None  # (database time, monotonic then)
        self.offset = 0.0
        """Database clock minus this host's, at the last sync (seconds)."""
        self.uncertainty = 0.0
        """Half the round trip of the read the last sync kept (seconds)."""
        self.guard: ClockGuard | None = None
        """The guard that keeps it read (:class:`ClockGuard` registers itself)."""

    @property
    def synced(self) -> bool:
        return self._anchor is not None

    def now(self) -> float:
        if self._anchor is None:
            return self._wall()
        db, mono = self._anchor
        return db + (self._monotonic() - mono)

    async def sync(self, read: Callable[[], Awaitable[float]], samples: int = _SAMPLES) -> float:
        """Read the database's clock ``samples`` times through ``read`` and anchor to
        the read with the shortest round trip; return the offset (database minus this
        host). Raises what ``read`` raises (the database is away)."""
        best: tuple[float, float, float, float] | None = None  # rtt, db, mono, wall
        for _ in range(samples):
            m0, w0 = self._monotonic(), self._wall()
            db = await read()
            m1, w1 = self._monotonic(), self._wall()
            rtt = m1 - m0
            if best is None or rtt < best[0]:
                best = (rtt, db, (m0 + m1) / 2, (w0 + w1) / 2)
        assert best is not None
        rtt, db, mono, wall = best
        self._anchor = (db, mono)
        self.offset = db - wall
        self.uncertainty = rtt / 2
        return self.offset


class ClockGuard:
    """Keeps a box's :class:`DatabaseClock` in step with the database and says whether
    this host may take work (:meth:`check`): not while this host's clock is more than
    ``clock_max_skew`` seconds from the database's. A box with a clock of its own (a
    test's :class:`FrozenClock`) or on SQLite is always allowed and never reads."""

    def __init__(self, box: Runtime) -> None:
        self.box = box
        if isinstance(box.clock, DatabaseClock):
            box.clock.guard = self
        self._synced_at: float | None = None  # monotonic time of the last sync
        self._refusing = False
        self._stopped = False
        self._syncing: asyncio.Future[None] | None = None
        self._wake: asyncio.Event | None = None

    def _clock(self) -> DatabaseClock | None:
        clock = self.box.clock
        if not isinstance(clock, DatabaseClock) or not self.box.store.clock_from_database:
            return None
        return clock

    @property
    def applies(self) -> bool:
        """Whether this box reads the database's clock (PostgreSQL, no clock passed)."""
        return self._clock() is not None

    @property
    def refusing(self) -> bool:
        """Whether the last read found this host's clock past ``clock_max_skew``."""
        return self._refusing

    @property
    def max_skew(self) -> float:
        return self.box.settings.clock_max_skew

    async def check(self) -> bool:
        """Read the database's clock if the last read is older than
        :data:`SYNC_INTERVAL` (or there was none); whether this host's clock is within
        ``clock_max_skew`` of it. Raises the store's error while the database is away
        and the clock was never read (callers back off as for a failed claim)."""
        clock = self._clock()
        if clock is None:
            return True
        if self._synced_at is None or time.monotonic() - self._synced_at >= SYNC_INTERVAL:
            if self._syncing is None:  # callers at once share one sync
                self._syncing = asyncio.ensure_future(self._sync(clock))
                self._syncing.add_done_callback(self._synced)
            await asyncio.shield(self._syncing)
        return not self._refusing

    def _synced(self, _: asyncio.Future[None]) -> None:
        self._syncing = None

    async def _sync(self, clock: DatabaseClock) -> None:
        try:
            offset = await clock.sync(self.box.store.db_time)
        except Exception:
            if not clock.synced:
                raise
            # Read before: the monotonic clock carries on; try again next time.
            return
        self._synced_at = time.monotonic()
        self.box.metrics.observe_clock(offset, self.max_skew)
        over = abs(offset) > self.max_skew
        if over and not self._refusing:
            log.error(
                "clock_skew_exceeded",
                offset=round(offset, 3),
                clock_max_skew=self.max_skew,
                detail=(
                    "this host's clock is that far from the database server's: the worker"
                    " and the dispatcher here take no work until it is back within"
                    " clock_max_skew; sync NTP on both machines"
                ),
            )
        elif not over and self._refusing:
            log.info("clock_skew_recovered", offset=round(offset, 3))
        self._refusing = over

    def stop(self) -> None:
        self._stopped = True
        if self._wake is not None:
            self._wake.set()

    async def run(self) -> None:
        """Keep the clock read until :meth:`stop` (the receiver's times too, in a
        process whose worker and dispatcher do not run)."""
        self._wake = asyncio.Event()  # of this loop: a box may run in several in turn
        try:
            while not self._stopped:
                try:
                    await self.check()
                except Exception as exc:  # the database is away: the worker's lines say so
                    log.debug("clock_sync_failed", error=str(exc)[:200])
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), SYNC_INTERVAL)
        finally:
            self._stopped, self._wake = False, None


async def may_take_work(rt: Runtime) -> bool:
    """Whether a worker or dispatcher of ``rt`` may claim or lease now: the check of
    the guard its :class:`DatabaseClock` carries (:meth:`ClockGuard.check`); always,
    with a clock of its own."""
    clock = rt.clock
    guard = clock.guard if isinstance(clock, DatabaseClock) else None
    return True if guard is None else await guard.check()


async def every(
    seconds: float,
    stopping: asyncio.Event,
    job: Callable[[], Awaitable[object]],
    *,
    logger: Any,
    failed: str,
) -> None:
    """Run ``job`` now and then every ``seconds`` until ``stopping`` is set (a wait
    ends at once when it is). An exception (the database went away) is logged as the
    warning ``failed`` on ``logger``, and the job runs again next time."""
    while not stopping.is_set():
        try:
            await job()
        except Exception as exc:  # the database went away: try again next time
            logger.warning(failed, error=f"{type(exc).__name__}: {exc}")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), seconds)
