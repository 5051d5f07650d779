"""The one grammar for times and durations an operator types: the CLI's options, the
admin API's and the dashboard's filters and forms all parse them here.

A duration: a number with a unit, ``45s``, ``30m``, ``12h``, ``7d``, ``2w`` (decimals
allowed: ``1.5h``), or plain seconds.

A time (:func:`parse_time`): a duration, meaning that long before now (``2h``); epoch
seconds (``1767225600``); or ISO 8601 (``2026-03-13T00:00:00Z``; UTC when it names no
offset). Anything else raises :class:`~relaybox.errors.InvalidTimeSpec`, whose message
names the accepted forms; so does a time outside years 1970-9999 or a duration longer
than that (``1e999``, ``99999999999w``): every time is finite and bounded.

:data:`TimeSpec` is the same grammar as a pydantic field (the admin API's and the
dashboard's filters and bodies, the tenant API's): a JSON number is epoch seconds, a
string any of the forms above, relative to the validation context's ``now`` when the
caller passes one (``model_validate(raw, context={"now": box.clock.now()})``), else to
this machine's clock.
"""

from __future__ import annotations

import math
import re
import time
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import BeforeValidator, ValidationInfo, WithJsonSchema

from relaybox.errors import InvalidTimeSpec

__all__ = [
    "EPOCH_MAX",
    "TIME_FORMS",
    "TimeSpec",
    "parse_duration",
    "parse_time",
    "parse_time_or_none",
]

EPOCH_MAX = 253_402_300_799.0
"""The last second of year 9999: the latest time (and the longest duration) taken."""

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
        seconds = float(age.group(1)) * _UNIT[age.group(2)]
    elif _SECONDS.fullmatch(text):
        seconds = float(text)
    else:
        raise InvalidTimeSpec(f"{value!r} is not a duration: use 30d, 12h, 90m, 45s or seconds")
    if not seconds <= EPOCH_MAX:
        raise InvalidTimeSpec(f"{value[:40]!r} is longer than any time relaybox keeps")
    return seconds


def parse_time(value: str, now: float) -> float:
    """A time as epoch seconds: ``2h`` (that long before ``now``), epoch seconds, or
    ISO 8601 (UTC unless it names an offset)."""
    text = value.strip()
    if len(text) > 64:
        raise InvalidTimeSpec(f"{value[:40]!r}… is not a time: use {TIME_FORMS}")
    age = _AGE.fullmatch(text)
    if age:
        return _bounded(now - parse_duration(text), value)
    if _SECONDS.fullmatch(text):
        return _bounded(float(text), value)
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidTimeSpec(f"{value!r} is not a time: use {TIME_FORMS}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return _bounded(when.timestamp(), value)


def _bounded(epoch: float, value: object) -> float:
    """``epoch`` when it is a finite time in years 1970-9999."""
    if not 0 <= epoch <= EPOCH_MAX:  # NaN fails both comparisons
        raise InvalidTimeSpec(
            f"{str(value)[:40]!r} is not a time between 1970 and 9999: use {TIME_FORMS}"
        )
    return epoch


def _time_field(value: Any, info: ValidationInfo) -> Any:
    """:data:`TimeSpec`'s validator: a number is epoch seconds, a string any form."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise InvalidTimeSpec(f"{value!r} is not a time: use {TIME_FORMS}")
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise InvalidTimeSpec(f"{value!r} is not a time: use {TIME_FORMS}")
        return _bounded(float(value), value)
    if isinstance(value, datetime):
        when = value if value.tzinfo else value.replace(tzinfo=UTC)
        return _bounded(when.timestamp(), value)
    if isinstance(value, str):
        context = info.context if isinstance(info.context, dict) else {}
        now = context.get("now")
        return parse_time(value, time.time() if now is None else float(now))
    raise InvalidTimeSpec(f"a time is a number or a string: use {TIME_FORMS}")


TimeSpec = Annotated[
    float,
    BeforeValidator(_time_field),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "minimum": 0, "maximum": EPOCH_MAX},
                {"type": "string", "maxLength": 64},
            ],
            "description": f"a time: {TIME_FORMS}",
        }
    ),
]
"""A pydantic field of one time in the grammar above, as epoch seconds."""


def parse_time_or_none(value: str | None, now: float) -> float | None:
    """:func:`parse_time`, with ``None`` and an empty text meaning no time."""
    if value is None or not value.strip():
        return None
    return parse_time(value, now)
