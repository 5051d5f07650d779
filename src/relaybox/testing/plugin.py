"""pytest plugin of :mod:`relaybox.testing` (entry point ``pytest11``): fixtures.

``signed_delivery``
    :func:`relaybox.testing.signed_delivery` (a provider name or a source).
``relaybox_clock``
    a :class:`~relaybox.FrozenClock` at :data:`relaybox.testing.TEST_START`.
``relaybox_harness``
    an async factory: ``await relaybox_harness(box_or_configure, setup=..., inline=...)``
    returns a :class:`~relaybox.testing.Harness` on a fresh SQLite database in the
    test's ``tmp_path``; every harness made is closed after the test (a borrowed
    application box gets its own database back).

``relaybox_harness`` is an async fixture of pytest-asyncio, declared with
``pytest_asyncio.fixture``: it works in pytest-asyncio's default *strict* mode (the
test itself carries ``@pytest.mark.asyncio``, as every async test there does) and
in ``asyncio_mode = "auto"`` alike. Without pytest-asyncio the fixture fails with
what to install.
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


async def _harnesses(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    made: list[Harness] = []

    async def make(*args: Any, **options: Any) -> Harness:
        harness = await make_harness(tmp_path, *args, **options)
        made.append(harness)
        return harness

    try:
        yield make
    finally:
        for harness in reversed(made):
            await harness.close()


def _needs_pytest_asyncio() -> None:
    pytest.fail(
        "relaybox_harness is an async fixture: pip install pytest-asyncio, and mark"
        " the test @pytest.mark.asyncio",
        pytrace=False,
    )


relaybox_harness: Any
try:
    import pytest_asyncio
except ImportError:  # pragma: no cover - the suite has pytest-asyncio
    relaybox_harness = pytest.fixture(name="relaybox_harness")(_needs_pytest_asyncio)
else:
    relaybox_harness = pytest_asyncio.fixture(name="relaybox_harness")(_harnesses)
