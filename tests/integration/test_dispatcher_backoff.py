"""A dispatcher whose leases fail (the database is away) backs off: doubling pauses up
to 10 s instead of a lease and a log line every poll interval."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from relaybox import Relaybox
from relaybox.config import Settings
from relaybox.config.outbound import OutboundSettings
from relaybox.outbound.dispatcher import Dispatcher


async def test_failing_leases_back_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'relaybox.db'}",
        outbound=OutboundSettings(poll_interval=0.05),
    )
    box = Relaybox(settings=settings)
    await box.migrate()
    calls = 0

    async def down(self: Dispatcher, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        raise ConnectionRefusedError("the database is away")

    monkeypatch.setattr(Dispatcher, "_lease", down)
    dispatcher = box.dispatcher()
    task = asyncio.create_task(dispatcher.run())
    await asyncio.sleep(1.6)
    dispatcher.stop()
    await asyncio.wait_for(task, 15)
    await box.close()
    # Every poll interval would be ~32 leases; pauses of 0.1, 0.2, 0.4, 0.8 s allow 5.
    assert 2 <= calls <= 6, calls
