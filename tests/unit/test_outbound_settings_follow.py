"""The sending side is built with the box (``box.outbound``) and follows the box's
settings when they change later, keeping what ``configure(box, ...)`` set in code."""

from __future__ import annotations

from relaybox import Relaybox
from relaybox.config import Settings
from relaybox.config.outbound import OutboundSettings
from relaybox.outbound import configure, outbound


def _box() -> Relaybox:
    return Relaybox(settings=Settings(database_url="sqlite://"))


def test_the_sending_side_is_the_box_attribute_built_from_its_settings() -> None:
    box = Relaybox(
        settings=Settings(database_url="sqlite://", outbound=OutboundSettings(timeout=7))
    )
    assert outbound(box) is box.outbound
    assert box.outbound.settings.timeout == 7


def test_settings_given_later_reach_it_and_keep_what_code_configured() -> None:
    box = _box()
    configure(box, publish_rate=3.0)  # in code, at import time
    box.configure(Settings(outbound=OutboundSettings(timeout=9)))  # --config dev.toml
    assert box.outbound.settings.timeout == 9
    assert box.outbound.settings.publish_rate == 3.0


def test_swapped_settings_reach_it_and_the_old_ones_come_back() -> None:
    box = _box()
    saved = box.settings
    box.settings = saved.model_copy(update={"outbound": OutboundSettings(timeout=8)})
    assert box.outbound.settings.timeout == 8
    box.settings = saved
    assert box.outbound.settings.timeout == saved.outbound.timeout


def test_settings_that_leave_the_sending_side_alone_do_not_touch_it() -> None:
    box = _box()
    configure(box, timeout=6.5)
    box.settings = box.settings.model_copy(update={"database_url": "sqlite:///other.db"})
    assert box.outbound.settings.timeout == 6.5
