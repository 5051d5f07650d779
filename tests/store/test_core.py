"""The core store's capabilities (``single_writer``, ``groups``) and the group
statements they stand for, on both backends: callers ask the store what it can do
instead of comparing backend names."""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from relaybox.inbound.accept import Acceptor
from relaybox.store import NewDelivery, Store, open_store

T0 = 1_800_000_000.0
SRC = Path(__file__).resolve().parents[2] / "src" / "relaybox"


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    s = open_store(database_url)
    yield s
    await s.close()


async def _started(store: Store) -> int:
    """One accepted, claimed and started row; its id (attempt 1)."""
    body = b'{"n": 1}'
    [outcome] = await store.inbox.accept(
        [
            NewDelivery(
                source="src",
                account="acct",
                event_id="e1",
                event_type="thing.happened",
                tenant=None,
                fingerprint=hashlib.sha256(body).digest(),
                payload=body,
                headers=None,
                version=None,
                received_at=T0,
            )
        ]
    )
    claim = await store.inbox.claim(now=T0, limit=10, max_attempts=10, hold=30)
    assert claim.ids == [outcome.inbox_id]
    assert await store.inbox.start(claim.ids, T0) == {outcome.inbox_id: 1}
    return outcome.inbox_id


async def test_a_store_runs_groups_or_has_one_writer(store: Store) -> None:
    """Exactly one of the two: the worker runs PostgreSQL-style groups of transactions
    on a store with ``groups``, one write transaction at a time on a single writer."""
    assert store.db.groups != store.db.single_writer
    inbox_id = await _started(store)
    async with store.db.connection() as conn:
        if not store.db.groups:
            with pytest.raises(NotImplementedError):
                await store.inbox.lock_group(conn, [(inbox_id, 1)], now=T0)
            with pytest.raises(NotImplementedError):
                await store.inbox.savepoint(conn, release=False)
            with pytest.raises(NotImplementedError):
                await store.inbox.rollback_to_savepoint(conn)
            with pytest.raises(NotImplementedError):
                await store.inbox.finish_group_on_commit(conn, [inbox_id], [], now=T0)
            return
        async with store.inbox.event_transaction(conn):
            assert not await store.inbox.lock_group(conn, [(inbox_id, 2)], now=T0)
        async with store.inbox.event_transaction(conn):
            assert await store.inbox.lock_group(conn, [(inbox_id, 1)], now=T0)
            await store.inbox.savepoint(conn, release=False)
            await store.inbox.rollback_to_savepoint(conn)
            await store.inbox.savepoint(conn, release=True, again=False)
            await store.inbox.finish_group_on_commit(conn, [inbox_id], [], now=T0 + 1)
    event = await store.inbox.get(inbox_id)
    assert event is not None and (event.status, event.done_at) == ("done", T0 + 1)


async def test_worker_chains_size_a_pooled_store(database_url: str) -> None:
    sizes = []
    for chains in (2, 20):
        store = open_store(database_url, worker_chains=chains)
        try:
            sizes.append(store.engine.pool.size())  # type: ignore[attr-defined]
            single = store.db.single_writer
        finally:
            await store.close()
    assert sizes == ([1, 1] if single else [10, 22])


async def test_the_acceptor_commits_alone_on_a_single_writer(store: Store) -> None:
    assert Acceptor(store).committers == (1 if store.db.single_writer else 3)
    assert Acceptor(store, committers=2).committers == 2


def test_no_backend_names_compared_by_the_worker_the_acceptor_or_the_app() -> None:
    files = sorted((SRC / "inbound" / "worker").glob("*.py"))
    files += [SRC / "inbound" / "accept.py", SRC / "inbound" / "registry.py", SRC / "app.py"]
    assert all(path.exists() for path in files) and len(files) > 5, files
    found = []
    for path in files:
        text = path.read_text()
        for pattern in (r"\.backend\b", r"startswith\(\"(sqlite|postgres)", r"store: Any"):
            found += [f"{path.name}: {m.group(0)}" for m in re.finditer(pattern, text)]
    assert found == []
