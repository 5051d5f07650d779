"""Conformance of ``store/credentials.py`` on SQLite and PostgreSQL: endpoint headers
and sealed credentials (written, kept, cleared, leased with the endpoint), the failure
run and the announced threshold behind ``relaybox.endpoint.failing`` / ``recovered``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence

import pytest

from relaybox.store import Store, open_store
from relaybox.store.credentials import KEEP
from relaybox.store.dispatch_rows import LeaseRequest
from relaybox.store.outbox_rows import NewMessage, new_id
from tests.support.store_rows import endpoint_write as endpoint

T0 = 1_000_000.0


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    s = open_store(database_url)
    await s.migrate()
    yield s
    await s.close()


async def publish(store: Store, tenant: str, targets: Sequence[str]) -> None:
    msg_id = new_id("msg", T0)
    async with store.transaction() as conn:
        new = NewMessage(msg_id, tenant, "pet.adopted", None, '{"id":"' + msg_id + '"}', T0)
        assert await store.outbox.message_insert(conn, new)
        await store.outbox.delivery_insert(conn, msg_id, tenant, targets, now=T0)


def lease_request() -> LeaseRequest:
    at = T0 + 1
    return LeaseRequest(
        owner="d1", slots=10, channels=["webhook"], now=at, until=at + 60, deadline=30
    )


def opened(stored: Sequence[str]) -> tuple[tuple[str, ...], str | None]:
    """Opens "sealed:X" as X, as the vault would (the store never opens anything)."""
    return tuple(s.removeprefix("sealed:") for s in stored), None


async def test_headers_and_credentials_written_kept_and_cleared(store: Store) -> None:
    created = await store.outbox.endpoint_create(
        endpoint("ep_1"),
        "whsec_x",
        quota=5,
        now=T0,
        headers='{"X-Team":"blue"}',
        credentials=("bearer", 'sealed:{"type":"bearer","token":"t"}'),
    )
    assert (created.headers, created.credentials_type) == ({"X-Team": "blue"}, "bearer")
    plain = await store.outbox.endpoint_create(endpoint("ep_2"), "whsec_y", quota=5, now=T0)
    assert (plain.headers, plain.credentials_type) == (None, None)
    # An update that keeps them, then one that changes the headers only.
    await store.outbox.endpoint_update(endpoint("ep_1", description="d"), now=T0 + 1)
    found = await store.outbox.endpoint_get("ep_1", "t1")
    assert found is not None and (found.headers, found.credentials_type) == (
        {"X-Team": "blue"},
        "bearer",
    )
    await store.outbox.endpoint_update(
        endpoint("ep_1"), now=T0 + 2, headers='{"X-Team":"green"}', credentials=KEEP
    )
    [listed, _] = await store.outbox.endpoint_list("t1", limit=10)
    assert (listed.headers, listed.credentials_type) == ({"X-Team": "green"}, "bearer")
    # The lease brings them with the endpoint, the credentials opened like secrets.
    await publish(store, "t1", ["ep_1", "ep_2"])
    leased = await store.dispatch.outbox_lease(lease_request(), opened)
    targets = {d.endpoint.id: d.endpoint for d in leased.deliveries if d.endpoint}
    assert targets["ep_1"].headers == (("X-Team", "green"),)
    assert json.loads(targets["ep_1"].credentials or "") == {"type": "bearer", "token": "t"}
    assert (targets["ep_2"].headers, targets["ep_2"].credentials) == ((), None)
    assert not targets["ep_1"].failing and not targets["ep_2"].failing
    # Cleared.
    await store.outbox.endpoint_update(endpoint("ep_1"), now=T0 + 3, headers=None, credentials=None)
    found = await store.outbox.endpoint_get("ep_1", "t1")
    assert found is not None and (found.headers, found.credentials_type) == (None, None)
    [row] = await store.fetch_all("SELECT credentials FROM relaybox_endpoints WHERE id = 'ep_1'")
    assert row["credentials"] is None


async def test_failure_run_threshold_and_recovery(store: Store) -> None:
    await store.outbox.endpoint_create(endpoint("ep_1"), "s", quota=5, now=T0)
    await store.outbox.endpoint_create(endpoint("ep_2"), "s", quota=5, now=T0)
    async with store.transaction() as conn:
        for n in (1, 2, 3):
            streak = await store.dispatch.endpoint_failed(conn, "ep_1", now=T0 + n)
            assert streak is not None and (streak.failures, streak.failing_level) == (n, 0)
        assert await store.credentials.endpoint_failing_level(conn, "ep_1", 3) == (
            "t1",
            "https://example.com/ep_1",
            T0 + 1,
        )
        assert (
            await store.credentials.endpoint_failing_level(conn, "ep_1", 3) is None
        )  # announced already
        streak = await store.dispatch.endpoint_failed(conn, "ep_1", now=T0 + 4)
        assert streak is not None and (streak.failures, streak.failing_level) == (4, 3)
    # A success through the lease's own statement (or endpoint(s)_succeeded) ends the
    # run but leaves the announced threshold: the lease then marks the endpoint failing.
    async with store.transaction() as conn:
        await store.dispatch.endpoints_succeeded(conn, ["ep_1"])
    [row] = await store.fetch_all(
        "SELECT failures, failing_level FROM relaybox_endpoints WHERE id = 'ep_1'"
    )
    assert (row["failures"], row["failing_level"]) == (0, 3)
    await publish(store, "t1", ["ep_1"])
    [d] = (await store.dispatch.outbox_lease(lease_request(), opened)).deliveries
    assert d.endpoint is not None and d.endpoint.failing
    async with store.transaction() as conn:
        recovered = await store.credentials.endpoints_recovered(conn, ["ep_1", "ep_2"])
        assert [(r.id, r.tenant) for r in recovered] == [("ep_1", "t1")]  # ep_2 never failed
        assert await store.credentials.endpoints_recovered(conn, ["ep_1"]) == []  # once
    # Enabling starts over as well.
    async with store.transaction() as conn:
        await store.dispatch.endpoint_failed(conn, "ep_2", now=T0)
        await store.credentials.endpoint_failing_level(conn, "ep_2", 3)
        await store.outbox.endpoint_set_status(conn, "ep_2", "disabled", reason="x", now=T0)
        await store.outbox.endpoint_set_status(conn, "ep_2", "enabled", reason=None, now=T0)
    [row] = await store.fetch_all(
        "SELECT failures, failing_level FROM relaybox_endpoints WHERE id = 'ep_2'"
    )
    assert (row["failures"], row["failing_level"]) == (0, 0)
