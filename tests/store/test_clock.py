"""``OperatorStore.db_time``: the database server's clock, on both backends, and which store
takes it (``clock_from_database``: PostgreSQL, whose processes may run on several
hosts; SQLite is one host)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest

from relaybox.store import Store, open_store


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    s = open_store(database_url)
    yield s
    await s.close()


async def test_db_time_is_the_servers_clock_now(store: Store) -> None:
    before = time.time()
    first = await store.operator.db_time()
    second = await store.operator.db_time()
    after = time.time()
    # The server runs on this machine in tests: its clock is this one (within 1 s).
    assert before - 1 <= first <= second <= after + 1
    assert store.db.clock_from_database == (store.backend == "postgres")
