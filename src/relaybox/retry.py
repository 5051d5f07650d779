"""When to try again: capped exponential backoff with jitter, within a budget.

One function computes every delay, for the inbox worker and (later) the outbox
dispatcher. The random source and the clock are injected, so a test can prove a
schedule without sleeping.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["Backoff"]


@dataclass(frozen=True)
class Backoff:
    """``base * factor**(attempt-1)`` seconds, capped at ``cap``, then spread by
    ``±jitter`` (a fraction) so that failures at the same moment do not retry at the
    same moment. Gives up after ``max_attempts`` attempts or once the next try would
    start more than ``max_age`` seconds after the event was received."""

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
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        raw = min(self.cap, self.base * self.factor ** max(0, attempt - 1))
        if not self.jitter:
            return raw
        r = (rng or random).uniform(-self.jitter, self.jitter)
        return max(0.0, raw * (1 + r))

    def next_attempt(
        self, *, attempt: int, received_at: float, now: float, rng: random.Random | None = None
    ) -> float | None:
        """When to try again after failed attempt ``attempt``; ``None`` when the budget
        (attempts or time) is used up."""
        if attempt >= self.max_attempts:
            return None
        at = now + self.delay(attempt, rng)
        if at - received_at > self.max_age:
            return None
        return at
