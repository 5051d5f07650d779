"""``box.publish_sync``: publishing from synchronous code (a sync SQLAlchemy
``Connection`` or ORM ``Session``) in the application's own transaction, on SQLite
and PostgreSQL. The message and its outbox rows exist exactly when the application's
change committed, and the dispatcher delivers them signed as Standard Webhooks."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator

import pytest
import standardwebhooks
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from relaybox import FrozenClock, Relaybox
from relaybox.errors import ConfigurationError
from relaybox.outbound import Dispatcher, InvalidMessage, define_event_type
from tests.support.outbound_app import endpoint, local, outbox_rows, publish_one
from tests.support.receivers import HttpReceiver
from tests.support.syncdb import app_engine


@pytest.fixture
async def dispatcher(box: Relaybox) -> AsyncIterator[Dispatcher]:
    local(box)
    d = box.dispatcher()
    yield d
    await d.close()


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    e = app_engine(database_url)
    with e.begin() as conn:
        conn.execute(text("CREATE TABLE pets (id TEXT PRIMARY KEY, status TEXT NOT NULL)"))
    yield e
    e.dispose()


async def messages(box: Relaybox) -> list[str]:
    return [r["id"] for r in await box.store.fetch_all("SELECT id FROM relaybox_messages")]


async def test_a_session_that_commits_publishes_and_the_dispatcher_delivers_signed(
    box: Relaybox, clock: FrozenClock, dispatcher: Dispatcher, engine: Engine
) -> None:
    clock.set(time.time())  # the receiver checks webhook-timestamp against its clock
    async with HttpReceiver() as receiver:
        _, secret = await endpoint(box, receiver.url)
        with Session(engine) as session:
            session.execute(text("INSERT INTO pets VALUES ('p1', 'adopted')"))
            message = box.publish_sync(session, "pet.adopted", {"petId": "p1"}, tenant="t1")
            session.commit()
        assert await messages(box) == [message.id]
        [row] = await outbox_rows(box)
        assert (row["status"], row["message_id"]) == ("pending", message.id)
        assert await dispatcher.run_once() == 1
        [seen] = receiver.requests
    payload = standardwebhooks.Webhook(secret).verify(seen.body, seen.headers)
    assert payload == {
        "id": message.id,
        "type": "pet.adopted",
        "timestamp": payload["timestamp"],
        "data": {"petId": "p1"},
        "apiVersion": "v1",
    }
    assert message.endpoints == (row["endpoint_id"],)
    [sent] = await outbox_rows(box)
    assert sent["status"] == "sent"


async def test_a_session_that_rolls_back_leaves_no_message_and_no_outbox_row(
    box: Relaybox, dispatcher: Dispatcher, engine: Engine
) -> None:
    await endpoint(box, "http://127.0.0.1:9/hook")
    with Session(engine) as session:
        session.execute(text("INSERT INTO pets VALUES ('p1', 'adopted')"))
        box.publish_sync(session, "pet.adopted", {"petId": "p1"}, tenant="t1")
        session.rollback()
    with pytest.raises(RuntimeError), engine.begin() as conn:
        conn.execute(text("INSERT INTO pets VALUES ('p2', 'adopted')"))
        box.publish_sync(conn, "pet.adopted", {"petId": "p2"}, tenant="t1")
        raise RuntimeError("the adoption failed after publishing")
    with pytest.raises(RuntimeError), box.sync_transaction() as conn:
        box.publish_sync(conn, "pet.adopted", {"petId": "p3"}, tenant="t1")
        raise RuntimeError("and on relaybox's own sync engine")
    assert await messages(box) == []
    assert await outbox_rows(box) == []
    assert await dispatcher.run_once() == 0
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM pets")).scalar_one() == 0


async def test_an_idempotency_key_returns_the_existing_message(
    box: Relaybox, engine: Engine
) -> None:
    local(box)
    await endpoint(box, "http://127.0.0.1:9/hook")
    with engine.begin() as conn:
        first = box.publish_sync(
            conn, "pet.adopted", {"petId": "p1"}, tenant="t1", idempotency_key="adopt-p1"
        )
    with Session(engine) as session, session.begin():
        again = box.publish_sync(
            session, "pet.adopted", {"other": 1}, tenant="t1", idempotency_key="adopt-p1"
        )
    with box.sync_transaction() as conn:
        elsewhere = box.publish_sync(
            conn, "pet.adopted", {"petId": "p1"}, tenant="t2", idempotency_key="adopt-p1"
        )
    assert again.id == first.id and again.body == first.body
    assert elsewhere.id != first.id  # keys are per tenant
    # The async publish and the sync one share the key.
    from_async = await publish_one(box, idempotency_key="adopt-p1")
    assert from_async.id == first.id
    assert len(await outbox_rows(box)) == 1  # t2 has no endpoint


async def test_an_ordering_key_numbers_the_keys_messages_with_the_async_publish(
    box: Relaybox, clock: FrozenClock, dispatcher: Dispatcher, engine: Engine
) -> None:
    """``ordering_key``: the key's next number in the caller's transaction (one counter
    with ``publish``; a rolled-back publish's number is taken again), the rows of an
    ordered endpoint carry key and sequence, and the receiver gets ``webhook-sequence``."""
    clock.set(time.time())
    async with HttpReceiver() as receiver:
        await endpoint(box, receiver.url, ordered=True)
        with engine.begin() as conn:
            a1 = box.publish_sync(conn, "pet.adopted", {"n": 1}, tenant="t1", ordering_key="a")
            b1 = box.publish_sync(conn, "pet.adopted", {"n": 2}, tenant="t1", ordering_key="b")
        a2 = await publish_one(box, ordering_key="a")
        with pytest.raises(RuntimeError), engine.begin() as conn:
            box.publish_sync(conn, "pet.adopted", {"n": 3}, tenant="t1", ordering_key="a")
            raise RuntimeError("the application's change failed")
        with Session(engine) as session, session.begin():
            a3 = box.publish_sync(session, "pet.adopted", {"n": 4}, tenant="t1", ordering_key="a")
        published = [a1, b1, a2, a3]
        assert [(m.ordering_key, m.sequence) for m in published] == [
            ("a", 1),
            ("b", 1),
            ("a", 2),
            ("a", 3),
        ]
        assert a3.envelope["orderingKey"] == "a" and a3.envelope["sequence"] == 3
        rows = await box.store.fetch_all(
            "SELECT message_id, ordering_key, sequence FROM relaybox_outbox ORDER BY id"
        )
        assert [(r["message_id"], r["ordering_key"], r["sequence"]) for r in rows] == [
            (m.id, m.ordering_key, m.sequence) for m in published
        ]
        assert await dispatcher.run_once() == 2  # the head of each key
        assert await dispatcher.run_once() == 1 and await dispatcher.run_once() == 1
        by_id = {s.headers["webhook-id"]: s for s in receiver.requests}
    assert {m.id: by_id[m.id].headers["webhook-sequence"] for m in published} == {
        m.id: str(m.sequence) for m in published
    }
    with engine.begin() as conn:
        kept = box.publish_sync(conn, "pet.adopted", {}, tenant="t1", idempotency_key="k1")
    with engine.begin() as conn:
        again = box.publish_sync(conn, "pet.adopted", {}, tenant="t1", idempotency_key="k1")
        assert (again.id, again.created) == (kept.id, False)
        for bad in ["", "x" * 257, "a\x00b"]:
            with pytest.raises(InvalidMessage) as refused:
                box.publish_sync(conn, "pet.adopted", {}, tenant="t1", ordering_key=bad)
            assert refused.value.code == "ordering_key"
            # Refused before the key's stored message is looked up, not answered with it.
            with pytest.raises(InvalidMessage) as refused:
                box.publish_sync(
                    conn, "pet.adopted", {}, tenant="t1", ordering_key=bad, idempotency_key="k1"
                )
            assert refused.value.code == "ordering_key"


async def test_the_checks_are_those_of_publish(box: Relaybox, engine: Engine) -> None:
    local(box, max_payload=2048)
    schema = {"type": "object", "required": ["petId"], "properties": {"petId": {"type": "string"}}}
    await define_event_type(box, "pet.adopted", schema=schema)
    with engine.begin() as conn:
        with pytest.raises(InvalidMessage, match="petId"):
            box.publish_sync(conn, "pet.adopted", {"petId": 7}, tenant="t1")
        with pytest.raises(InvalidMessage) as too_large:
            box.publish_sync(conn, "x.y", {"blob": "x" * 4096}, tenant="t1")
        assert too_large.value.code == "too_large"
        with pytest.raises(InvalidMessage):
            box.publish_sync(conn, "bad type with spaces", {}, tenant="t1")
        with pytest.raises(InvalidMessage) as no_tenant:
            box.publish_sync(conn, "x.y", {}, tenant="")
        assert no_tenant.value.code == "tenant"
        with pytest.raises(InvalidMessage) as surrogate:
            box.publish_sync(conn, "x.y", {"s": "\ud800"}, tenant="t1")
        assert surrogate.value.code == "data"
    with pytest.raises(ConfigurationError, match="publish_sync takes"):
        box.publish_sync(engine, "x.y", {}, tenant="t1")
    assert await messages(box) == []
