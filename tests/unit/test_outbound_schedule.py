"""The retry schedule without a database: jitter bounds, the budget, Retry-After."""

from __future__ import annotations

import random
from email.utils import formatdate

import pytest
from pydantic import ValidationError

from relaybox.outbound import DEFAULT_SCHEDULE, OutboundSettings, Schedule
from relaybox.retry import parse_retry_after


def test_the_default_schedule_is_eight_attempts_over_about_a_day() -> None:
    schedule = Schedule.of(DEFAULT_SCHEDULE, jitter=0)
    assert schedule.max_attempts == 8
    delays = [schedule.delay(n) for n in range(1, 8)]
    assert delays == [5, 300, 1800, 7200, 18000, 36000, 36000]
    assert schedule.delay(8) is None
    assert sum(DEFAULT_SCHEDULE) / 3600 == pytest.approx(27.58, abs=0.01)


def test_jitter_spreads_each_delay_within_twenty_percent() -> None:
    schedule = Schedule.of(DEFAULT_SCHEDULE, jitter=0.2)
    rng = random.Random(7)
    for attempt, base in enumerate(DEFAULT_SCHEDULE, start=1):
        seen = [d for _ in range(200) if (d := schedule.delay(attempt, rng=rng)) is not None]
        assert len(seen) == 200
        assert all(0.8 * base <= d <= 1.2 * base for d in seen)
        assert max(seen) - min(seen) > 0.2 * base  # actually spread


def test_retry_after_waits_at_least_as_asked_within_the_cap() -> None:
    schedule = Schedule.of([5, 300], jitter=0, retry_after_cap=3600)
    assert schedule.delay(1, retry_after=120) == 120
    assert schedule.delay(1, retry_after=1) == 5  # never sooner than the schedule
    assert schedule.delay(1, retry_after=10**6) == 3600
    assert schedule.delay(3, retry_after=120) is None  # the budget still ends


def test_retry_after_forms() -> None:
    now = 1_800_000_000.0
    assert parse_retry_after("120", now) == 120
    assert parse_retry_after(formatdate(now + 90, usegmt=True), now) == pytest.approx(90)
    assert parse_retry_after(formatdate(now - 90, usegmt=True), now) == 0
    assert parse_retry_after("soon", now) is None
    assert parse_retry_after(None, now) is None


def test_settings_keep_leases_longer_than_timeouts() -> None:
    with pytest.raises(ValidationError, match="lease_ttl"):
        OutboundSettings(lease_ttl=20, max_timeout=30)
    with pytest.raises(ValidationError, match="timeout"):
        OutboundSettings(timeout=2)  # below the 5 s floor
    with pytest.raises(ValidationError):
        OutboundSettings(allow_networks=["not-a-network"])
    assert OutboundSettings(timeout=5).timeout == 5
