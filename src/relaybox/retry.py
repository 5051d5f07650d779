"""When to try again: one retry engine for the inbox worker and the outbox dispatcher.

A :class:`RetryPolicy` answers one question, :meth:`~RetryPolicy.next_delay`: after
failed attempt ``n``, how many seconds to wait, or ``None`` once the budget is used
up. Two policies implement it with the same jitter and ``Retry-After`` rules:

- :class:`Backoff` (the inbox worker): capped exponential delays, within a budget of
  attempts and of age since the event was received (:meth:`Backoff.next_attempt`);
- :class:`Schedule` (the dispatcher): an explicit list of delays, one per retry, as
  webhook senders publish them so that receivers can plan around them.

The random source is injected, so a test proves a schedule without sleeping.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Protocol

__all__ = ["Backoff", "RetryPolicy", "Schedule", "parse_retry_after"]


class RetryPolicy(Protocol):
    """How long to wait before the next attempt."""

    @property
    def max_attempts(self) -> int:
        """Attempts in all, the first included."""
        ...

    def next_delay(
        self, attempt: int, *, retry_after: float | None = None, rng: random.Random | None = None
    ) -> float | None:
        """Seconds to wait after failed attempt ``attempt`` (1-based), or ``None`` once
        ``max_attempts`` attempts are used up. ``retry_after`` (what the other side
        asked for, in seconds) lengthens the wait up to the policy's cap, never
        shortens it."""
        ...


def _jittered(delay: float, jitter: float, rng: random.Random | None) -> float:
    """``delay`` spread by ``±jitter`` (a fraction), so that failures at the same moment
    do not retry at the same moment; the random source is drawn only with a jitter."""
    if not jitter:
        return delay
    return delay * (1 + (rng or random).uniform(-jitter, jitter))


def _honour(delay: float, retry_after: float | None, cap: float) -> float:
    """At least ``retry_after`` seconds, up to ``cap``; never shorter than ``delay``
    nor below zero."""
    if retry_after is not None:
        delay = max(delay, min(retry_after, cap))
    return max(0.0, delay)


@dataclass(frozen=True)
class Backoff:
    """``base * factor**(attempt-1)`` seconds, capped at ``cap``, then spread by
    ``±jitter`` (a fraction). Gives up after ``max_attempts`` attempts or once the
    next try would start more than ``max_age`` seconds after the event was received."""

    base: float = 1.0
    factor: float = 2.0
    cap: float = 600.0
    jitter: float = 0.2
    max_attempts: int = 10
    max_age: float = 3 * 24 * 3600.0

    def __post_init__(self) -> None:
        if self.base <= 0 or self.factor < 1 or self.cap < self.base:
            raise ValueError("backoff needs base > 0, factor >= 1 and cap >= base")
        if not 0 <= self.jitter < 1:
            raise ValueError("jitter is a fraction in [0, 1)")
        if self.max_attempts < 1 or self.max_age <= 0:
            raise ValueError("the budget needs max_attempts >= 1 and max_age > 0")

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based), whatever
        the budget."""
        raw = min(self.cap, self.base * self.factor ** max(0, attempt - 1))
        return max(0.0, _jittered(raw, self.jitter, rng))

    def next_delay(
        self, attempt: int, *, retry_after: float | None = None, rng: random.Random | None = None
    ) -> float | None:
        """:meth:`delay`, or ``None`` after ``max_attempts`` attempts; a ``retry_after``
        is honoured up to ``cap``."""
        if attempt >= self.max_attempts:
            return None
        return _honour(self.delay(attempt, rng), retry_after, self.cap)

    def next_attempt(
        self, *, attempt: int, received_at: float, now: float, rng: random.Random | None = None
    ) -> float | None:
        """When to try again after failed attempt ``attempt``; ``None`` when the budget
        (attempts or age) is used up."""
        delay = self.next_delay(attempt, rng=rng)
        if delay is None:
            return None
        at = now + delay
        if at - received_at > self.max_age:
            return None
        return at


@dataclass(frozen=True)
class Schedule:
    """``delays[i]`` seconds before attempt ``i + 2`` (attempt 1 is immediate), each
    spread by ``±jitter``; ``len(delays) + 1`` attempts in all. A ``Retry-After`` is
    honoured up to ``retry_after_cap``."""

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

    def next_delay(
        self, attempt: int, *, retry_after: float | None = None, rng: random.Random | None = None
    ) -> float | None:
        """Seconds to wait after failed attempt ``attempt`` (1-based); ``None`` once the
        schedule is used up. A ``Retry-After`` never makes the wait shorter than the
        schedule's own."""
        if attempt >= self.max_attempts:
            return None
        delay = _jittered(self.delays[attempt - 1], self.jitter, rng)
        return _honour(delay, retry_after, self.retry_after_cap)

    delay = next_delay


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
