"""Erasing one subject (relaybox.erasure), on SQLite and PostgreSQL: every payload,
header, attempt body and response excerpt of the subject goes, found through the
index the accept and the publish wrote; keys, fingerprints, statuses and outcomes
stay (a resend is still a duplicate, a changed payload still quarantined, business
keys still hold); each erasure is recorded and idempotent; pending rows wait and are
emptied once they finish; and the database files no longer hold the subject's bytes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from relaybox import Context, Relaybox
from relaybox.config import Settings
from relaybox.erasure import erase, resume_waiting, run_erasure, start_erasure
from relaybox.errors import Conflict, InvalidRequest
from relaybox.ops import inbound as ops
from relaybox.retention import Maintenance
from relaybox.sources.base import subject_digest
from relaybox.testing import Harness, test_source
from tests.support.outbound_app import (
    dispatch_once,
    endpoint,
    local,
    outbox_rows,
    publish_one,
)
from tests.support.receivers import HttpReceiver, Reply

ALICE = "cus_alice"
BOB = "cus_bob"
# What the database must no longer hold once Alice is erased: in her payloads, in the
# headers her deliveries came with, in what a receiver answered about her.
ALICE_EMAIL = "alice.erasure-marker@example.com"
BOB_EMAIL = "bob.kept-marker@example.com"


def invoice(event_id: str, customer: str, email: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": event_id,
        "type": "invoice.paid",
        "data": {"object": {"id": f"in_{event_id}", "customer": customer, "email": email}},
        **extra,
    }


def configure(box: Relaybox) -> Harness:
    box.source("stripe", test_source("stripe", subject="data.object.customer"))

    @box.handler("stripe", "invoice.paid")
    async def paid(ctx: Context) -> None:
        await ctx.once(f"grant:{ctx.payload['data']['object']['id']}")

    return Harness.of(box)


async def inbox(box: Relaybox) -> dict[str, dict[str, Any]]:
    rows = await box.store.fetch_all(
        "SELECT event_id, status, payload, headers, fingerprint, purged_at, erased_at"
        " FROM relaybox_inbox"
    )
    return {r["event_id"]: r for r in rows}


async def test_erase_a_subject_keeps_keys_and_outcomes(box: Relaybox) -> None:
    kit = configure(box)
    for i in range(3):
        await kit.send("stripe", payload=invoice(f"evt_a{i}", ALICE, ALICE_EMAIL))
    for i in range(2):
        await kit.send("stripe", payload=invoice(f"evt_b{i}", BOB, BOB_EMAIL))
    assert await kit.run_worker() == 5
    # A changed payload under one of Alice's event ids: kept apart, in quarantine.
    changed = invoice("evt_a0", ALICE, ALICE_EMAIL, note="changed")
    assert (await kit.deliver(kit.signed("stripe", payload=changed))).outcome == "quarantined"

    done = await erase(box, subject=ALICE, actor="dpo@example.com", reason="GDPR art. 17")

    assert done.rows == {
        "inbox": 3,
        "quarantine": 1,
        "outbox": 0,
        "attempts": 0,
        "messages": 0,
        "inbox_attempts": 0,
        "projections": 0,
    }
    assert done.finished_at is not None and done.waiting == 0
    assert (done.actor, done.reason, done.scope) == ("dpo@example.com", "GDPR art. 17", "subject")
    assert done.digest == subject_digest(ALICE) and done.tenant is None
    rows = await inbox(box)
    for i in range(3):
        row = rows[f"evt_a{i}"]
        assert row["payload"] is None and row["headers"] is None
        assert row["status"] == "done" and row["erased_at"] is not None
        assert row["purged_at"] == row["erased_at"] and bytes(row["fingerprint"])
    for i in range(2):
        assert ALICE_EMAIL.encode() not in bytes(rows[f"evt_b{i}"]["payload"])
        assert BOB_EMAIL.encode() in bytes(rows[f"evt_b{i}"]["payload"])
        assert rows[f"evt_b{i}"]["erased_at"] is None
    [entry] = await box.store.fetch_all(
        "SELECT payload, headers, erased_at FROM relaybox_quarantine"
    )
    assert entry["payload"] is None and entry["headers"] is None and entry["erased_at"]
    keys = await box.store.fetch_all("SELECT business_key FROM relaybox_operations")
    assert len(keys) == 5  # business keys hold

    # Duplicates still deduplicate, a changed payload is still quarantined.
    again = await kit.deliver(kit.signed("stripe", payload=invoice("evt_a1", ALICE, ALICE_EMAIL)))
    assert again.status == 200 and again.outcome == "duplicate"
    other = invoice("evt_a1", ALICE, ALICE_EMAIL, note="other")
    assert (await kit.deliver(kit.signed("stripe", payload=other))).outcome == "quarantined"
    assert (await inbox(box))["evt_a1"]["payload"] is None
    # Nothing to replay: refused, saying why.
    event_id = (await box.store.fetch_all(
        "SELECT id FROM relaybox_inbox WHERE event_id = 'evt_a2'"
    ))[0]["id"]  # fmt: skip
    with pytest.raises(Conflict, match="erased") as refused:
        await ops.replay_event(box, event_id, actor="op", reason="again")
    assert refused.value.code == "payload_purged"
    detail = await ops.event_get(box, event_id)
    assert detail.payload is None and detail.erased_at is not None and detail.purged

    # Asking again records it: it finds nothing left of what the first one emptied, and
    # empties the conflicting content quarantined since, under an erased event's id.
    second = await erase(box, subject=ALICE, actor="dpo@example.com")
    assert second.id != done.id and second.finished_at
    assert second.rows == {"inbox": 0, "quarantine": 1, "outbox": 0, "attempts": 0, "messages": 0,
                           "inbox_attempts": 0, "projections": 0}  # fmt: skip
    third = await erase(box, subject=ALICE, actor="dpo@example.com")
    assert third.id != second.id and not any(third.rows.values()) and third.finished_at
    assert len(await box.store.erasure.latest()) == 3


async def test_arguments_are_checked(box: Relaybox) -> None:
    for bad in (
        {"actor": "a"},
        {"subject": "x", "tenant": "t", "actor": "a"},
        {"subject": "", "actor": "a"},
        {"subject": "x" * 2000, "actor": "a"},
        {"subject": "nul\x00", "actor": "a"},
        {"subject": "x", "actor": ""},
    ):
        with pytest.raises(InvalidRequest):
            await start_erasure(box, **bad)
    assert await box.store.erasure.latest() == []


async def test_pending_rows_wait_until_they_finish(box: Relaybox) -> None:
    kit = configure(box)
    await kit.send("stripe", payload=invoice("evt_done", ALICE, ALICE_EMAIL))
    assert await kit.run_worker() == 1
    await kit.send("stripe", payload=invoice("evt_pending", ALICE, ALICE_EMAIL))

    first = await erase(box, subject=ALICE, actor="dpo")

    assert first.rows["inbox"] == 1 and first.waiting == 1 and first.finished_at is None
    rows = await inbox(box)
    assert rows["evt_pending"]["payload"] is not None  # its handler still needs it
    assert rows["evt_done"]["payload"] is None
    # Asking again resumes the same erasure: no second record while it waits.
    again, resumed = await start_erasure(box, subject=ALICE, actor="someone else")
    assert resumed and again.id == first.id and again.actor == "dpo"

    assert await kit.run_worker() == 1  # the handler runs on the whole payload
    await Maintenance(box).run_once()

    finished = await box.store.erasure.get(first.id)
    assert finished is not None and finished.finished_at is not None
    assert finished.waiting == 0 and finished.rows["inbox"] == 2
    assert (await inbox(box))["evt_pending"]["payload"] is None
    assert await resume_waiting(box) == []


async def test_an_erasure_cut_short_is_finished_by_maintenance(box: Relaybox) -> None:
    """The process stops after one batch's COMMIT (what a kill between two batches
    leaves; a kill inside one rolls that batch back): the erasure stays open, the
    maintenance job finishes it, and every row is counted once."""
    kit = configure(box)
    for i in range(5):
        await kit.send("stripe", payload=invoice(f"evt_a{i}", ALICE, ALICE_EMAIL))
    assert await kit.run_worker() == 5
    erasure, _ = await start_erasure(box, subject=ALICE, actor="dpo", reason="r")
    first = await box.store.erasure.erase_batch(erasure, now=box.clock.now(), limit=2)
    assert first["inbox"] == 2
    cut = await box.store.erasure.get(erasure.id)
    assert cut is not None and cut.finished_at is None and cut.rows["inbox"] == 2

    await Maintenance(box).run_once()

    done = await box.store.erasure.get(erasure.id)
    assert done is not None and done.finished_at is not None
    assert done.rows["inbox"] == 5 and done.waiting == 0
    assert all(r["payload"] is None for r in (await inbox(box)).values())


async def test_outbound_subject_and_tenant(box: Relaybox) -> None:
    local(box)
    answers = Reply(200, b'{"seen": "' + ALICE_EMAIL.encode() + b'"}')
    async with HttpReceiver(answers) as receiver:
        await endpoint(box, receiver.url, tenant="t1")
        await endpoint(box, receiver.url, tenant="t2")
        a = await publish_one(box, "invoice.paid", {"email": ALICE_EMAIL}, subject=ALICE)
        b = await publish_one(box, "invoice.paid", {"email": BOB_EMAIL}, subject=BOB)
        t2 = await publish_one(box, "invoice.paid", {"email": ALICE_EMAIL}, tenant="t2")
        pending = await erase(box, subject=ALICE, actor="dpo")
        # Its delivery is not sent yet: message and delivery wait.
        assert pending.waiting == 1 and not any(pending.rows.values())
        while await dispatch_once(box):
            pass
        assert len(receiver.requests) == 3
        [done] = await resume_waiting(box)

    assert done.rows == {
        "inbox": 0,
        "quarantine": 0,
        "outbox": 1,
        "attempts": 1,
        "messages": 1,
        "inbox_attempts": 0,
        "projections": 0,
    }
    assert done.finished_at is not None
    messages = {
        r["id"]: r
        for r in await box.store.fetch_all("SELECT id, body, erased_at FROM relaybox_messages")
    }
    assert json.loads(messages[a.id]["body"]) is None and messages[a.id]["erased_at"]
    # What operators and the tenant read of it: the erased message, never a 500.
    from relaybox.errors import Conflict as Refused
    from relaybox.ops import delivery_log
    from relaybox.ops import outbound as ops_outbound

    detail = await ops_outbound.message_get(box, a.id)
    assert detail.payload is None and detail.purged_at is not None
    assert ALICE_EMAIL not in detail.model_dump_json()
    view = await delivery_log.message_view(box, a.id, "t1")
    assert view is not None and ALICE_EMAIL not in json.dumps(view, default=str)
    with pytest.raises(Refused) as refused:
        await ops_outbound.message_redeliver(box, a.id, endpoint_id=None)
    assert refused.value.code == "payload_purged"
    assert BOB_EMAIL in messages[b.id]["body"] and ALICE_EMAIL in messages[t2.id]["body"]
    attempts = await box.store.fetch_all(
        "SELECT o.message_id, a.response, a.headers, a.status_code, o.status"
        " FROM relaybox_outbox_attempts a JOIN relaybox_outbox o ON o.id = a.outbox_id"
    )
    by_message = {r["message_id"]: r for r in attempts}
    assert by_message[a.id]["response"] is None and by_message[a.id]["headers"] is None
    assert (by_message[a.id]["status_code"], by_message[a.id]["status"]) == (200, "sent")
    assert by_message[b.id]["response"] is not None

    # A tenant: every message published to it, with its deliveries and their answers.
    tenant = await erase(box, tenant="t2", actor="dpo", reason="account closed")
    assert tenant.rows == {
        "inbox": 0,
        "quarantine": 0,
        "outbox": 1,
        "attempts": 1,
        "messages": 1,
        "inbox_attempts": 0,
        "projections": 0,
    }
    assert tenant.scope == "tenant" and tenant.digest is None and tenant.tenant == "t2"
    [row] = await box.store.fetch_all(
        "SELECT body FROM relaybox_messages WHERE id = :id".replace(":id", f"'{t2.id}'")
    )
    assert json.loads(row["body"]) is None
    # The idempotency key still finds its message after erasure.
    keyed = await publish_one(box, "invoice.paid", {"n": 1}, subject=ALICE, idempotency_key="k1")
    await erase(box, subject=ALICE, actor="dpo")
    same = await publish_one(box, "invoice.paid", {"n": 2}, subject=ALICE, idempotency_key="k1")
    assert same.id == keyed.id


async def test_erasure_races_a_worker(box: Relaybox) -> None:
    """The handler holds its transaction (and on PostgreSQL the row's lock) while an
    erasure of its subject runs: the handler still sees the whole payload, the row is
    emptied only once it finished, and nothing is left behind."""
    box.source("stripe", test_source("stripe", subject="data.object.customer"))
    entered, release = asyncio.Event(), asyncio.Event()
    seen: list[str] = []

    @box.handler("stripe", "invoice.paid")
    async def paid(ctx: Context) -> None:
        entered.set()
        await release.wait()
        seen.append(ctx.payload["data"]["object"]["email"])
        await ctx.once(f"grant:{ctx.event.event_id}")

    kit = Harness.of(box)
    await kit.send("stripe", payload=invoice("evt_busy", ALICE, ALICE_EMAIL))
    await kit.send("stripe", payload=invoice("evt_other", ALICE, ALICE_EMAIL))
    worker = asyncio.create_task(kit.run_worker())
    await asyncio.wait_for(entered.wait(), 10)
    erasing = asyncio.create_task(erase(box, subject=ALICE, actor="dpo"))
    await asyncio.sleep(0.3)  # the erasure runs (PostgreSQL) or waits for the writer
    release.set()
    await asyncio.wait_for(worker, 30)
    first = await asyncio.wait_for(erasing, 30)
    assert seen == [ALICE_EMAIL, ALICE_EMAIL]
    final = await run_erasure(box, first.id)
    assert final.finished_at is not None and final.rows["inbox"] == 2
    rows = await inbox(box)
    assert all(r["payload"] is None and r["status"] == "done" for r in rows.values())
    assert len(await box.store.fetch_all("SELECT * FROM relaybox_operations")) == 2


async def _alice_left(box: Relaybox) -> list[str]:
    """The columns of relaybox's rows that still hold Alice's e-mail (as text)."""
    found = []
    for table in RELAYBOX_TABLES:
        for row in await box.store.fetch_all(f"SELECT * FROM relaybox_{table}"):
            for column, value in row.items():
                text = (
                    bytes(value).decode(errors="replace")
                    if isinstance(value, bytes | memoryview)
                    else value
                )
                if ALICE_EMAIL in str(text):
                    found.append(f"relaybox_{table}.{column}")
    return found


async def test_erasure_races_a_worker_and_a_dispatcher(box: Relaybox) -> None:
    """An erasure runs while a worker handles one of the subject's events (its
    transaction open, the row locked on PostgreSQL) and a dispatcher is sending one
    of the subject's messages (the delivery leased, the receiver not answered yet).
    What happens, as docs/operating.md says: the erasure does not wait for them and
    does not interrupt them; it empties what is finished, reports the rest as waiting
    (not finished), and a later run (the maintenance job, or asking again) empties
    them once they finish. Each effect happens once, on the whole payload: the handler
    runs once, the receiver gets one request with the full body. And an erasure that
    reports finished leaves no byte of the subject in any row."""
    local(box)
    box.source("stripe", test_source("stripe", subject="data.object.customer"))
    entered, release = asyncio.Event(), asyncio.Event()
    seen: list[str] = []

    @box.handler("stripe", "invoice.paid")
    async def paid(ctx: Context) -> None:
        entered.set()
        await release.wait()
        seen.append(ctx.payload["data"]["object"]["email"])
        await ctx.once(f"grant:{ctx.event.event_id}")

    kit = Harness.of(box)
    async with HttpReceiver(Reply(hang=True)) as receiver:
        await endpoint(box, receiver.url, tenant="t1")
        await publish_one(box, "invoice.paid", {"email": ALICE_EMAIL}, subject=ALICE)
        await kit.send("stripe", payload=invoice("evt_busy", ALICE, ALICE_EMAIL))
        # The dispatcher first: on SQLite the worker's open transaction is the only
        # writer, and the lease would wait for it.
        dispatching = asyncio.create_task(dispatch_once(box))
        [request] = await receiver.wait_for(1, within=30)
        working = asyncio.create_task(kit.run_worker())
        await asyncio.wait_for(entered.wait(), 30)

        erasing = asyncio.create_task(erase(box, subject=ALICE, actor="dpo"))
        if box.store.backend == "postgres":
            # Row locks are skipped (SKIP LOCKED), pending rows left: it ends now.
            first = await asyncio.wait_for(erasing, 30)
            assert first.finished_at is None and first.waiting == 2
            assert not any(first.rows.values())
            # The event and the message (a delivery signs the message's body): whole.
            assert sorted(await _alice_left(box)) == [
                "relaybox_inbox.payload", "relaybox_messages.body"
            ]  # fmt: skip
        else:
            await asyncio.sleep(0.3)  # SQLite: the batch waits for the worker's COMMIT
        release.set()
        receiver.release()
        assert await asyncio.wait_for(working, 30) == 1
        assert await asyncio.wait_for(dispatching, 30) == 1
        first = await asyncio.wait_for(erasing, 30)
    if first.finished_at is not None:  # never before the rows it waited for finished
        assert await _alice_left(box) == []

    final = await run_erasure(box, first.id)  # what the maintenance job runs

    assert final.finished_at is not None and final.waiting == 0
    assert (final.rows["inbox"], final.rows["outbox"], final.rows["attempts"]) == (1, 1, 1)
    assert final.rows["messages"] == 1
    assert await _alice_left(box) == []
    # Each effect once, on the whole payload.
    assert seen == [ALICE_EMAIL]
    assert ALICE_EMAIL.encode() in request.body and len(receiver.requests) == 1
    assert len(await box.store.fetch_all("SELECT * FROM relaybox_operations")) == 1
    [delivery] = await outbox_rows(box)
    assert delivery["status"] == "sent"


async def test_rows_handlers_added_to_the_outbox(box: Relaybox) -> None:
    """What a handler of the subject's event added to the outbox (an e-mail to the
    subject) is the subject's too: kept while pending, emptied once sent."""
    from relaybox.outbound import outbound
    from relaybox.outbound.channels.base import Channel, Result
    from relaybox.store.outbox_rows import Delivery

    sent: list[Any] = []

    class Mail(Channel):
        async def deliver(self, delivery: Delivery) -> Result:
            sent.append(delivery.payload)
            return Result("sent")

    local(box)
    outbound(box).channel("mail", Mail())
    box.source("stripe", test_source("stripe", subject="data.object.customer"))

    @box.handler("stripe", "invoice.paid")
    async def paid(ctx: Context) -> None:
        customer = ctx.payload["data"]["object"]
        await ctx.outbox.add("mail", f"receipt:{customer['id']}", {"to": customer["email"]})

    kit = Harness.of(box)
    await kit.send("stripe", payload=invoice("evt_a0", ALICE, ALICE_EMAIL))
    await kit.send("stripe", payload=invoice("evt_b0", BOB, BOB_EMAIL))
    assert await kit.run_worker() == 2

    first = await erase(box, subject=ALICE, actor="dpo")
    assert first.rows["inbox"] == 1 and first.rows["outbox"] == 0 and first.waiting == 1
    await kit.drain_dispatcher()
    assert sorted(p["to"] for p in sent) == [ALICE_EMAIL, BOB_EMAIL]  # sent whole
    [done] = await resume_waiting(box)

    assert done.rows["outbox"] == 1 and done.finished_at is not None
    rows = {
        r["key"]: r
        for r in await box.store.fetch_all("SELECT key, payload, status FROM relaybox_outbox")
    }
    assert json.loads(rows["receipt:in_evt_a0"]["payload"]) is None
    assert rows["receipt:in_evt_a0"]["status"] == "sent"
    assert BOB_EMAIL in rows["receipt:in_evt_b0"]["payload"]


# -- the database's bytes -----------------------------------------------------------------


async def _files_hold(box: Relaybox, marker: bytes) -> list[str]:
    """The database files (SQLite: the file and its WAL; PostgreSQL: every relation
    file of relaybox's tables, their TOAST tables and indexes, read by the server after
    a CHECKPOINT) that hold ``marker``."""
    store = box.store
    if store.backend == "sqlite":
        await store.erasure.flush()
        path = Path(make_url(store.url).database or "")
        found = []
        for file in (path, Path(f"{path}-wal")):
            if file.exists() and marker in file.read_bytes():
                found.append(file.name)
        return found
    async with store.engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.exec_driver_sql("CHECKPOINT")
        rows = await conn.exec_driver_sql(
            "SELECT c.relname, pg_relation_filepath(c.oid) FROM pg_class c"
            " WHERE c.relkind IN ('r', 't', 'i') AND pg_relation_filepath(c.oid) IS NOT NULL"
            "   AND (c.relname LIKE 'relaybox%' OR c.oid IN (SELECT reltoastrelid FROM pg_class"
            "        WHERE relname LIKE 'relaybox%'))"
        )
        found = []
        for name, filepath in rows.all():
            data = (
                await conn.exec_driver_sql("SELECT pg_read_binary_file($1)", (filepath,))
            ).scalar_one()
            if data and marker in bytes(data):
                found.append(name)
        return found


RELAYBOX_TABLES = (
    "inbox", "inbox_attempts", "quarantine", "outbox", "outbox_attempts", "messages",
    "projections",
)  # fmt: skip


async def _files_hold_after_vacuum(box: Relaybox, marker: bytes) -> list[str]:
    """:func:`_files_hold` once the old row versions are gone: on PostgreSQL a VACUUM
    FULL of the tables an erasure changes, as docs/operating.md says, once no snapshot
    older than the erasure is open (an autovacuum ANALYZE of another table holds one
    briefly)."""
    left = await _files_hold(box, marker)
    if box.store.backend == "postgres":
        for _ in range(20):
            async with box.store.engine.connect() as conn:
                conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
                for table in RELAYBOX_TABLES:
                    await conn.exec_driver_sql(f"VACUUM FULL relaybox_{table}")
            left = await _files_hold(box, marker)
            if not left:
                break
            await asyncio.sleep(0.5)
    return left


@pytest.mark.timeout(300)  # VACUUM FULL of six tables, retried: slow on a busy host
async def test_no_byte_of_the_subject_is_left(box: Relaybox) -> None:
    """Scans the database files: before the erasure they hold Alice's e-mail (the scan
    can fail), after it (and, on PostgreSQL, a VACUUM FULL that drops the old row
    versions, as docs/operating.md says) they do not; Bob's is still there."""
    kit = configure(box)
    local(box)
    big = "x" * 9000  # over PostgreSQL's TOAST threshold and SQLite's overflow size
    answers = Reply(200, b'{"seen": "' + ALICE_EMAIL.encode() + b'"}')
    async with HttpReceiver(answers) as receiver:
        await endpoint(box, receiver.url, tenant="t1")
        for i in range(3):
            await kit.send("stripe", payload=invoice(f"evt_a{i}", ALICE, ALICE_EMAIL, pad=big))
            await kit.send("stripe", payload=invoice(f"evt_b{i}", BOB, BOB_EMAIL))
        await publish_one(box, "invoice.paid", {"email": ALICE_EMAIL, "pad": big}, subject=ALICE)
        await kit.run_worker()
        while await dispatch_once(box):
            pass
    marker = ALICE_EMAIL.encode()
    assert await _files_hold(box, marker)

    done = await erase(box, subject=ALICE, actor="dpo")
    assert done.finished_at is not None
    assert done.rows["inbox"] == 3 and done.rows["messages"] == 1
    assert await _files_hold_after_vacuum(box, marker) == []
    assert await _files_hold(box, BOB_EMAIL.encode())


@pytest.mark.timeout(300)  # VACUUM FULL of six tables, retried: slow on a busy host
async def test_no_byte_of_the_subject_is_left_in_error_text(box: Relaybox) -> None:
    """The subject's data quoted in free text rather than in a payload: a handler's
    exception (the inbox row's last_error, its attempt's error, the dead letter's
    operational event), a channel's error (the outbox row's last_error, its attempt's
    error, the relaybox.message.attempt.exhausted event), a receiver's answer. Each
    column holds Alice's e-mail before the erasure (checked one by one: the scan can
    fail), no database file holds it after; Bob's texts are untouched."""
    from relaybox.errors import PermanentError
    from relaybox.outbound import outbound
    from relaybox.outbound.channels.base import Channel, Result
    from relaybox.store.outbox_rows import Delivery

    class Mail(Channel):
        async def deliver(self, delivery: Delivery) -> Result:
            to = delivery.payload["to"]
            return Result("retry", error=f"mailbox {to} is full")

    local(box)
    outbound(box).channel("mail", Mail(schedule=()))  # the first failure exhausts it
    box.source("stripe", test_source("stripe", subject="data.object.customer"))

    @box.handler("stripe", "invoice.paid")
    async def paid(ctx: Context) -> None:
        customer = ctx.payload["data"]["object"]
        if ctx.event.attempts == 1:
            raise ValueError(f"no account for {customer['email']}")
        await ctx.outbox.add("mail", f"receipt:{customer['id']}", {"to": customer["email"]})

    @box.handler("stripe", "invoice.voided")
    async def voided(ctx: Context) -> None:
        raise PermanentError(f"cannot void for {ctx.payload['data']['object']['email']}")

    kit = Harness.of(box)
    voided_event = {**invoice("evt_a_void", ALICE, ALICE_EMAIL), "type": "invoice.voided"}
    await kit.send("stripe", payload=voided_event)
    await kit.send("stripe", payload=invoice("evt_a0", ALICE, ALICE_EMAIL))
    await kit.send("stripe", payload=invoice("evt_b0", BOB, BOB_EMAIL))
    assert await kit.run_worker() == 3  # two retries, one dead letter
    kit.advance(3600)
    assert await kit.drain_worker() == 2
    await kit.drain_dispatcher()  # each mail fails once and is exhausted
    answers = [Reply(500, b'{"error": "unknown ' + ALICE_EMAIL.encode() + b'"}'), Reply(200)]
    async with HttpReceiver(answers) as receiver:
        await endpoint(box, receiver.url, tenant="t1")
        await publish_one(box, "invoice.paid", {"id": "in_x"}, subject=ALICE)
        await kit.drain_dispatcher()
        kit.advance(3600)
        await kit.drain_dispatcher()
        assert len(receiver.requests) == 2

    texts = {
        "relaybox_inbox.last_error": "SELECT last_error FROM relaybox_inbox",
        "relaybox_inbox_attempts.error": "SELECT error FROM relaybox_inbox_attempts",
        "relaybox_outbox.last_error": "SELECT last_error FROM relaybox_outbox",
        "relaybox_outbox_attempts.error": "SELECT error FROM relaybox_outbox_attempts",
        "relaybox_outbox_attempts.response": "SELECT response FROM relaybox_outbox_attempts",
        "relaybox_messages.body": "SELECT body FROM relaybox_messages WHERE event_type"
        " IN ('relaybox.inbox.dead', 'relaybox.message.attempt.exhausted')",
    }

    async def holding(email: str) -> set[str]:
        found = set()
        for column, sql in texts.items():
            for row in await box.store.fetch_all(sql):
                if email in str(next(iter(row.values()))):
                    found.add(column)
        return found

    assert await holding(ALICE_EMAIL) == set(texts)
    bob_before = await holding(BOB_EMAIL)
    assert {"relaybox_inbox.last_error", "relaybox_outbox_attempts.error"} <= bob_before

    done = await erase(box, subject=ALICE, actor="dpo")

    assert done.finished_at is not None and done.waiting == 0
    # Alice's two events and their two failed handler attempts; her mail and its
    # attempt, her message's delivery and its two attempts; her message and the two
    # operational events about her rows.
    assert done.rows == {"inbox": 2, "quarantine": 0, "outbox": 2, "attempts": 3,
                         "messages": 3, "inbox_attempts": 2, "projections": 0}  # fmt: skip
    assert await holding(ALICE_EMAIL) == set()
    assert await holding(BOB_EMAIL) == bob_before
    rows = await box.store.fetch_all(
        "SELECT event_id, status, dead_reason, last_error FROM relaybox_inbox"
    )
    by_id = {r["event_id"]: r for r in rows}
    assert (by_id["evt_a_void"]["status"], by_id["evt_a_void"]["dead_reason"]) == (
        "dead", "invalid"
    )  # fmt: skip
    assert by_id["evt_a_void"]["last_error"] == "(erased)"
    assert await _files_hold_after_vacuum(box, ALICE_EMAIL.encode()) == []
    assert await _files_hold(box, BOB_EMAIL.encode())


async def _index(box: Relaybox) -> set[tuple[str, str]]:
    """The subject index's (kind, ref) rows."""
    rows = await box.store.fetch_all("SELECT kind, ref FROM relaybox_subjects")
    return {(r["kind"], r["ref"]) for r in rows}


@pytest.mark.timeout(300)  # VACUUM FULL of seven tables, retried: slow on a busy host
async def test_retention_bounds_the_index_and_an_erasure_after_it_still_empties_all(
    box: Relaybox,
) -> None:
    """The purge deletes the subject index's rows of the rows it emptied once they
    find nothing more (index rows of rows with an error text left stay); a projection
    keeps the subject of the event whose state it holds; a conflicting resend of a
    purged event is indexed again. An erasure after the purge then leaves no byte of
    the subject in the database files (the projection's state, the quarantined resend,
    the error text) and deletes the index rows it used."""
    from relaybox.retention import purge

    local(box)
    box.source("stripe", test_source("stripe", subject="data.object.customer"))

    @box.handler("stripe", "invoice.paid")
    async def paid(ctx: Context) -> None:
        customer = ctx.payload["data"]["object"]
        if ctx.payload.get("fails") and ctx.event.attempts == 1:
            raise ValueError(f"no account for {customer['email']}")
        state = {"email": customer["email"]}
        await ctx.project(f"customer:{customer['customer']}", ctx.payload["seq"], state)

    kit = Harness.of(box)
    await kit.send("stripe", payload=invoice("evt_a0", ALICE, ALICE_EMAIL, seq=1))
    await kit.send("stripe", payload=invoice("evt_a1", ALICE, ALICE_EMAIL, seq=2, fails=True))
    await kit.send("stripe", payload=invoice("evt_a2", ALICE, ALICE_EMAIL, seq=3))
    await kit.send("stripe", payload=invoice("evt_b0", BOB, BOB_EMAIL, seq=1))
    async with HttpReceiver([Reply(200, b'{"seen": "' + ALICE_EMAIL.encode() + b'"}')]) as rx:
        await endpoint(box, rx.url, tenant="t1")
        await publish_one(box, "invoice.paid", {"email": ALICE_EMAIL}, subject=ALICE)
        await kit.drain_dispatcher()
    assert await kit.run_worker() == 4  # evt_a1 fails once
    kit.advance(3600)
    assert await kit.drain_worker() == 1
    ids = {
        r["event_id"]: str(r["id"])
        for r in await box.store.fetch_all("SELECT id, event_id FROM relaybox_inbox")
    }
    indexed = await _index(box)
    assert {ref for kind, ref in indexed if kind == "inbox"} == set(ids.values())
    assert len([kind for kind, _ in indexed if kind == "message"]) == 1

    kit.advance(7200)
    result = await purge(box, older_than=3600)
    assert (result.inbox, result.outbox, result.messages) == (4, 1, 1)
    # Only evt_a1 still holds something an erasure empties: its attempt's error text.
    assert await _index(box) == {("inbox", ids["evt_a1"])}
    # A changed payload under a purged event's id: quarantined, and indexed again.
    changed = invoice("evt_a0", ALICE, ALICE_EMAIL, seq=1, note="changed")
    assert (await kit.deliver(kit.signed("stripe", payload=changed))).outcome == "quarantined"
    assert await _index(box) == {("inbox", ids["evt_a1"]), ("inbox", ids["evt_a0"])}
    [alice] = await box.store.fetch_all(
        "SELECT version, state, subject FROM relaybox_projections"
        " WHERE resource_key = 'customer:cus_alice'"
    )
    assert ALICE_EMAIL in alice["state"] and bytes(alice["subject"]) == subject_digest(ALICE)
    marker = ALICE_EMAIL.encode()
    assert await _files_hold(box, marker)

    done = await erase(box, subject=ALICE, actor="dpo")

    assert done.finished_at is not None and done.waiting == 0
    # evt_a1 (its error text) and evt_a0 (found through its quarantined resend), the
    # resend, evt_a1's failed attempt, the projection of Alice.
    assert done.rows == {"inbox": 2, "quarantine": 1, "outbox": 0, "attempts": 0,
                         "messages": 0, "inbox_attempts": 1, "projections": 1}  # fmt: skip
    assert await _index(box) == set()
    [alice] = await box.store.fetch_all(
        "SELECT version, state, erased_at FROM relaybox_projections"
        " WHERE resource_key = 'customer:cus_alice'"
    )
    assert alice["state"] is None and alice["version"] == "3" and alice["erased_at"]
    [bob] = await box.store.fetch_all(
        "SELECT state, erased_at FROM relaybox_projections WHERE resource_key = 'customer:cus_bob'"
    )
    assert BOB_EMAIL in bob["state"] and bob["erased_at"] is None
    # A stale event of Alice's is still refused by the version the projection kept.
    await kit.send("stripe", payload=invoice("evt_a_old", ALICE, ALICE_EMAIL, seq=0))
    assert await kit.run_worker() == 1
    [alice] = await box.store.fetch_all(
        "SELECT state FROM relaybox_projections WHERE resource_key = 'customer:cus_alice'"
    )
    assert alice["state"] is None
    again = await erase(box, subject=ALICE, actor="dpo")
    assert again.rows["inbox"] == 1 and again.rows["projections"] == 0
    assert await _files_hold_after_vacuum(box, marker) == []
    assert await _files_hold(box, BOB_EMAIL.encode())


async def test_a_tenant_erasure_reaches_the_events_received_for_it(box: Relaybox) -> None:
    """Erasing a tenant empties the events its verified accounts sent (payload, headers,
    error text, their handler attempts' errors), their quarantine entries and the rows
    its handlers added to the outbox; an event still pending waits; another tenant's
    events stay. Keys stay: a resend is still a duplicate."""
    from relaybox.outbound import outbound
    from relaybox.outbound.channels.base import Channel, Result
    from relaybox.store.outbox_rows import Delivery

    class Mail(Channel):
        async def deliver(self, delivery: Delivery) -> Result:
            return Result("sent", response=f"queued for {delivery.payload['to']}")

    local(box)
    outbound(box).channel("mail", Mail())
    tenants = {"acct_gone": "t_gone", "acct_kept": "t_kept"}
    box.source("stripe", test_source("stripe", tenants=tenants))

    @box.handler("stripe", "invoice.paid")
    async def paid(ctx: Context) -> None:
        customer = ctx.payload["data"]["object"]
        if ctx.event.attempts == 1:
            raise ValueError(f"no account for {customer['email']}")
        await ctx.outbox.add("mail", f"receipt:{customer['id']}", {"to": customer["email"]})

    kit = Harness.of(box)
    gone = invoice("evt_g0", ALICE, ALICE_EMAIL, account="acct_gone")
    await kit.send("stripe", payload=gone)
    await kit.send("stripe", payload=invoice("evt_k0", BOB, BOB_EMAIL, account="acct_kept"))
    assert await kit.run_worker() == 2  # both fail once
    kit.advance(3600)
    assert await kit.drain_worker() == 2
    await kit.drain_dispatcher()
    changed = {**gone, "note": "changed"}
    assert (await kit.deliver(kit.signed("stripe", payload=changed))).outcome == "quarantined"
    await kit.send("stripe", payload=invoice("evt_g1", ALICE, ALICE_EMAIL, account="acct_gone"))

    done = await erase(box, tenant="t_gone", actor="dpo", reason="account closed")

    # evt_g1 is not handled yet: it waits. The rest of the tenant's rows are empty.
    assert done.waiting == 1 and done.finished_at is None
    assert done.rows == {"inbox": 1, "quarantine": 1, "outbox": 1, "attempts": 1,
                         "messages": 0, "inbox_attempts": 1, "projections": 0}  # fmt: skip
    rows = await inbox(box)
    assert rows["evt_g0"]["payload"] is None and rows["evt_g0"]["erased_at"] is not None
    assert rows["evt_g1"]["payload"] is not None and rows["evt_g1"]["erased_at"] is None
    assert rows["evt_k0"]["payload"] is not None and rows["evt_k0"]["erased_at"] is None
    texts = await box.store.fetch_all(
        "SELECT (SELECT string_agg(coalesce(error, ''), ' ') FROM relaybox_inbox_attempts)"
        " || (SELECT string_agg(coalesce(payload, ''), ' ') FROM relaybox_outbox)"
        " || (SELECT string_agg(coalesce(response, ''), ' ') FROM relaybox_outbox_attempts)"
        " AS t"
        if box.store.backend == "postgres"
        else "SELECT (SELECT group_concat(coalesce(error, ''), ' ') FROM relaybox_inbox_attempts)"
        " || (SELECT group_concat(coalesce(payload, ''), ' ') FROM relaybox_outbox)"
        " || (SELECT group_concat(coalesce(response, ''), ' ') FROM relaybox_outbox_attempts)"
        " AS t"
    )
    text = str(texts[0]["t"])
    assert ALICE_EMAIL not in text and BOB_EMAIL in text
    [entry] = await box.store.fetch_all("SELECT payload, erased_at FROM relaybox_quarantine")
    assert entry["payload"] is None and entry["erased_at"] is not None
    # Keys stay: a resend of the erased event is still a duplicate.
    assert (await kit.deliver(kit.signed("stripe", payload=gone))).outcome == "duplicate"

    # The waiting event, once handled (it fails once, then succeeds and adds its mail),
    # is emptied by the erasure's next run, with what its handler added.
    assert await kit.run_worker() == 1
    kit.advance(3600)
    assert await kit.drain_worker() == 1
    await kit.drain_dispatcher()
    [again] = await resume_waiting(box)
    assert again.id == done.id and again.finished_at is not None and again.waiting == 0
    assert again.rows["inbox"] == 2 and again.rows["outbox"] == 2
    assert (await inbox(box))["evt_g1"]["payload"] is None
    assert await _files_hold_after_vacuum(box, ALICE_EMAIL.encode()) == []
    assert await _files_hold(box, BOB_EMAIL.encode())


# -- the admin API, the command line, the facade ------------------------------------------

TOKEN = "test-admin-token-0123456789"


async def test_admin_api_answers_202_and_erases_off_the_request(
    database_url: str, clock: Any
) -> None:
    import httpx
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from relaybox.admin import build_admin

    box = Relaybox(settings=Settings(database_url=database_url, admin_token=TOKEN), clock=clock)
    kit = configure(box)
    for i in range(5):
        await kit.send("stripe", payload=invoice(f"evt_a{i}", ALICE, ALICE_EMAIL))
    await kit.run_worker()
    app = Starlette(routes=[Mount("/admin", app=build_admin(box))])
    headers = {"authorization": f"Bearer {TOKEN}"}
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://admin.test", headers=headers
        ) as client:
            url = "/admin/api/v1/erasures"
            for bad in (
                {"reason": "r"},
                {"subject": ALICE, "tenant": "t", "reason": "r"},
                {"subject": ALICE},
                {"subject": "", "reason": "r"},
                {"subject": "x" * 2000, "reason": "r"},
                {"subject": "a\u0000", "reason": "r"},
                {"subject": ALICE, "reason": "r", "extra": 1},
            ):
                answer = await client.post(url, json=bad)
                assert answer.status_code == 400, (bad, answer.text)
            assert (await client.get(f"{url}/999")).status_code == 404
            answer = await client.post(
                url, json={"subject": ALICE, "reason": "ticket 42", "actor": "dpo"}
            )
            assert answer.status_code == 202, answer.text
            record = answer.json()
            assert record["actor"] == "dpo" and record["scope"] == "subject"
            assert record["subject_digest"] == subject_digest(ALICE).hex()
            assert ALICE not in answer.text
            for _ in range(200):
                record = (await client.get(f"{url}/{record['id']}")).json()
                if record["status"] == "finished":
                    break
                await asyncio.sleep(0.02)
            assert record["status"] == "finished" and record["rows"]["inbox"] == 5
            listed = (await client.get(url)).json()["items"]
            assert [r["id"] for r in listed] == [record["id"]]
            [event] = (await client.get("/admin/api/v1/inbox?limit=1")).json()["items"]
            detail = (await client.get(f"/admin/api/v1/inbox/{event['id']}")).json()
            assert detail["payload"] is None and detail["erased_at"] is not None
            replay = await client.post(
                f"/admin/api/v1/inbox/{event['id']}/replay", json={"reason": "again"}
            )
            assert replay.status_code == 409 and "erased" in replay.json()["message"]
            await client.post("/admin/login", data={"token": TOKEN, "next": "/admin/"})
            page = await client.get(f"/admin/inbox/{event['id']}")
            assert page.status_code == 200 and "data-erased" in page.text
            assert ALICE_EMAIL not in page.text
            message = (await client.get("/admin/messages")).status_code
            assert message in (200, 404)  # no outbound configured: never a 500
    finally:
        await box.close()


async def test_cli_erase_and_erasures(database_url: str, clock: Any) -> None:
    from tests.integration.test_ops_cli import cli_runner

    box = Relaybox(settings=Settings(database_url=database_url), clock=clock)
    kit = configure(box)
    await kit.send("stripe", payload=invoice("evt_a0", ALICE, ALICE_EMAIL))
    await kit.run_worker()
    await kit.send("stripe", payload=invoice("evt_a1", ALICE, ALICE_EMAIL))  # pending
    await box.close()
    for cli in cli_runner():
        await cli("erase", "--database-url", database_url, "--reason", "r", code=2)
        out = await cli(
            "erase", "--subject", ALICE, "--reason", "ticket 7", "--actor", "dpo",
            "--database-url", database_url, "--json",
        )  # fmt: skip
        done = json.loads(out.stdout)
        assert done["status"] == "waiting" and done["waiting"] == 1
        assert done["rows"]["inbox"] == 1
        human = await cli("erase", "--subject", ALICE, "--reason", "again",
                          "--database-url", database_url)  # fmt: skip
        assert "1 row(s) still pending" in human.stdout
        shown = await cli("erasures", str(done["id"]), "--database-url", database_url, "--json")
        assert json.loads(shown.stdout)["actor"] == "dpo"
        listed = await cli("erasures", "--database-url", database_url, "--json")
        assert len(json.loads(listed.stdout)["items"]) == 1  # resumed, not recorded twice
        await cli("erasures", "99", "--database-url", database_url, code=1)
        shown = await cli("inbox", "show", "1", "--database-url", database_url)
        assert "erased" in shown.stdout and ALICE_EMAIL not in shown.stdout


async def test_facade_and_sync_publish(box: Relaybox) -> None:
    local(box)
    async with HttpReceiver(Reply(200)) as receiver:
        await endpoint(box, receiver.url, tenant="t1")
        with box.store.sync.transaction() as conn:
            message = box.publish_sync(conn, "invoice.paid", {"e": ALICE_EMAIL}, tenant="t1",
                                       subject=ALICE)  # fmt: skip
        while await dispatch_once(box):
            pass
    done = await box.erase(subject=ALICE, actor="dpo", reason="ticket 9")
    assert done.rows["messages"] == 1 and done.rows["outbox"] == 1 and done.finished_at
    [row] = await box.store.fetch_all("SELECT body FROM relaybox_messages")
    assert json.loads(row["body"]) is None and message.id


# -- the sending side: an event type's subject path, the tenant API's subject ------------


async def _indexed(box: Relaybox, subject: str) -> set[str]:
    """The message ids indexed under ``subject``."""
    digest = subject_digest(subject)
    rows = await box.store.fetch_all(
        "SELECT digest, ref FROM relaybox_subjects WHERE kind = 'message'"
    )
    return {r["ref"] for r in rows if bytes(r["digest"]) == digest}


async def test_an_event_types_subject_path_indexes_each_publish(box: Relaybox) -> None:
    """``define_event_type(..., subject="data.customer.id")``: a publish of the type is
    indexed under the value there without passing ``subject=`` (the synchronous
    publish too); an explicit ``subject=`` wins; a message without a value there is
    not indexed; a value no erasure could name is refused in the producer's
    transaction; a bad path is refused when the type is defined."""
    from relaybox.outbound import InvalidMessage, define_event_type, list_event_types

    local(box)
    defined = await box.define_event_type(
        "customer.updated", description="a customer changed", subject="data.customer.id"
    )
    assert defined.subject == "data.customer.id"
    assert "subject" not in defined.to_json()  # tenants do not read the operator's path
    [listed] = await list_event_types(box)
    assert listed.subject == "data.customer.id"

    def data(customer: Any, email: str) -> dict[str, Any]:
        return {"customer": {"id": customer, "email": email}}

    by_path = await publish_one(box, "customer.updated", data(ALICE, ALICE_EMAIL))
    explicit = await publish_one(box, "customer.updated", data(ALICE, ALICE_EMAIL), subject=BOB)
    numeric = await publish_one(box, "customer.updated", data(42, "n@example.com"))
    without = await publish_one(box, "customer.updated", {"customer": {}})
    other_type = await publish_one(box, "invoice.paid", data(ALICE, ALICE_EMAIL))
    with box.store.sync.transaction() as conn:
        synced = box.publish_sync(conn, "customer.updated", data(ALICE, ALICE_EMAIL), tenant="t1")
    assert await _indexed(box, ALICE) == {by_path.id, synced.id}
    assert await _indexed(box, BOB) == {explicit.id}
    assert await _indexed(box, "42") == {numeric.id}
    indexed = await box.store.fetch_all("SELECT ref FROM relaybox_subjects")
    assert sorted(r["ref"] for r in indexed) == sorted(
        [by_path.id, synced.id, explicit.id, numeric.id]
    )  # neither the message without a value nor the type without a path
    assert without.id and other_type.id

    # A value no erasure could name: refused, nothing published.
    for value in ("x" * 1025, "nul\x00"):
        with pytest.raises(InvalidMessage) as refused:
            await publish_one(box, "customer.updated", data(value, ALICE_EMAIL))
        assert refused.value.code == "subject"
    count = len(await box.store.fetch_all("SELECT id FROM relaybox_messages"))
    assert count == 6

    done = await erase(box, subject=ALICE, actor="dpo")
    assert done.rows["messages"] == 2 and done.finished_at is not None
    bodies = {
        r["id"]: r["body"]
        for r in await box.store.fetch_all("SELECT id, body FROM relaybox_messages")
    }
    assert json.loads(bodies[by_path.id]) is None and json.loads(bodies[synced.id]) is None
    assert ALICE_EMAIL in bodies[explicit.id]  # indexed under Bob, as its caller said
    assert ALICE_EMAIL in bodies[other_type.id]  # a type without a path: not indexed

    # Bad paths, refused when the type is defined (and nothing changed).
    for bad in ("", "data..id", ".data", "header:x-customer", "a." * 8 + "b", "d" * 201,
                "data.\x00"):  # fmt: skip
        with pytest.raises(InvalidMessage) as refused:
            await define_event_type(box, "customer.updated", subject=bad)
        assert refused.value.code == "subject_path", bad
    [listed] = [t for t in await list_event_types(box) if t.name == "customer.updated"]
    assert listed.subject == "data.customer.id"
    # Defined again without a path: publishes are no longer indexed by it.
    await define_event_type(box, "customer.updated")
    plain = await publish_one(box, "customer.updated", data(ALICE, ALICE_EMAIL))
    assert plain.id not in await _indexed(box, ALICE)


async def test_tenant_api_publish_takes_a_subject(box: Relaybox) -> None:
    """``POST /api/v1/messages`` with ``subject``: indexed as ``publish(subject=)``
    is; a subject out of bounds is a 422 and publishes nothing; the event type's path
    applies to a body without one."""
    import httpx

    from relaybox.outbound import create_api_key

    local(box)
    await box.define_event_type("customer.updated", subject="data.customer.id")
    _, key = await create_api_key(box, "t1")
    transport = httpx.ASGITransport(app=box.asgi(roles=("api",)))
    async with httpx.AsyncClient(
        transport=transport, base_url="http://api.test/api/v1",
        headers={"Authorization": f"Bearer {key}"},
    ) as client:  # fmt: skip
        answer = await client.post(
            "/messages",
            json={"event_type": "invoice.paid", "data": {"email": ALICE_EMAIL}, "subject": ALICE},
        )
        assert answer.status_code == 202, answer.text
        explicit = answer.json()["id"]
        answer = await client.post(
            "/messages",
            json={"event_type": "customer.updated", "data": {"customer": {"id": ALICE}}},
        )
        assert answer.status_code == 202, answer.text
        by_path = answer.json()["id"]
        for bad in ("", "x" * 1025, "nul\u0000", 42):
            answer = await client.post(
                "/messages", json={"event_type": "invoice.paid", "data": {}, "subject": bad}
            )
            assert answer.status_code == 422, (bad, answer.text)
        answer = await client.post(
            "/messages",
            json={"event_type": "customer.updated", "data": {"customer": {"id": "x" * 2000}}},
        )
        assert answer.status_code == 422 and answer.json()["error"] == "invalid_subject"
    assert await _indexed(box, ALICE) == {explicit, by_path}
    assert len(await box.store.fetch_all("SELECT id FROM relaybox_messages")) == 2
    done = await erase(box, subject=ALICE, actor="dpo")
    assert done.rows["messages"] == 2


async def test_admin_api_defines_an_event_types_subject_path(database_url: str, clock: Any) -> None:
    """``PUT /admin/api/v1/event-types/{name}`` with ``subject``: listed with it,
    publishes indexed by it; a bad path is a 422 that changes nothing."""
    import httpx
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from relaybox.admin import build_admin

    box = Relaybox(settings=Settings(database_url=database_url, admin_token=TOKEN), clock=clock)
    local(box)
    app = Starlette(routes=[Mount("/admin", app=build_admin(box))])
    headers = {"authorization": f"Bearer {TOKEN}"}
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://admin.test", headers=headers
        ) as client:
            url = "/admin/api/v1/event-types"
            answer = await client.put(
                f"{url}/customer.updated",
                json={"description": "a customer changed", "subject": "data.customer.id"},
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["subject"] == "data.customer.id"
            for bad in ("data..id", "header:x-customer", "a." * 8 + "b", "d" * 201):
                answer = await client.put(f"{url}/customer.updated", json={"subject": bad})
                assert answer.status_code == 422, (bad, answer.text)
                assert answer.json()["error"] == "invalid_subject_path"
            for bad_body in ({"subject": ""}, {"subject": "x" * 600}, {"other": 1}):
                answer = await client.put(f"{url}/customer.updated", json=bad_body)
                assert answer.status_code == 400, (bad_body, answer.text)
            answer = await client.put(f"{url}/bad name", json={})
            assert answer.status_code == 422 and answer.json()["error"] == "invalid_event_type"
            [listed] = (await client.get(url)).json()["items"]
            assert (listed["name"], listed["subject"]) == ("customer.updated", "data.customer.id")
        message = await publish_one(box, "customer.updated", {"customer": {"id": ALICE}})
        assert await _indexed(box, ALICE) == {message.id}
    finally:
        await box.close()
