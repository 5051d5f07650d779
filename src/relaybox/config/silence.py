"""Silence detection's settings (``[silence]``): when traffic is expected from each
source, how long an endpoint may take nothing while deliveries wait, and how a window
is learned. :mod:`relaybox.silence` runs the check; docs/operating.md describes it.

A window (``[silence.sources.<name>]``, ``[silence.endpoints]``) is small on purpose:

* ``expect_every``: a duration (``30m``, ``6h``, ``2d``; as :mod:`relaybox.timespec`
  reads durations) or ``"learn"``: a high percentile of the source's arrival gaps over
  the last weeks (sources only);
* ``hours``: hours of the day traffic is expected, ``"08-20"`` (08:00 up to 20:00),
  a list ``"08-12,14-18"``, or a range through midnight ``"22-06"``; unset: all day;
* ``days``: days of the week, ``"mon-fri"``, ``"sat,sun"``, ``"mon,wed-fri"``; unset:
  every day;
* ``timezone``: the IANA zone those hours and days are read in (default ``UTC``).

Only time inside the window counts: with ``hours = "09-17"`` and ``expect_every =
"1h"``, a source that last sent at 16:30 is silent at 09:30 the next morning.
"""

from __future__ import annotations

import math
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from relaybox.errors import InvalidTimeSpec
from relaybox.timespec import parse_duration

__all__ = ["DAYS", "SilenceSettings", "SilenceWindow", "parse_days", "parse_hours"]

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
"""Day names of ``days``, in ``datetime.weekday()`` order."""

_SEGMENT = 900.0
"""Every zone's offset is a whole number of quarter hours: within a UTC quarter hour
the local hour and day do not change."""

_MAX_SEGMENTS = 100 * 96
"""A window's time is counted over at most 100 days back."""

MAX_EXPECT = 90 * 86400.0
"""The longest ``expect_every``: 90 days."""


def _ranges(text: str, names: dict[str, int], size: int, what: str) -> frozenset[int]:
    chosen: set[int] = set()
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            raise ValueError(f"{what} {text!r}: an empty item")
        first, sep, last = part.partition("-")
        try:
            a = names[first.strip()]
            b = names[last.strip()] if sep else a
        except KeyError:
            raise ValueError(f"{what} {text!r}: {part!r} is not a range of {what}") from None
        if what == "hours":
            if not sep:
                raise ValueError(f"hours {text!r}: write a range, e.g. 08-20")
            if a == b or a == size:
                raise ValueError(f"hours {text!r}: {part!r} is empty")
            # Up to b, not including it; through midnight when b < a.
            chosen.update(range(a, b) if a < b else [*range(a, size), *range(b)])
        else:
            i = a
            while True:  # days: both ends included; through Sunday when b < a
                chosen.add(i)
                if i == b:
                    break
                i = (i + 1) % size
    return frozenset(chosen)


def parse_hours(text: str) -> frozenset[int]:
    """``"08-20"``, ``"08-12,14-18"``, ``"22-06"`` → the hours of the day included
    (a range includes its first hour, not its last: ``08-20`` ends at 20:00)."""
    names = {**{f"{h:02d}": h for h in range(25)}, **{str(h): h for h in range(25)}}
    return _ranges(text, names, 24, "hours")


def parse_days(text: str) -> frozenset[int]:
    """``"mon-fri"``, ``"sat,sun"``, ``"mon,wed-fri"`` → weekdays (Monday 0)."""
    return _ranges(text, {d: i for i, d in enumerate(DAYS)}, 7, "days")


class SilenceWindow(BaseModel):
    """When traffic is expected: at least once every ``expect_every``, counted only
    within ``hours`` and ``days`` of ``timezone``."""

    model_config = ConfigDict(extra="forbid")

    expect_every: str = Field(
        max_length=40,
        description="a duration (30m, 6h, 2d) or 'learn' (from past arrival gaps; sources only)",
    )
    hours: str | None = Field(
        None, max_length=200, description="hours of the day, '08-20', '08-12,14-18', '22-06'"
    )
    days: str | None = Field(
        None, max_length=100, description="days of the week, 'mon-fri', 'sat,sun'"
    )
    timezone: str = Field("UTC", max_length=100, description="IANA zone of hours and days")

    _every: float | None = PrivateAttr(None)
    _hours: frozenset[int] | None = PrivateAttr(None)
    _days: frozenset[int] | None = PrivateAttr(None)
    _zone: ZoneInfo | None = PrivateAttr(None)

    @field_validator("expect_every", mode="before")
    @classmethod
    def _every_text(cls, value: object) -> object:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)  # plain seconds from TOML
        return value

    @model_validator(mode="after")
    def _parse(self) -> SilenceWindow:
        text = self.expect_every.strip().lower()
        if text != "learn":
            try:
                every = parse_duration(text)
            except InvalidTimeSpec:
                raise ValueError(
                    f"expect_every {self.expect_every!r}: a duration (30m, 6h, 2d) or 'learn'"
                ) from None
            if not 0 < every <= MAX_EXPECT or not math.isfinite(every):
                raise ValueError("expect_every must be more than 0 and at most 90 days")
            self._every = every
        self._hours = None if self.hours is None else parse_hours(self.hours)
        self._days = None if self.days is None else parse_days(self.days)
        try:
            self._zone = ZoneInfo(self.timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"timezone {self.timezone!r} is not an IANA zone") from None
        return self

    @property
    def every(self) -> float | None:
        """``expect_every`` in seconds; ``None`` when it is learned."""
        return self._every

    @property
    def learned(self) -> bool:
        return self._every is None

    @property
    def always(self) -> bool:
        """Whether every hour of every day is in the window."""
        return self._hours is None and self._days is None

    def describe(self) -> dict[str, str | None]:
        """The window as events and the dashboard show it."""
        return {"hours": self.hours, "days": self.days, "timezone": self.timezone}

    def counted(self, start: float, end: float, enough: float) -> float:
        """Seconds from ``start`` to ``end`` inside the window, counted until they
        reach ``enough`` (the result may pass it by up to a quarter hour) and over
        at most the last 100 days: the check only needs to know whether a silence
        reached its limit."""
        if end <= start:
            return 0.0
        if self.always:
            return end - start
        assert self._zone is not None
        total = 0.0
        t = max(start, end - _MAX_SEGMENTS * _SEGMENT)
        while t < end and total < enough:
            stop = min(end, (math.floor(t / _SEGMENT) + 1) * _SEGMENT)
            local = datetime.fromtimestamp(t, self._zone)
            if (self._days is None or local.weekday() in self._days) and (
                self._hours is None or local.hour in self._hours
            ):
                total += stop - t
            t = stop
        return total


class SilenceSettings(BaseModel):
    """Silence detection, run by the maintenance role every ``check_every`` seconds.
    No source or endpoint is watched until a window names it."""

    model_config = ConfigDict(extra="forbid")

    check_every: float = Field(
        60.0, gt=0, le=3600, description="seconds between two checks (maintenance role)"
    )
    sources: dict[str, SilenceWindow] = Field(
        default_factory=dict, description="per source name, when its traffic is expected"
    )
    endpoints: SilenceWindow | None = Field(
        None,
        description="how long any webhook endpoint may take nothing while deliveries wait "
        "for it (unset: endpoints are not watched)",
    )
    learn_weeks: float = Field(
        4.0, gt=0, le=52, description="weeks of arrivals a learned window is taken from"
    )
    learn_percentile: float = Field(
        99.0, gt=0, le=100, description="percentile of the arrival gaps a window is learned at"
    )
    learn_margin: float = Field(
        2.0, ge=1, le=100, description="the learned window is that gap times this margin"
    )
    learn_floor: float = Field(
        1800.0, gt=0, le=MAX_EXPECT, description="shortest learned window, seconds"
    )
    learn_cap: float = Field(
        7 * 86400.0, gt=0, le=MAX_EXPECT, description="longest learned window, seconds"
    )
    learn_min_arrivals: int = Field(
        50, ge=2, le=100_000, description="arrivals needed before a window is learned"
    )
    learn_max_arrivals: int = Field(
        10_000, ge=10, le=1_000_000, description="newest arrivals a window is learned from"
    )
    learn_every: float = Field(
        6 * 3600.0, gt=0, le=7 * 86400, description="seconds between two learnings"
    )
    recover: bool = Field(
        True,
        description="start a pull recovery (relaybox.inbound.recovery) when a source that has one "
        "goes silent",
    )
    recover_max_age: float = Field(
        24 * 3600.0, gt=0, le=30 * 86400, description="how far back that recovery looks, s"
    )
    recover_timeout: float = Field(
        300.0, gt=0, le=3600, description="seconds that recovery may take before it stops"
    )

    @model_validator(mode="after")
    def _endpoints_fixed(self) -> SilenceSettings:
        if self.endpoints is not None and self.endpoints.learned:
            raise ValueError("endpoints.expect_every: a duration ('learn' is for sources)")
        if self.learn_floor > self.learn_cap:
            raise ValueError("learn_floor must not exceed learn_cap")
        return self
