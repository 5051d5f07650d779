"""Retention: ``relaybox purge`` drops payloads past the age and nothing else, a purged
event is still a duplicate and says clearly that it cannot be replayed, and one
maintenance runner at a time across processes (PostgreSQL advisory lock). On the
sending side: finished deliveries lose their payload and their attempts' response
bytes, messages their body once every delivery did; pending, leased and held rows
never do, and a purged delivery is never sent again."""

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
from tests.integration.test_ops_cli import Invoke, cli_runner
from tests.support.outbound_app import endpoint, local, outbox_rows, publish_one
from tests.support.receivers import HttpReceiver, Reply

DAY = 86400.0


@pytest.fixture
def cli() -> Iterator[Invoke]:
    yield from cli_runner()


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
    await box.store.inbox.accept(
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
    await box.store.inbox.accept(
        [
            delivery(old, "quarantined-original", "ok", {"n": 5, "changed": True}),
            delivery(old, "resolved-original", "ok", {"n": 6, "changed": True}),
        ]
    )
    rows = {r["event_id"]: r["id"] for r in await box.store.fetch_all(
        "SELECT id, event_id FROM relaybox_inbox"
    )}  # fmt: skip
    from relaybox.ops import inbound as ops

    await ops.dead_discard(box, rows["discarded-old"], actor="t", reason="noise")
    [resolved] = await box.store.fetch_all(
        "SELECT q.id FROM relaybox_quarantine q JOIN relaybox_inbox i ON i.id = q.inbox_id"
        " WHERE i.event_id = 'resolved-original'"
    )
    await ops.quarantine_resolve(
        box, resolved["id"], resolution="kept_original", actor="t", reason="benign"
    )
    clock.set(time.time() - 1 * DAY)
    await box.store.inbox.accept([delivery(clock.now(), "done-recent", "ok", {"n": 7})])
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
    # A business key's readable row goes with its event's payload; its digest stays.
    gone = {k for k, r in before["relaybox_operations"].items() if r["inbox_id"] in purged}
    assert gone == {"grant:done-old", "grant:resolved-original"}
    business_keys = await box.store.fetch_all("SELECT * FROM relaybox_business_keys")
    assert len(business_keys) == len(before["relaybox_operations"])
    for table, rows in before.items():
        if table == "relaybox_operations":
            rows = {k: r for k, r in rows.items() if k not in gone}
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
    resend = await box.store.inbox.accept([delivery(clock.now(), "done-old", "ok", {"n": 1})])
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


# -- the sending side: deliveries, their attempts, messages ------------------------


async def sending_history(box: Relaybox, clock: FrozenClock, receiver: HttpReceiver) -> Any:
    """Deliveries that finished 40 days ago (sent, dead, a handler's channel row), a
    message nobody subscribed to, deliveries that never finish for the purge (retrying,
    leased by another dispatcher, held for review), and a delivery sent yesterday.
    Returns (outbox ids, message ids) by name."""
    local(box)
    base = f"http://127.0.0.1:{receiver.port}"

    @box.handler("s", "ok")
    async def ok(ctx: Context) -> None:
        body = {"url": f"{base}/sent", "body": {"email": "someone@example.com"}}
        await ctx.outbox.add("review-http", f"crm:{ctx.event.event_id}", body)

    clock.set(time.time() - 40 * DAY)
    messages, eps = {}, {}
    for name in ("sent", "dead", "retry", "leased", "held"):
        eps[name], _ = await endpoint(box, f"{base}/{name}", tenant="t1")
        message = await publish_one(box, data={"to": name}, endpoint_ids=[eps[name]])
        messages[name] = message.id
    messages["nobody"] = (await publish_one(box, data={"to": "-"}, tenant="nobody")).id
    await box.store.inbox.accept([delivery(clock.now(), "with-mail", "ok", {"n": 1})])
    await box.worker().run_once()
    rows = {r["key"].split(":", 1)[0]: r["id"] for r in await outbox_rows(box)}
    ids = {name: rows[mid] for name, mid in messages.items() if mid in rows}
    ids["channel"] = rows["crm"]
    await _write(  # another dispatcher's lease, still running
        box,
        "INSERT INTO relaybox_outbox_leases (outbox_id, lane, owner, token, until, attempt)"
        f" SELECT id, lane, 'other', 1, {time.time() + 3600}, 1 FROM relaybox_outbox"
        f" WHERE id = {ids['leased']}"
        if box.store.backend == "postgres"
        else "UPDATE relaybox_outbox SET lease_owner = 'other', lease_token = 1,"
        f" lease_until = {time.time() + 3600} WHERE id = {ids['leased']}",
    )
    dispatcher = box.dispatcher()
    try:
        while await dispatcher.run_once():
            pass
        # The review policy's outcome after a crash (test_outbound_crash provokes it).
        await _write(box, f"UPDATE relaybox_outbox SET status = 'held' WHERE id = {ids['held']}")
        # Not due again before the purge (say its dispatchers were down for weeks).
        await _write(
            box,
            f"UPDATE relaybox_outbox SET next_attempt_at = {time.time() + DAY}"
            f" WHERE id = {ids['retry']}",
        )
        clock.set(time.time() - 1 * DAY)
        messages["recent"] = (
            await publish_one(box, data={"to": "recent"}, endpoint_ids=[eps["sent"]])
        ).id
        while await dispatcher.run_once():
            pass
    finally:
        await dispatcher.close()
    clock.set(time.time())
    rows = {r["key"].split(":", 1)[0]: r["id"] for r in await outbox_rows(box)}
    ids["recent"] = rows[messages["recent"]]
    states = {
        name: r["status"] for r in await outbox_rows(box) for name, i in ids.items() if r["id"] == i
    }
    assert states == {
        "sent": "sent",
        "dead": "dead",
        "retry": "pending",
        "leased": "pending",
        "held": "held",
        "channel": "sent",
        "recent": "sent",
    }
    return ids, messages


async def _write(box: Relaybox, sql: str) -> None:
    async with box.store.connect() as conn:
        await conn.exec_driver_sql(sql)


def sending_script(seen: Any) -> Reply:
    status = {"/sent": 200, "/dead": 400, "/retry": 500, "/held": 200}.get(seen.path, 200)
    return Reply(status, b'{"receiver": "kept this ' + seen.path.encode() + b'"}')


async def sending_snapshot(box: Relaybox) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for table in ("relaybox_outbox", "relaybox_outbox_attempts", "relaybox_messages"):
        rows = await box.store.fetch_all(f"SELECT * FROM {table} ORDER BY id")
        out[table] = {r["id"]: {k: _plain(v) for k, v in r.items()} for r in rows}
    return out


async def test_outbox_purge_drops_finished_deliveries_payloads_and_nothing_else(
    database_url: str, clock: FrozenClock
) -> None:
    box = Relaybox(settings=Settings(database_url=database_url, admin_token=TOKEN), clock=clock)
    try:
        async with HttpReceiver(sending_script) as receiver:
            ids, messages = await sending_history(box, clock, receiver)
        before = await sending_snapshot(box)
        dry = await purge(box, dry_run=True)
        assert (dry.outbox, dry.messages) == (3, 3)
        assert await sending_snapshot(box) == before
        longer = {"outbox_payload_max_age": 45 * DAY}  # the setting decides the age
        other = Relaybox(settings=Settings(database_url=database_url, retention=longer))
        try:
            assert (await purge(other, dry_run=True)).outbox == 0
        finally:
            await other.close()
        result = await purge(box)  # the default: retention.outbox_payload_max_age, 30 days
        assert (result.outbox, result.messages) == (3, 3)
        after = await sending_snapshot(box)
    finally:
        await box.close()
    purged = {ids["sent"], ids["dead"], ids["channel"]}
    emptied = {messages["sent"], messages["dead"], messages["nobody"]}
    for table, rows in before.items():
        assert after[table].keys() == rows.keys(), table
        for key, row in rows.items():
            now = after[table][key]
            changed = {k for k in row if row[k] != now[k]}
            if table == "relaybox_outbox" and key in purged:
                assert now["payload"] == "null" and now["purged_at"] is not None
                # a webhook row's payload was JSON null already; its body is the message's
                assert changed == {"payload", "purged_at"} - (
                    set() if key == ids["channel"] else {"payload"}
                ), (key, changed)
            elif table == "relaybox_messages" and key in emptied:
                assert changed == {"body", "purged_at"} and now["body"] == "null"
            elif table == "relaybox_outbox_attempts" and row["outbox_id"] in purged:
                # the answer's first bytes and the recorded headers go; the rest stays
                assert changed == {"response", "headers"} and now["response"] is None
                assert now["headers"] is None and row["headers"]
                assert row["response"] and now["status_code"] == row["status_code"]
            else:
                assert changed == set(), (table, key, changed)
    channel_before = before["relaybox_outbox"][ids["channel"]]["payload"]
    assert "someone@example.com" in channel_before  # what the purge is for
    kept = {n: after["relaybox_outbox"][i]["purged_at"] is None for n, i in ids.items()}
    assert kept == {
        "sent": False,
        "dead": False,  # dead 40 days ago: finished, purged like a sent one
        "channel": False,  # a handler's row (ctx.outbox.add), its payload is personal data
        "retry": True,  # still retrying: its message is what the next attempt signs
        "leased": True,  # another dispatcher holds it
        "held": True,  # waiting for a person
        "recent": True,  # sent yesterday
    }


async def test_a_purged_delivery_is_never_sent_again(database_url: str, clock: FrozenClock) -> None:
    """Redeliver and recover skip purged rows (the bytes they would sign are gone);
    the admin says why; a second purge finds nothing; the purge takes the maintenance
    lock like the inbox purge does."""
    from relaybox.outbound import enable_endpoint
    from relaybox.outbound.deliveries import recover, redeliver

    box = Relaybox(settings=Settings(database_url=database_url, admin_token=TOKEN), clock=clock)
    other = Relaybox(settings=Settings(database_url=database_url), clock=clock)
    app = Starlette(routes=[Mount("/admin", app=build_admin(box))])
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        async with HttpReceiver(sending_script) as receiver:
            ids, messages = await sending_history(box, clock, receiver)
        if box.store.backend == "postgres":
            async with maintenance_lock(box.store) as mine:
                assert mine
                assert await Maintenance(other).run_once() is None  # the other one waits
            assert (await sending_snapshot(box))["relaybox_outbox"][ids["sent"]][
                "purged_at"
            ] is None
        first = await Maintenance(other).run_once()
        assert first is not None and (first.outbox, first.messages) == (3, 3)
        second = await Maintenance(box).run_once()
        assert second is not None and (second.outbox, second.messages) == (0, 0)

        assert await redeliver(box, messages["sent"], tenant=None) == 0
        [dead_ep] = await box.store.fetch_all(
            f"SELECT endpoint_id FROM relaybox_outbox WHERE id = {ids['dead']}"
        )
        await enable_endpoint(box, dead_ep["endpoint_id"], tenant=None)
        assert await recover(box, dead_ep["endpoint_id"], since=0.0, tenant=None) == 0
        assert await redeliver(box, messages["recent"], tenant=None) == 1  # not purged
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t"
        ) as client:
            r = await client.post(
                f"/admin/api/v1/messages/{messages['sent']}/redeliver",
                json={"reason": "customer lost it"},
                headers=auth,
            )
            detail = await client.get(f"/admin/api/v1/messages/{messages['sent']}", headers=auth)
            await client.post("/admin/login", data={"token": TOKEN, "next": "/admin/"})
            page = (await client.get(f"/admin/messages/{messages['sent']}")).text
        assert r.status_code == 409 and r.json()["error"] == "payload_purged"
        assert "its body was purged by retention on" in r.json()["message"]
        body = detail.json()
        assert body["payload"] is None and body["purged_at"] is not None
        assert [d["status"] for d in body["deliveries"]] == ["sent"]  # the outcome is kept
        assert "Purged by retention on" in page and 'name="redeliver"' not in page
    finally:
        await box.close()
        await other.close()
