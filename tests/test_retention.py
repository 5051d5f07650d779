"""Retention: ``relaybox purge`` drops payloads past the age and nothing else, a purged
event is still a duplicate and says clearly that it cannot be replayed, and one
maintenance runner at a time across processes (PostgreSQL advisory lock)."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

from relaybox import Context, FrozenClock, PermanentError, Relaybox
from relaybox.admin import build_admin
from relaybox.config import Settings
from relaybox.retention import Maintenance, maintenance_lock, purge
from relaybox.store import NewDelivery
from tests.test_ops_cli import Invoke, cli_runner

DAY = 86400.0


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch) -> Iterator[Invoke]:
    yield from cli_runner(monkeypatch)


TOKEN = "test-admin-token-0123456789"


def delivery(when: float, event_id: str, event_type: str, body: Any) -> NewDelivery:
    raw = json.dumps(body).encode()
    return NewDelivery(
        source="s",
        account="a",
        event_id=event_id,
        event_type=event_type,
        tenant="t",
        fingerprint=hashlib.sha256(raw).digest(),
        payload=raw,
        headers=json.dumps({"x": "1"}),
        version=None,
        received_at=when,
    )


async def history(box: Relaybox, clock: FrozenClock) -> dict[str, int]:
    """Events that finished 40 days ago in every way, and one that finished yesterday.
    Times are real (relative to now) because ``relaybox purge`` runs on the real clock."""

    @box.handler("s", "ok")
    async def ok(ctx: Context) -> None:
        await ctx.once(f"grant:{ctx.event.event_id}")

    @box.handler("s", "bad")
    async def bad(ctx: Context) -> None:
        raise PermanentError("invalid")

    @box.handler("s", "slow")
    async def slow(ctx: Context) -> None:
        raise ConnectionError("later")

    clock.set(time.time() - 40 * DAY)
    old = clock.now()
    await box.store.inbox_accept(
        [
            delivery(old, "done-old", "ok", {"n": 1}),
            delivery(old, "dead-old", "bad", {"n": 2}),
            delivery(old, "discarded-old", "bad", {"n": 3}),
            delivery(old, "pending-old", "slow", {"n": 4}),
            delivery(old, "quarantined-original", "ok", {"n": 5}),
            delivery(old, "resolved-original", "ok", {"n": 6}),
        ]
    )
    await box.worker().run_once()
    await box.store.inbox_accept(
        [
            delivery(old, "quarantined-original", "ok", {"n": 5, "changed": True}),
            delivery(old, "resolved-original", "ok", {"n": 6, "changed": True}),
        ]
    )
    rows = {r["event_id"]: r["id"] for r in await box.store.fetch_all(
        "SELECT id, event_id FROM relaybox_inbox"
    )}  # fmt: skip
    from relaybox.admin import ops

    await ops.dead_discard(box, rows["discarded-old"], actor="t", reason="noise")
    [resolved] = await box.store.fetch_all(
        "SELECT q.id FROM relaybox_quarantine q JOIN relaybox_inbox i ON i.id = q.inbox_id"
        " WHERE i.event_id = 'resolved-original'"
    )
    await ops.quarantine_resolve(
        box, resolved["id"], resolution="kept_original", actor="t", reason="benign"
    )
    clock.set(time.time() - 1 * DAY)
    await box.store.inbox_accept([delivery(clock.now(), "done-recent", "ok", {"n": 7})])
    await box.worker().run_once()
    clock.set(time.time())
    return rows | {
        r["event_id"]: r["id"]
        for r in await box.store.fetch_all(
            "SELECT id, event_id FROM relaybox_inbox WHERE event_id = 'done-recent'"
        )
    }


async def snapshot(box: Relaybox) -> dict[str, Any]:
    """Every row of every table relaybox keeps, as comparable tuples."""
    out: dict[str, Any] = {}
    for table, key in (
        ("relaybox_inbox", "id"),
        ("relaybox_quarantine", "id"),
        ("relaybox_operations", "business_key"),
        ("relaybox_inbox_attempts", "id"),
        ("relaybox_outbox", "id"),
        ("relaybox_replays", "id"),
    ):
        rows = await box.store.fetch_all(f"SELECT * FROM {table} ORDER BY {key}")
        out[table] = {r[key]: {k: _plain(v) for k, v in r.items()} for r in rows}
    return out


def _plain(value: Any) -> Any:
    return bytes(value) if isinstance(value, memoryview) else value


async def test_purge_drops_old_payloads_and_nothing_else(
    database_url: str, clock: FrozenClock, cli: Invoke
) -> None:
    box = Relaybox(settings=Settings(database_url=database_url), clock=clock)
    ids = await history(box, clock)
    before = await snapshot(box)
    dry = await cli("purge", "--older-than", "30d", "--dry-run", "--json",
                    "--database-url", database_url)  # fmt: skip
    assert json.loads(dry.stdout)["inbox"] == 3 and json.loads(dry.stdout)["quarantine"] == 1
    assert await snapshot(box) == before
    result = await cli("purge", "--older-than", "30d", "--database-url", database_url)
    assert "purged 3 event payload(s) and 1 quarantine payload(s)" in result.stdout
    after = await snapshot(box)
    purged = {ids["done-old"], ids["discarded-old"], ids["resolved-original"]}
    for table, rows in before.items():
        assert after[table].keys() == rows.keys(), table
        for key, row in rows.items():
            changed = {k for k in row if row[k] != after[table][key][k]}
            if table == "relaybox_inbox" and key in purged:
                assert changed == {"payload", "headers", "purged_at"}
                assert after[table][key]["payload"] is None and after[table][key]["headers"] is None
            elif table == "relaybox_quarantine" and after[table][key]["resolved_at"] is not None:
                assert changed == {"payload", "headers", "purged_at"}
            else:
                assert changed == set(), (table, key, changed)
    kept = {e: after["relaybox_inbox"][ids[e]]["payload"] is not None for e in ids}
    assert kept == {
        "done-old": False,
        "discarded-old": False,  # discarded 40 days ago: resolved
        "resolved-original": False,  # its quarantine entry is resolved
        "dead-old": True,  # a dead letter waits for an operator
        "pending-old": True,  # still to be processed
        "quarantined-original": True,  # an open quarantine entry compares with it
        "done-recent": True,  # younger than the age
    }
    again = await cli("purge", "--older-than", "30d", "--json", "--database-url", database_url)
    assert json.loads(again.stdout)["inbox"] == 0  # idempotent
    await box.close()


async def test_a_purged_event_is_still_a_duplicate_and_cannot_be_replayed(
    database_url: str, clock: FrozenClock
) -> None:
    box = Relaybox(settings=Settings(database_url=database_url, admin_token=TOKEN), clock=clock)
    ids = await history(box, clock)
    result = await purge(box, older_than=30 * DAY)
    assert result.inbox == 3
    resend = await box.store.inbox_accept([delivery(clock.now(), "done-old", "ok", {"n": 1})])
    assert resend[0].status == "duplicate"  # key and fingerprint survive the purge
    app = Starlette(routes=[Mount("/admin", app=build_admin(box))])
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://t"
    ) as client:
        r = await client.post(
            f"/admin/api/v1/inbox/{ids['done-old']}/replay",
            json={"reason": "audit"},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
        detail = await client.get(
            f"/admin/api/v1/inbox/{ids['done-old']}", headers={"Authorization": f"Bearer {TOKEN}"}
        )
    await box.close()
    assert r.status_code == 409
    assert r.json()["error"] == "payload_purged"
    assert (
        f"event {ids['done-old']} cannot be replayed: its payload was purged by retention"
        in (r.json()["message"])
    )
    body = detail.json()
    assert body["purged"] and body["payload"] is None and body["purged_at"] is not None
    assert body["status"] == "done"  # the outcome is kept


async def test_one_maintenance_runner_at_a_time(database_url: str, clock: FrozenClock) -> None:
    box = Relaybox(settings=Settings(database_url=database_url), clock=clock)
    other = Relaybox(settings=Settings(database_url=database_url), clock=clock)
    await history(box, clock)
    try:
        if box.store.backend == "postgres":
            async with maintenance_lock(box.store) as mine:
                assert mine
                assert await Maintenance(other).run_once() is None  # the other process waits
        first = await Maintenance(other, interval=3600).run_once()
        assert first is not None and first.inbox == 3
        second = await Maintenance(box).run_once()
        assert second is not None and second.inbox == 0
    finally:
        await box.close()
        await other.close()
