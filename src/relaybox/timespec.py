"""The one grammar for times and durations an operator types: the CLI's options, the
admin API's and the dashboard's filters and forms all parse them here.

A duration: a number with a unit, ``45s``, ``30m``, ``12h``, ``7d``, ``2w`` (decimals
allowed: ``1.5h``), or plain seconds.

A time (:func:`parse_time`): a duration, meaning that long before now (``2h``); epoch
seconds (``1767225600``); or ISO 8601 (``2026-03-13T00:00:00Z``; UTC when it names no
offset). Anything else raises :class:`~relaybox.errors.InvalidTimeSpec`, whose message
names the accepted forms.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from relaybox.errors import InvalidTimeSpec

__all__ = ["TIME_FORMS", "parse_duration", "parse_time", "parse_time_or_none"]

TIME_FORMS = "2h, 30m, 7d (that long ago), epoch seconds or ISO 8601"
"""The accepted forms of a time, as error messages and help texts name them."""

_AGE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])")
_SECONDS = re.compile(r"\d+(?:\.\d+)?")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(value: str) -> float:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` or plain seconds → seconds."""
    text = value.strip()
    age = _AGE.fullmatch(text)
    if age:
        return float(age.group(1)) * _UNIT[age.group(2)]
    if _SECONDS.fullmatch(text):
        return float(text)
    raise InvalidTimeSpec(f"{value!r} is not a duration: use 30d, 12h, 90m, 45s or seconds")


def parse_time(value: str, now: float) -> float:
    """A time as epoch seconds: ``2h`` (that long before ``now``), epoch seconds, or
    ISO 8601 (UTC unless it names an offset)."""
    text = value.strip()
    age = _AGE.fullmatch(text)
    if age:
        return now - float(age.group(1)) * _UNIT[age.group(2)]
    if _SECONDS.fullmatch(text):
        return float(text)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidTimeSpec(f"{value!r} is not a time: use {TIME_FORMS}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


def parse_time_or_none(value: str | None, now: float) -> float | None:
    """:func:`parse_time`, with ``None`` and an empty text meaning no time."""
    if value is None or not value.strip():
        return None
    return parse_time(value, now)
