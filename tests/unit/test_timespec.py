"""The one time grammar (relaybox.timespec): durations, relative times, epoch seconds,
ISO 8601, and a clear error for anything else. No database."""

from __future__ import annotations

import pytest

from relaybox.errors import InvalidRequest, InvalidTimeSpec, RelayboxError
from relaybox.timespec import parse_duration, parse_time, parse_time_or_none

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("45s", 45),
        ("30m", 1800),
        ("2h", 7200),
        ("7d", 604800),
        ("2w", 1209600),
        ("1.5h", 5400),
        ("90", 90),
        (" 12h ", 43200),
        ("3 d", 259200),
    ],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2h", NOW - 7200),
        ("30m", NOW - 1800),
        ("7d", NOW - 7 * 86400),
        ("1767225600", 1767225600.0),
        ("1767225600.5", 1767225600.5),
        ("2026-01-01T00:00:00Z", 1767225600.0),
        ("2026-01-01T00:00:00", 1767225600.0),  # no offset: UTC
        ("2026-01-01T02:00:00+02:00", 1767225600.0),
        ("2026-01-01", 1767225600.0),
    ],
)
def test_times(text: str, expected: float) -> None:
    assert parse_time(text, NOW) == expected


@pytest.mark.parametrize("text", ["yesterday", "2x", "-5", "nan", "inf", "1e9", "2h ago", ""])
def test_anything_else_is_a_clear_error(text: str) -> None:
    with pytest.raises(InvalidTimeSpec) as caught:
        parse_time(text, NOW)
    assert repr(text) in caught.value.message
    assert "2h" in caught.value.message and "ISO 8601" in caught.value.message
    # An operator request refused with 400 by the web layer; a usage error in the CLI.
    assert isinstance(caught.value, InvalidRequest) and isinstance(caught.value, RelayboxError)
    assert caught.value.status == 400 and caught.value.hint == "bad_time"


@pytest.mark.parametrize("text", ["soon", "2x", "-1", "1e3", ""])
def test_bad_durations(text: str) -> None:
    with pytest.raises(InvalidTimeSpec, match="is not a duration"):
        parse_duration(text)


def test_absent_time() -> None:
    assert parse_time_or_none(None, NOW) is None
    assert parse_time_or_none("  ", NOW) is None
    assert parse_time_or_none("1h", NOW) == NOW - 3600


@pytest.mark.parametrize(
    "text", ["99999999999999", "10000-01-01T00:00:00Z", "1969-12-31T23:59:59Z", "3000w", "9" * 80]
)
def test_times_are_bounded_to_years_1970_to_9999(text: str) -> None:
    with pytest.raises(InvalidTimeSpec, match="is not a time"):
        parse_time(text, NOW)


def test_durations_are_bounded() -> None:
    with pytest.raises(InvalidTimeSpec, match="longer than any time"):
        parse_duration("99999999999w")
    assert parse_duration("52w") == 52 * 7 * 86400


@pytest.mark.parametrize("value", [1e999, float("nan"), -1, 1e12, True, [1], "1e999", "2x"])
def test_the_pydantic_field_refuses_what_is_not_a_bounded_time(value: object) -> None:
    from pydantic import BaseModel, ValidationError

    from relaybox.timespec import TimeSpec

    class Query(BaseModel):
        since: TimeSpec | None = None

    with pytest.raises(ValidationError, match="since"):
        Query.model_validate({"since": value})
    now = {"now": NOW}
    assert Query.model_validate({"since": "2h"}, context=now).since == NOW - 7200
    assert Query.model_validate({"since": 1767225600}).since == 1767225600.0
    assert Query.model_validate({"since": "2026-01-01T00:00:00Z"}).since == 1767225600.0
