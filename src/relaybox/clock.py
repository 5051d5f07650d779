"""One injectable clock for backoff, timestamp tolerance, leases and retention.

Times are float seconds since the Unix epoch everywhere in relaybox, stored as
``double precision`` (PostgreSQL) and ``REAL`` (SQLite) so both backends compare
the same numbers. Tests use :class:`FrozenClock` and never sleep to prove a schedule.
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "FrozenClock", "SystemClock"]


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
