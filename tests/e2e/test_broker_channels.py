"""Broker destinations against this machine's real RabbitMQ, NATS JetStream and Redis.

Each test publishes outbox rows through the real dispatcher to a broker reached through
a TCP proxy that cuts every connection mid-run, and a consumer of that broker's own
client library then checks that every row arrived, that any duplicate carries the same
id (a resend after a lost confirm), and for JetStream that dedup left exactly one
message per id. Queue, stream and subject names are unique per test and deleted after.
"""

from __future__ import annotations

import contextlib
import json
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aio_pika
import nats
import pytest
import redis.asyncio as aredis

from relaybox import Relaybox
from relaybox.clock import FrozenClock
from relaybox.config import load_settings
from relaybox.errors import ConfigurationError
from relaybox.outbound import (
    BrokerSettings,
    NatsChannel,
    OutboundSettings,
    RabbitMQChannel,
    RedisStreamChannel,
    configure,
    outbound,
)
from relaybox.outbound.channels.base import Delivery
from tests.support.cutproxy import CutProxy
from tests.support.outbound_app import dispatch_once, endpoint, outbox_rows, publish_one

N = 200
RABBIT = ("127.0.0.1", 5672)
NATS = ("127.0.0.1", 4222)
REDIS = ("127.0.0.1", 6379)
IMMEDIATE = [0.0] * 30  # retries due at once under the frozen clock


async def _outbox(box: Relaybox, channel: str, n: int = N) -> list[str]:
    keys = [f"order-{i:04d}" for i in range(n)]
    async with box.store.transaction() as conn:
        for i, key in enumerate(keys):
            await box.store.inbox.outbox_insert(
                conn,
                channel=channel,
                key=key,
                payload=json.dumps({"n": i, "key": key}),
                tenant=None,
                inbox_id=None,
                now=box.clock.now(),
            )
    return keys


async def _dispatch_with_cut(box: Relaybox, proxy: CutProxy, cut_after: int) -> None:
    """One clean batch, then a batch during which the proxy cuts every connection, then
    batches (the proxy restored) until no row is left to send."""
    dispatcher = box.dispatcher()
    try:
        assert await dispatcher.run_once() > 0
        proxy.cut_after(cut_after)
        await dispatcher.run_once()
        assert proxy.cuts == 1, "the proxy never cut: the batch sent too little"
        await dispatcher.run_once()  # the broker is unreachable now: every attempt fails
        proxy.restore()
        for _ in range(50):
            if not await dispatcher.run_once():
                break
        else:
            raise AssertionError("the outbox never drained")
    finally:
        await dispatcher.close()


async def _check_rows(box: Relaybox, keys: list[str]) -> dict[str, int]:
    """Every row sent; returns each key's attempts (an attempt that failed after its
    publish left may have reached the broker: the next one resends under the same id)."""
    rows = await outbox_rows(box)
    assert sorted(r["key"] for r in rows) == keys
    assert {r["status"] for r in rows} == {"sent"}, [r["last_error"] for r in rows][:5]
    assert any(r["attempts"] > 1 for r in rows), "the cut cost no attempt: not mid-run"
    return {r["key"]: r["attempts"] for r in rows}


def _check_delivered(
    received: list[tuple[str, bytes]], keys: list[str], attempts: dict[str, int] | None
) -> None:
    """Every key arrived; a key arrived at most once per attempt of its row (a copy
    only where an attempt failed: a resend under the same id), or exactly once
    (``attempts`` None: the broker drops those copies itself)."""
    ids = Counter(key for key, _ in received)
    assert set(ids) == set(keys), f"missing: {sorted(set(keys) - set(ids))[:5]}"
    over = {
        k: (n, 1 if attempts is None else attempts[k])
        for k, n in ids.items()
        if n > (1 if attempts is None else attempts[k])
    }
    assert not over, f"copies beyond the row's attempts (received, attempts): {over}"
    for key, body in received:  # a duplicate is the same message under the same id
        assert json.loads(body)["key"] == key


@pytest.fixture
def name() -> str:
    return f"relaybox-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def rabbit_queue(name: str) -> AsyncIterator[tuple[str, aio_pika.abc.AbstractChannel]]:
    conn = await aio_pika.connect(f"amqp://guest:guest@{RABBIT[0]}:{RABBIT[1]}/", timeout=5)
    try:
        channel = await conn.channel()
        queue = await channel.declare_queue(name, durable=True)
        try:
            yield name, channel
        finally:
            await queue.delete(if_unused=False, if_empty=False)
    finally:
        await conn.close()


async def test_rabbitmq_gets_every_row_across_a_connection_cut(
    box: Relaybox, rabbit_queue: tuple[str, aio_pika.abc.AbstractChannel]
) -> None:
    queue_name, consumer = rabbit_queue
    async with CutProxy(*RABBIT) as proxy:
        configure(
            box,
            brokers={
                "orders": {
                    "kind": "rabbitmq",
                    "url": f"amqp://guest:guest@127.0.0.1:{proxy.port}/",
                    "routing_key": queue_name,
                    "publish_timeout": 3,
                    "schedule": IMMEDIATE,
                }
            },
        )
        keys = await _outbox(box, "orders")
        await _dispatch_with_cut(box, proxy, cut_after=800)
    attempts = await _check_rows(box, keys)

    queue = await consumer.get_queue(queue_name)
    received: list[tuple[str, bytes]] = []
    for _ in range(N * 2 + 1):
        message = await queue.get(no_ack=True, fail=False, timeout=5)
        if message is None:
            break
        assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        assert message.message_id is not None
        received.append((message.message_id, message.body))
    _check_delivered(received, keys, attempts)


@pytest.fixture
async def jetstream(name: str) -> AsyncIterator[tuple[str, Any]]:
    nc = await nats.connect(f"nats://{NATS[0]}:{NATS[1]}", connect_timeout=5)
    js = nc.jetstream(timeout=5)
    try:
        await js.add_stream(name=name, subjects=[f"{name}.>"], duplicate_window=300)
        try:
            yield name, js
        finally:
            await js.delete_stream(name)
    finally:
        await nc.close()


async def test_nats_jetstream_keeps_each_row_exactly_once_across_a_connection_cut(
    box: Relaybox, jetstream: tuple[str, Any]
) -> None:
    stream, js = jetstream
    async with CutProxy(*NATS) as proxy:
        configure(
            box,
            brokers={
                "orders": {
                    "kind": "nats",
                    "url": f"nats://127.0.0.1:{proxy.port}",
                    "subject": f"{stream}.orders",
                    "stream": stream,
                    "publish_timeout": 3,
                    "schedule": IMMEDIATE,
                }
            },
        )
        keys = await _outbox(box, "orders")
        await _dispatch_with_cut(box, proxy, cut_after=800)
    await _check_rows(box, keys)

    info = await js.stream_info(stream)
    assert info.state.messages == N  # JetStream dropped every resend by its Nats-Msg-Id
    received: list[tuple[str, bytes]] = []
    for seq in range(1, info.state.last_seq + 1):
        msg = await js.get_msg(stream, seq)
        assert msg.headers is not None
        received.append((msg.headers["Nats-Msg-Id"], msg.data))
    _check_delivered(received, keys, None)


@pytest.fixture
async def redis_stream(name: str) -> AsyncIterator[tuple[str, aredis.Redis]]:
    client = aredis.Redis(host=REDIS[0], port=REDIS[1], socket_timeout=5)
    try:
        yield name, client
    finally:
        await client.delete(name)
        await client.aclose()


async def test_redis_stream_gets_every_row_across_a_connection_cut(
    box: Relaybox, redis_stream: tuple[str, aredis.Redis]
) -> None:
    stream, client = redis_stream
    async with CutProxy(*REDIS) as proxy:
        configure(
            box,
            brokers={
                "orders": {
                    "kind": "redis",
                    "url": f"redis://127.0.0.1:{proxy.port}/0",
                    "stream": stream,
                    "publish_timeout": 3,
                    "schedule": IMMEDIATE,
                }
            },
        )
        keys = await _outbox(box, "orders")
        await _dispatch_with_cut(box, proxy, cut_after=800)
    attempts = await _check_rows(box, keys)

    entries = await client.xrange(stream)
    received = [(fields[b"id"].decode(), fields[b"body"]) for _, fields in entries]
    _check_delivered(received, keys, attempts)


# -- a destination that takes nothing ------------------------------------------------
#
# A row and an endpoint's delivery to a destination nothing takes (no queue bound to the
# routing key, no stream on the subject, a key of another type) are failed attempts,
# retried on the schedule, never counted as sent; once the destination takes them
# they arrive, each once under its id.

LATER = [30.0] * 5


async def _two_rows(box: Relaybox, channel: str) -> tuple[str, str]:
    """A handler's row and a tenant's message to an endpoint ``broker:<channel>`` (on
    the endpoint's schedule, here the channel's): their ids on the broker (the row's
    key; ``<message id>:<endpoint id>``)."""
    [key] = await _outbox(box, channel, 1)
    endpoint_id, _ = await endpoint(box, f"broker:{channel}", schedule=LATER)
    message = await publish_one(box, "order.paid", {"orderId": "o-1"})
    return key, f"{message.id}:{endpoint_id}"


async def _refused_then_sent(
    box: Relaybox, clock: FrozenClock, problem: str, fix: Any
) -> list[dict[str, Any]]:
    """Both rows fail their first attempt with ``problem`` in the error and wait for
    the schedule; after ``fix()`` and the delay both are sent on the second attempt."""
    assert await dispatch_once(box) == 2
    rows = await outbox_rows(box)
    for row in rows:
        assert (row["status"], row["attempts"]) == ("pending", 1), row
        assert problem in (row["last_error"] or ""), row
        assert row["next_attempt_at"] == clock.now() + LATER[0], row
    assert await dispatch_once(box) == 0  # nothing before the schedule says
    await fix()
    clock.advance(LATER[0])
    assert await dispatch_once(box) == 2
    rows = await outbox_rows(box)
    assert [(r["status"], r["attempts"]) for r in rows] == [("sent", 2)] * 2, rows
    return rows


def _check_marked(received: list[tuple[str, str | None, bytes]], ids: tuple[str, str]) -> None:
    """Each of the two arrived once under its id; the endpoint's delivery carries its
    tenant in the envelope and as the header or field, the handler's row neither."""
    row, delivery = ids
    assert sorted(i for i, _, _ in received) == sorted(ids)  # each once, under its id
    found = {i: (tenant, json.loads(body)) for i, tenant, body in received}
    assert found[row] == (None, {"n": 0, "key": row})  # the handler's payload, as today
    tenant, envelope = found[delivery]
    assert tenant == "t1" and envelope["tenant"] == "t1", found[delivery]
    assert envelope["type"] == "order.paid" and envelope["data"] == {"orderId": "o-1"}


@pytest.fixture
async def rabbit(name: str) -> AsyncIterator[aio_pika.abc.AbstractChannel]:
    """A channel of this machine's RabbitMQ; the queue ``name`` is deleted after."""
    conn = await aio_pika.connect(f"amqp://guest:guest@{RABBIT[0]}:{RABBIT[1]}/", timeout=5)
    try:
        channel = await conn.channel()
        try:
            yield channel
        finally:
            await channel.queue_delete(name)
    finally:
        await conn.close()


async def test_rabbitmq_a_message_no_queue_takes_is_retried_until_a_queue_is_bound(
    box: Relaybox, clock: FrozenClock, name: str, rabbit: aio_pika.abc.AbstractChannel
) -> None:
    configure(
        box,
        brokers={
            "rmq": {
                "kind": "rabbitmq",
                "url": f"amqp://guest:guest@{RABBIT[0]}:{RABBIT[1]}/",
                "routing_key": name,  # no queue has this name yet
                "publish_timeout": 5,
                "schedule": LATER,
                "tenants": ["t1"],
            }
        },
        jitter=0.0,
    )
    ids = await _two_rows(box, "rmq")

    async def bind() -> None:
        await rabbit.declare_queue(name, durable=True)

    await _refused_then_sent(box, clock, f"no queue is bound to routing key {name!r}", bind)
    queue = await rabbit.get_queue(name)
    received = []
    while (message := await queue.get(no_ack=True, fail=False, timeout=5)) is not None:
        assert message.message_id is not None
        tenant = message.headers.get("Relaybox-Tenant")
        assert tenant is None or isinstance(tenant, str)
        received.append((message.message_id, tenant, message.body))
    _check_marked(received, ids)


async def test_nats_a_subject_no_stream_captures_is_retried_until_a_stream_does(
    box: Relaybox, clock: FrozenClock, name: str
) -> None:
    nc = await nats.connect(f"nats://{NATS[0]}:{NATS[1]}", connect_timeout=5)
    js = nc.jetstream(timeout=5)
    try:
        configure(
            box,
            brokers={
                "events": {
                    "kind": "nats",
                    "url": f"nats://{NATS[0]}:{NATS[1]}",
                    "subject": f"{name}.orders",  # no stream captures it yet
                    "publish_timeout": 5,
                    "schedule": LATER,
                    "tenants": ["t1"],
                }
            },
            jitter=0.0,
        )
        ids = await _two_rows(box, "events")

        async def add() -> None:
            await js.add_stream(name=name, subjects=[f"{name}.>"])

        try:
            await _refused_then_sent(
                box, clock, f"no JetStream stream takes subject '{name}.orders'", add
            )
            info = await js.stream_info(name)
            assert info.state.messages == 2
            received = []
            for seq in range(1, info.state.last_seq + 1):
                msg = await js.get_msg(name, seq)
                assert msg.headers is not None
                tenant = msg.headers.get("Relaybox-Tenant")
                received.append((msg.headers["Nats-Msg-Id"], tenant, msg.data))
            _check_marked(received, ids)
        finally:
            with contextlib.suppress(Exception):
                await js.delete_stream(name)
    finally:
        await nc.close()


async def test_redis_a_key_that_is_not_a_stream_is_retried_until_it_is_free(
    box: Relaybox, clock: FrozenClock, redis_stream: tuple[str, aredis.Redis]
) -> None:
    stream, client = redis_stream
    await client.set(stream, "someone else's value")  # XADD answers WRONGTYPE
    configure(
        box,
        brokers={
            "feed": {
                "kind": "redis",
                "url": f"redis://{REDIS[0]}:{REDIS[1]}/0",
                "stream": stream,
                "publish_timeout": 5,
                "schedule": LATER,
                "tenants": ["t1"],
            }
        },
        jitter=0.0,
    )
    ids = await _two_rows(box, "feed")

    async def free() -> None:
        await client.delete(stream)

    await _refused_then_sent(box, clock, "WRONGTYPE", free)
    entries = await client.xrange(stream)
    received = [
        (f[b"id"].decode(), f[b"tenant"].decode() if b"tenant" in f else None, f[b"body"])
        for _, f in entries
    ]
    _check_marked(received, ids)


# -- configuration -------------------------------------------------------------------


def test_brokers_are_declared_in_the_environment_and_become_channels() -> None:
    settings = load_settings(
        env={
            "RELAYBOX_OUTBOUND__BROKERS__ORDERS__KIND": "nats",
            "RELAYBOX_OUTBOUND__BROKERS__ORDERS__URL": "nats://127.0.0.1:4222",
            "RELAYBOX_OUTBOUND__BROKERS__ORDERS__SUBJECT": "orders.paid",
            "RELAYBOX_OUTBOUND__BROKERS__ORDERS__SCHEDULE": "1,5",
            "RELAYBOX_OUTBOUND__BROKERS__ORDERS__TENANTS": "acme, globex",
        }
    )
    spec = settings.outbound.brokers["orders"]
    assert (spec.kind, spec.subject, spec.schedule) == ("nats", "orders.paid", [1.0, 5.0])
    assert spec.tenants == ["acme", "globex"]
    assert (spec.grants("acme"), spec.grants("initech"), spec.grants(None)) == (True, False, False)
    assert "4222" not in repr(spec)  # the URL (and any password in it) is a secret
    box = Relaybox(settings=settings)
    channel = outbound(box).channels["orders"]
    assert isinstance(channel, NatsChannel) and channel.subject == "orders.paid"
    assert tuple(channel.schedule or ()) == (1.0, 5.0)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"kind": "rabbitmq", "url": "amqp://h/"}, "needs routing_key"),
        ({"kind": "nats", "url": "nats://h"}, "needs subject"),
        ({"kind": "redis", "url": "redis://h"}, "needs stream"),
        ({"kind": "redis", "url": "http://h", "stream": "s"}, "redis://"),
        ({"kind": "kafka", "url": "kafka://h"}, "kind"),
        ({"kind": "nats", "url": "nats://h", "subject": "s", "publish_timeout": 0}, "publish"),
        ({"kind": "redis", "url": "redis://h", "stream": "s", "tenants": [""]}, "tenants"),
        ({"kind": "redis", "url": "redis://h", "stream": "s", "tenants": [" acme"]}, "tenants"),
        ({"kind": "redis", "url": "redis://h", "stream": "s", "tenants": "acme"}, "tenants"),
    ],
)
def test_a_broker_that_cannot_work_is_refused(spec: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        BrokerSettings.model_validate(spec)


@pytest.mark.parametrize("bad", ["webhook", "ep_x", "Orders", "a b", "-x"])
def test_a_broker_name_must_be_a_plain_channel_name(bad: str) -> None:
    spec = {"kind": "redis", "url": "redis://h", "stream": "s"}
    with pytest.raises(ValueError, match="broker name"):
        OutboundSettings.model_validate({"brokers": {bad: spec}})


def test_a_broker_grants_no_tenant_unless_told() -> None:
    spec = {"kind": "redis", "url": "redis://h", "stream": "s"}
    assert not BrokerSettings.model_validate(spec).grants("acme")
    every = BrokerSettings.model_validate({**spec, "tenants": ["*"]})
    assert every.grants("acme") and every.grants("*") and not every.grants(None)


def test_a_missing_client_library_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "aio_pika", None)
    with pytest.raises(ConfigurationError, match=r"relaybox\[rabbitmq\]"):
        RabbitMQChannel(url="amqp://h/", routing_key="q")


async def test_an_unreachable_broker_is_a_retry_and_the_channel_connects_again(
    name: str,
) -> None:
    async with CutProxy(*REDIS) as proxy:
        client = aredis.Redis(host=REDIS[0], port=REDIS[1], socket_timeout=5)
        channel = outbound(Relaybox()).channel(
            "orders",
            RedisStreamChannel(
                url=f"redis://127.0.0.1:{proxy.port}", stream=name, publish_timeout=2
            ),
        )

        def delivery(attempt: int) -> Delivery:
            return Delivery(
                id=1,
                channel="orders",
                key="k1",
                payload={"a": 1},
                tenant=None,
                attempt=attempt,
                lease_token=attempt,
                uncertain=False,
                deadline=5.0,
            )

        try:
            proxy.cut()
            failed = await channel.deliver(delivery(1))
            assert failed.outcome == "retry" and failed.error and "redis" in failed.error
            proxy.restore()
            assert (await channel.deliver(delivery(2))).outcome == "sent"
            [(_, fields)] = await client.xrange(name)
            assert fields == {b"id": b"k1", b"body": b'{"a":1}'}
        finally:
            await channel.close()
            await client.delete(name)
            await client.aclose()


def test_changing_the_brokers_setting_replaces_only_what_changed() -> None:
    box = Relaybox()
    spec = {"kind": "redis", "url": "redis://127.0.0.1:6379/0", "stream": "s"}
    ob = configure(box, brokers={"orders": spec, "feed": {**spec, "stream": "f"}})
    orders, feed = ob.channels["orders"], ob.channels["feed"]
    configure(box, timeout=10)  # an unrelated change keeps the connections
    assert ob.channels["orders"] is orders and ob.channels["feed"] is feed
    configure(
        box, brokers={"orders": {**spec, "tenants": ["acme"]}, "feed": {**spec, "stream": "f"}}
    )
    # a grant is read at each delivery: changing one keeps the connection
    assert ob.channels["orders"] is orders and ob.settings.brokers["orders"].tenants == ["acme"]
    configure(box, brokers={"orders": {**spec, "stream": "s2"}})
    assert isinstance(ob.channels["orders"], RedisStreamChannel)
    assert ob.channels["orders"] is not orders and ob.channels["orders"].stream == "s2"
    assert "feed" not in ob.channels
