"""In-process rate limits: a token bucket per key (publishing through the tenant API)
and a failure counter per key and overall (dashboard logins).

Both live in one process's memory: with several ``relaybox serve`` processes behind
a load balancer, each process allows its own share, so the limit a client meets is
the setting times the number of processes it reaches. Their tables are bounded: an
entry that no longer limits anything is dropped first, and when the table is full
of live entries the oldest goes.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

__all__ = ["FailureThrottle", "TokenBuckets"]

_MAX_KEYS = 10_000


class TokenBuckets:
    """``burst`` tokens per key, refilled at ``rate`` per second; each call to
    :meth:`take` spends one."""

    def __init__(
        self,
        rate: float,
        burst: int,
        *,
        max_keys: int = _MAX_KEYS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate, self.burst, self.max_keys, self.clock = rate, burst, max_keys, clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at)

    def take(self, key: str) -> float:
        """0 when a token was spent; otherwise the seconds until one is available."""
        now = self.clock()
        tokens, at = self._buckets.pop(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - at) * self.rate)
        if tokens >= 1:
            self._store(key, (tokens - 1, now), now)
            return 0.0
        self._store(key, (tokens, now), now)
        return (1 - tokens) / self.rate

    def _store(self, key: str, value: tuple[float, float], now: float) -> None:
        if len(self._buckets) >= self.max_keys:
            # A bucket that has refilled since it was last used limits nothing.
            full = [
                k
                for k, (t, at) in self._buckets.items()
                if t + (now - at) * self.rate >= self.burst
            ]
            for k in full:
                del self._buckets[k]
            while len(self._buckets) >= self.max_keys:
                del self._buckets[next(iter(self._buckets))]
        self._buckets[key] = value  # re-inserted: the dict's order is least recent first


class FailureThrottle:
    """At most ``per_key`` failures per key and ``total`` failures overall within the
    last ``window`` seconds; past either, :meth:`blocked` says for how long."""

    def __init__(
        self,
        per_key: int,
        total: int,
        window: float,
        *,
        max_keys: int = _MAX_KEYS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_key, self.total, self.window = per_key, total, window
        self.max_keys, self.clock = max_keys, clock
        self._keys: dict[str, deque[float]] = {}
        self._all: deque[float] = deque(maxlen=total)

    def blocked(self, key: str) -> float:
        """0 when ``key`` may try; otherwise the seconds until it may (at least 1)."""
        now = self.clock()
        waits = []
        times = self._keys.get(key)
        if times is not None and len(times) >= self.per_key:
            waits.append(times[0] + self.window - now)
        if len(self._all) >= self.total:
            waits.append(self._all[0] + self.window - now)
        wait = max(waits, default=0.0)
        return float(max(1, math.ceil(wait))) if wait > 0 else 0.0

    def failed(self, key: str) -> None:
        now = self.clock()
        self._all.append(now)
        times = self._keys.pop(key, None)
        if times is None:
            self._make_room(now)
            times = deque(maxlen=self.per_key)
        times.append(now)
        self._keys[key] = times

    def succeeded(self, key: str) -> None:
        self._keys.pop(key, None)

    def _make_room(self, now: float) -> None:
        if len(self._keys) < self.max_keys:
            return
        stale = [k for k, t in self._keys.items() if t[-1] + self.window <= now]
        for k in stale:
            del self._keys[k]
        while len(self._keys) >= self.max_keys:
            del self._keys[next(iter(self._keys))]
