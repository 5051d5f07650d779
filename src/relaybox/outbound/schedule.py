"""When to try a delivery again: an explicit schedule, jitter and Retry-After.

Webhook senders publish their schedule (receivers plan around it), so unlike the
inbox's exponential :class:`~relaybox.retry.Backoff` this is a list of delays, one per
retry. The random source is injected, so a test proves a schedule without sleeping.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime

__all__ = ["Schedule", "parse_retry_after"]


@dataclass(frozen=True)
class Schedule:
    """``delays[i]`` seconds before attempt ``i + 2`` (attempt 1 is immediate), each
    spread by ``±jitter``; ``len(delays) + 1`` attempts in all."""

    delays: tuple[float, ...]
    jitter: float = 0.2
    retry_after_cap: float = 3600.0

    @classmethod
    def of(
        cls, delays: Sequence[float], *, jitter: float = 0.2, retry_after_cap: float = 3600.0
    ) -> Schedule:
        return cls(tuple(float(d) for d in delays), jitter, retry_after_cap)

    @property
    def max_attempts(self) -> int:
        return len(self.delays) + 1

    def delay(
        self, attempt: int, *, retry_after: float | None = None, rng: random.Random | None = None
    ) -> float | None:
        """Seconds to wait after failed attempt ``attempt`` (1-based); ``None`` once the
        schedule is used up. A ``Retry-After`` is honoured up to ``retry_after_cap``,
        and never makes the wait shorter than the schedule's own."""
        if attempt >= self.max_attempts:
            return None
        base = self.delays[attempt - 1]
        if self.jitter:
            base *= 1 + (rng or random).uniform(-self.jitter, self.jitter)
        if retry_after is not None:
            base = max(base, min(retry_after, self.retry_after_cap))
        return max(0.0, base)


def parse_retry_after(value: str | None, now: float) -> float | None:
    """``Retry-After`` as seconds from ``now``: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now)
