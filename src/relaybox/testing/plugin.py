"""pytest plugin of :mod:`relaybox.testing` (entry point ``pytest11``): fixtures.

``signed_delivery``
    :func:`relaybox.testing.signed_delivery` (a provider name or a source).
``relaybox_clock``
    a :class:`~relaybox.FrozenClock` at :data:`relaybox.testing.TEST_START`.
``relaybox_harness``
    an async factory: ``await relaybox_harness(configure, setup=..., inline=...)``
    returns a :class:`~relaybox.testing.Harness` on a fresh SQLite database in the
    test's ``tmp_path``; every harness made is closed after the test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from relaybox.clock import FrozenClock
from relaybox.testing import TEST_START, Harness, make_harness, signed_delivery

__all__ = ["relaybox_clock", "relaybox_harness", "signed_delivery_fixture"]


@pytest.fixture(name="signed_delivery")
def signed_delivery_fixture() -> Callable[..., Any]:
    return signed_delivery


@pytest.fixture
def relaybox_clock() -> FrozenClock:
    return FrozenClock(TEST_START)


@pytest.fixture
async def relaybox_harness(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    made: list[Harness] = []

    async def make(*args: Any, **options: Any) -> Harness:
        harness = await make_harness(tmp_path, *args, **options)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        await harness.close()
