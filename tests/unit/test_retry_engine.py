"""One retry engine for both directions: Backoff (inbox) and Schedule (outbox) answer
the same RetryPolicy question with the same jitter and Retry-After rules."""

from __future__ import annotations

import random

import pytest

from relaybox import Backoff
from relaybox.outbound import Schedule
from relaybox.retry import RetryPolicy, parse_retry_after
from relaybox.retry import Schedule as ScheduleInRetry


def _delays(policy: RetryPolicy, seed: int) -> list[float | None]:
    rng = random.Random(seed)
    return [policy.next_delay(n, rng=rng) for n in range(1, policy.max_attempts + 1)]


def test_both_policies_answer_next_delay_and_end_at_their_budget() -> None:
    backoff = Backoff(base=1, factor=2, cap=10, jitter=0, max_attempts=6, max_age=1000)
    schedule = Schedule.of([5, 300, 1800], jitter=0)
    assert _delays(backoff, 1) == [1, 2, 4, 8, 10, None]
    assert _delays(schedule, 1) == [5, 300, 1800, None]


def test_one_module_one_schedule_class() -> None:
    assert Schedule is ScheduleInRetry
    assert parse_retry_after("30", 0.0) == 30


@pytest.mark.parametrize(
    "policy",
    [
        Backoff(base=10, factor=2, cap=100, jitter=0.2, max_attempts=5, max_age=10**6),
        Schedule.of([10, 20, 40, 80], jitter=0.2),
    ],
)
def test_jitter_draws_the_same_way_in_both(policy: RetryPolicy) -> None:
    """Same seed, same draws: each delay within ±20 % of its base, reproducible."""
    assert _delays(policy, 3) == _delays(policy, 3)
    bases = [10, 20, 40, 80]
    for delay, base in zip(_delays(policy, 3), bases, strict=False):
        assert delay is not None and 0.8 * base <= delay <= 1.2 * base


def test_backoff_honours_retry_after_up_to_its_cap() -> None:
    backoff = Backoff(base=1, factor=2, cap=60, jitter=0, max_attempts=3, max_age=1000)
    assert backoff.next_delay(1, retry_after=30) == 30
    assert backoff.next_delay(2, retry_after=0.5) == 2  # never sooner than its own
    assert backoff.next_delay(1, retry_after=10**6) == 60
    assert backoff.next_delay(3, retry_after=30) is None


def test_backoff_next_attempt_keeps_the_age_budget() -> None:
    backoff = Backoff(base=4, factor=2, cap=600, jitter=0, max_attempts=10, max_age=10)
    assert backoff.next_attempt(attempt=1, received_at=0.0, now=0.0) == 4
    assert backoff.next_attempt(attempt=2, received_at=0.0, now=4.0) is None  # 12 s > 10 s
