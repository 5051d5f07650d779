"""The silence window's small grammar (hours, days, zone, expect_every) and the time
it counts, across weekends and daylight-saving changes; the learned window."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from relaybox.config import load_settings
from relaybox.config.silence import SilenceSettings, SilenceWindow, parse_days, parse_hours
from relaybox.errors import ConfigurationError
from relaybox.silence import learned_window

PARIS = ZoneInfo("Europe/Paris")


def at(*args: int) -> float:
    return datetime(*args, tzinfo=PARIS).timestamp()


def test_hours_and_days() -> None:
    assert parse_hours("08-20") == frozenset(range(8, 20))
    assert parse_hours("8-12, 14-18") == frozenset([8, 9, 10, 11, 14, 15, 16, 17])
    assert parse_hours("22-06") == frozenset([22, 23, 0, 1, 2, 3, 4, 5])
    assert parse_hours("00-24") == frozenset(range(24))
    assert parse_days("mon-fri") == frozenset(range(5))
    assert parse_days("sat,sun") == parse_days("sat-sun") == frozenset([5, 6])
    assert parse_days("fri-mon") == frozenset([4, 5, 6, 0])
    assert parse_days("MON,wed-thu") == frozenset([0, 2, 3])


@pytest.mark.parametrize(
    ("window", "problem"),
    [
        ({"expect_every": "soon"}, "a duration (30m, 6h, 2d) or 'learn'"),
        ({"expect_every": "0s"}, "more than 0"),
        ({"expect_every": "91d"}, "at most 90 days"),
        ({"expect_every": "1h", "hours": "9"}, "write a range"),
        ({"expect_every": "1h", "hours": "09-09"}, "is empty"),
        ({"expect_every": "1h", "hours": "09-25"}, "not a range of hours"),
        ({"expect_every": "1h", "days": "mon-funday"}, "not a range of days"),
        ({"expect_every": "1h", "days": "mon,,tue"}, "an empty item"),
        ({"expect_every": "1h", "timezone": "Mars/Olympus"}, "not an IANA zone"),
        ({"expect_every": "1h", "every": "1h"}, "Extra inputs"),
    ],
)
def test_a_bad_window_is_named_by_its_path(window: dict[str, str], problem: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        load_settings(env={}, given={"silence": {"sources": {"github": window}}})
    assert "silence.sources.github" in str(caught.value) and problem in str(caught.value)


def test_endpoints_take_a_duration_and_the_floor_stays_under_the_cap() -> None:
    with pytest.raises(ConfigurationError, match="'learn' is for sources"):
        load_settings(env={}, given={"silence": {"endpoints": {"expect_every": "learn"}}})
    with pytest.raises(ConfigurationError, match="learn_floor must not exceed learn_cap"):
        load_settings(env={}, given={"silence": {"learn_floor": 10, "learn_cap": 5}})
    env = {"RELAYBOX_SILENCE__SOURCES__STRIPE__EXPECT_EVERY": "45m"}
    assert load_settings(env=env).silence.sources["stripe"].every == 45 * 60
    assert SilenceWindow(expect_every=90).every == 90  # type: ignore[arg-type]


def test_only_time_inside_the_window_counts() -> None:
    office = SilenceWindow(
        expect_every="1h", hours="09-17", days="mon-fri", timezone="Europe/Paris"
    )
    friday, monday = at(2027, 1, 15, 16, 30), at(2027, 1, 18, 9, 30)
    assert office.counted(friday, monday, 10**9) == 3600
    assert 600 <= office.counted(friday, monday, 600) < 3600  # stops once it has enough
    assert office.counted(monday, friday, 10**9) == 0
    always = SilenceWindow(expect_every="1h")
    assert always.counted(friday, monday, 1) == monday - friday
    night = SilenceWindow(expect_every="1h", hours="22-06", timezone="Europe/Paris")
    assert night.counted(at(2027, 1, 15, 12), at(2027, 1, 16, 12), 10**9) == 8 * 3600
    # 28 March 2027, 02:00 Paris does not exist: that night is one hour shorter.
    assert night.counted(at(2027, 3, 27, 12), at(2027, 3, 28, 12), 10**9) == 7 * 3600
    kathmandu = SilenceWindow(expect_every="1h", hours="09-10", timezone="Asia/Kathmandu")
    day = datetime(2027, 1, 15, 0, 0, tzinfo=ZoneInfo("Asia/Kathmandu")).timestamp()
    assert kathmandu.counted(day, day + 86400, 10**9) == 3600  # a +05:45 zone


def test_the_learned_window() -> None:
    settings = SilenceSettings(learn_min_arrivals=5, learn_floor=60, learn_cap=7200)
    assert learned_window([0, 100, 200, 300], settings) is None  # too few
    every_5m = [i * 300.0 for i in range(200)]
    assert learned_window(every_5m, settings) == 600  # 5 min times the margin of 2
    outlier = [*every_5m, every_5m[-1] + 86400]
    assert learned_window(outlier, settings) == 600  # one day's gap is above the 99th
    assert learned_window([i * 10.0 for i in range(50)], settings) == 60  # the floor
    assert learned_window([i * 7200.0 for i in range(50)], settings) == 7200  # the cap
