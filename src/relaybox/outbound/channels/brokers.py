"""Broker destinations: outbox rows published to RabbitMQ, NATS JetStream or a Redis stream.

A broker destination is the operator's configuration, never a tenant's: it is declared
by name (``[outbound.brokers.<name>]`` in the settings, or a channel registered in code)
and the name is the channel a handler writes to::

    await ctx.outbox.add("orders", f"order:{order.id}:paid", {"order": order.id})

A tenant's endpoint may route to a destination that grants it (``broker:<name>``,
``tenants`` in the settings; checked by :mod:`relaybox.outbound.endpoints` when the
endpoint is saved and by the webhook channel at each delivery). Such a delivery
publishes the message's envelope with ``"tenant"`` added, marked with the tenant
(:data:`TENANT_HEADER`, the Redis field ``tenant``), under the delivery's key
``<message id>:<endpoint id>``: consumers deduplicate on that id. A handler's row
carries its payload alone, without a tenant mark.

Every attempt of a row carries the row's key as the message id, so a resend is
recognisably the same message:

    rabbitmq  ``message_id`` = key, persistent, published with ``mandatory`` and waited
              for the publisher confirm (a nack, or a message the broker returns
              because no queue is bound to its routing key, is a retry)
    nats      JetStream publish with ``Nats-Msg-Id`` = key, waited for the stream's ack
              (JetStream drops a resend within its duplicate window; a subject no
              stream takes is a retry)
    redis     ``XADD`` of ``{"id": key, "body": ...}`` to the stream

The body is the row's payload as compact JSON. Each channel keeps one long-lived
connection, made on first use and again after any other failure than a refusal. A
connection error, a timeout or a refused publish is a ``retry`` (like a 5xx), recorded
with what the broker said (``no queue is bound to routing key 'x' on the default
exchange: …``); only a confirm counts as sent. A publish whose confirm never
came is exactly the uncertain outcome the ``uncertain`` policy covers (default
``resend``, under the same id). The client libraries are optional extras
(``relaybox[rabbitmq]``, ``relaybox[nats]``, ``relaybox[redis]``), imported only when a
channel of that kind is made.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import importlib
import json
from types import ModuleType
from typing import Any, Unpack

from relaybox.config.outbound import BrokerSettings
from relaybox.errors import ConfigurationError
from relaybox.outbound.channels.base import Channel, ChannelPolicy, Result
from relaybox.store.outbox_rows import Delivery

__all__ = [
    "BrokerChannel",
    "NatsChannel",
    "RabbitMQChannel",
    "RedisStreamChannel",
    "broker_channel",
]

MESSAGE_ID_HEADER = "Nats-Msg-Id"
TENANT_HEADER = "Relaybox-Tenant"
"""The tenant of an endpoint's delivery (AMQP and NATS header; Redis field ``tenant``).
A handler's row carries none: a message without it is the operator's own."""


def _require(module: str, extra: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigurationError(
            f"the {extra} broker channel needs {module!r}: pip install 'relaybox[{extra}]'"
        ) from exc


def encode(payload: Any) -> bytes:
    """The message body: the outbox payload as compact JSON."""
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


class BrokerChannel(Channel):
    """One long-lived connection to one broker; subclasses connect and publish."""

    max_in_flight = 16
    bounded = True  # deliver() times connect + publish itself
    extra = ""

    def __init__(
        self,
        *,
        url: str,
        connect_timeout: float = 5.0,
        publish_timeout: float = 10.0,
        **policy: Unpack[ChannelPolicy],
    ) -> None:
        super().__init__(**policy)
        if connect_timeout <= 0 or publish_timeout <= 0:
            raise ValueError("broker timeouts are seconds > 0")
        self._url = url
        self.connect_timeout = connect_timeout
        self.publish_timeout = publish_timeout
        self._conn: Any = None
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:  # the URL may carry a password
        return f"{type(self).__name__}(name={self.name!r})"

    async def deliver(self, delivery: Delivery) -> Result:
        try:
            body = encode(delivery.payload)
        except (TypeError, ValueError) as exc:
            return Result("failed", error=f"cannot encode the payload: {exc}")
        timeout = min(self.publish_timeout, delivery.deadline)
        # An endpoint's delivery (a tenant's message) is marked with its tenant.
        tenant = delivery.tenant if delivery.endpoint is not None else None
        conn = None
        try:
            async with asyncio.timeout(timeout):
                conn = await self._connection()
                await self._publish(conn, delivery.key, body, tenant)
        except TimeoutError:
            await self._drop(conn)
            return Result(
                "retry", error=f"{self.extra}: no confirm within {timeout:g} s", timed_out=True
            )
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # the dispatcher is stopping
            # A client library cancels its pending publishes when the connection drops.
            await self._drop(conn)
            return Result("retry", error=f"{self.extra}: the connection closed mid-publish")
        except Exception as exc:
            refusal = self._refusal(exc)
            if refusal is not None:  # the broker answered: the connection is sound
                return Result("retry", error=f"{self.extra}: {refusal[:400]}")
            await self._drop(conn)
            return Result("retry", error=f"{self.extra}: {type(exc).__name__}: {str(exc)[:300]}")
        return Result("sent")

    def _refusal(self, exc: Exception) -> str | None:
        """What the broker refused, when ``exc`` is its answer to this one publish (a
        message no queue or stream takes, a nack, a command error): the attempt is a
        retry and the connection, which the broker still serves, is kept, so the
        other publishes in flight on it go on. ``None``: any other failure, after
        which the connection is dropped."""
        return None

    async def _connection(self) -> Any:
        async with self._lock:
            if self._conn is None or not self._usable(self._conn):
                old, self._conn = self._conn, None
                if old is not None:
                    await self._close_quietly(old)
                async with asyncio.timeout(self.connect_timeout):
                    self._conn = await self._connect()
            return self._conn

    async def _drop(self, conn: Any) -> None:
        """Forget ``conn`` after a failure so the next attempt connects again (a
        connection another attempt already replaced is left alone)."""
        if conn is None or conn is not self._conn:
            return
        self._conn = None
        await self._close_quietly(conn)

    async def _close_quietly(self, conn: Any) -> None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.connect_timeout):
                await self._disconnect(conn)

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._close_quietly(conn)

    @abc.abstractmethod
    async def _connect(self) -> Any: ...

    @abc.abstractmethod
    def _usable(self, conn: Any) -> bool: ...

    @abc.abstractmethod
    async def _publish(self, conn: Any, key: str, body: bytes, tenant: str | None) -> None:
        """Publish ``body`` under the id ``key``; ``tenant``, when set, goes with it as
        :data:`TENANT_HEADER` (or the Redis field ``tenant``)."""

    @abc.abstractmethod
    async def _disconnect(self, conn: Any) -> None: ...


class RabbitMQChannel(BrokerChannel):
    """AMQP 0-9-1 through aio-pika: persistent messages, publisher confirms,
    ``mandatory`` (a message no queue takes is refused, not dropped). ``exchange`` ""
    is the default exchange, where ``routing_key`` names the queue."""

    kind = extra = "rabbitmq"

    def __init__(self, *, url: str, routing_key: str, exchange: str = "", **kw: Any) -> None:
        self._pika = _require("aio_pika", "rabbitmq")
        super().__init__(url=url, **kw)
        self.exchange, self.routing_key = exchange, routing_key

    async def _connect(self) -> Any:
        conn = await self._pika.connect(self._url, timeout=self.connect_timeout)
        try:
            # on_return_raises: a message the broker returns (basic.return: mandatory and
            # no queue bound) fails its publish. Without it aio-pika resolves the
            # publish with the returned message, and the broker's ack that follows a
            # return would count a message nobody received as sent.
            channel = await conn.channel(publisher_confirms=True, on_return_raises=True)
            if self.exchange:
                exchange = await channel.get_exchange(self.exchange, ensure=False)
            else:
                exchange = channel.default_exchange
        except BaseException:
            await conn.close()
            raise
        return (conn, channel, exchange)

    def _usable(self, conn: Any) -> bool:
        return not conn[0].is_closed and not conn[1].is_closed

    async def _publish(self, conn: Any, key: str, body: bytes, tenant: str | None) -> None:
        message = self._pika.Message(
            body,
            message_id=key,
            content_type="application/json",
            delivery_mode=self._pika.DeliveryMode.PERSISTENT,
            headers=None if tenant is None else {TENANT_HEADER: tenant},
        )
        confirm = await conn[2].publish(message, self.routing_key, mandatory=True)
        if getattr(confirm, "name", None) != "Basic.Ack":  # never "sent" on less than an ack
            raise self._pika.exceptions.DeliveryError(None, confirm)

    def _refusal(self, exc: Exception) -> str | None:
        errors = self._pika.exceptions
        if isinstance(exc, errors.PublishError):  # returned: basic.return
            frame = exc.message.delivery
            exchange = f"exchange {frame.exchange!r}" if frame.exchange else "the default exchange"
            return (
                f"no queue is bound to routing key {frame.routing_key!r} on {exchange}:"
                f" the broker returned the message ({frame.reply_code} {frame.reply_text})"
            )
        if isinstance(exc, errors.DeliveryError):  # basic.nack, or no ack at all
            frame = getattr(exc.frame, "name", None) or type(exc.frame).__name__
            return (
                f"the broker refused the message ({frame}; e.g. a queue at its length"
                " limit with overflow reject-publish)"
            )
        return None

    async def _disconnect(self, conn: Any) -> None:
        await conn[0].close()


class NatsChannel(BrokerChannel):
    """NATS JetStream through nats-py: a publish with ``Nats-Msg-Id`` = the row's key,
    waited for the stream's ack. ``stream``, when given, is the stream the subject
    must land in (a publish captured by another stream is refused)."""

    kind = extra = "nats"

    def __init__(self, *, url: str, subject: str, stream: str | None = None, **kw: Any) -> None:
        self._nats = _require("nats", "nats")
        super().__init__(url=url, **kw)
        self.subject, self.stream = subject, stream

    async def _connect(self) -> Any:
        async def quiet(*_: Any) -> None:  # failures surface as the publish's error
            return None

        nc = self._nats.NATS()
        try:
            await nc.connect(
                servers=[self._url],
                connect_timeout=self.connect_timeout,
                allow_reconnect=False,  # this channel reconnects on the next attempt
                error_cb=quiet,
            )
        except BaseException:
            # A failed connect leaves its socket open inside the client: close it.
            with contextlib.suppress(Exception):
                await nc.close()
            raise
        return (nc, nc.jetstream(timeout=self.publish_timeout))

    def _usable(self, conn: Any) -> bool:
        return bool(conn[0].is_connected)

    async def _publish(self, conn: Any, key: str, body: bytes, tenant: str | None) -> None:
        headers = {MESSAGE_ID_HEADER: key}
        if tenant is not None:
            headers[TENANT_HEADER] = tenant
        await conn[1].publish(
            self.subject,
            body,
            timeout=self.publish_timeout,
            stream=self.stream,
            headers=headers,
        )

    def _refusal(self, exc: Exception) -> str | None:
        errors = importlib.import_module("nats.js.errors")
        if isinstance(exc, errors.NoStreamResponseError):  # no responders on the subject
            expected = f" (expected: {self.stream!r})" if self.stream else ""
            return f"no JetStream stream takes subject {self.subject!r}{expected}"
        if isinstance(exc, errors.APIError):  # the stream answered with an error
            return f"the stream refused the message: {exc}"
        return None

    async def _disconnect(self, conn: Any) -> None:
        await conn[0].close()


class RedisStreamChannel(BrokerChannel):
    """A Redis stream through redis-py: ``XADD <stream> * id <key> body <json>``.
    ``maxlen`` trims the stream approximately to that many entries (``None``: never)."""

    kind = extra = "redis"

    def __init__(self, *, url: str, stream: str, maxlen: int | None = None, **kw: Any) -> None:
        self._redis = _require("redis.asyncio", "redis")
        super().__init__(url=url, **kw)
        self.stream, self.maxlen = stream, maxlen

    async def _connect(self) -> Any:
        retry = importlib.import_module("redis.asyncio.retry")
        backoff = importlib.import_module("redis.backoff")
        client = self._redis.Redis.from_url(
            self._url,
            socket_connect_timeout=self.connect_timeout,
            socket_timeout=self.publish_timeout,
            # The dispatcher owns retries: one command per attempt.
            retry=retry.Retry(backoff.NoBackoff(), 0),
            single_connection_client=True,
        )
        try:
            await client.ping()
        except BaseException:
            await client.aclose()
            raise
        return client

    def _usable(self, conn: Any) -> bool:
        return True  # a failed command drops the client (BrokerChannel.deliver)

    async def _publish(self, conn: Any, key: str, body: bytes, tenant: str | None) -> None:
        fields: dict[str, str | bytes] = {"id": key, "body": body}
        if tenant is not None:
            fields["tenant"] = tenant
        await conn.xadd(
            self.stream,
            fields,
            maxlen=self.maxlen,
            approximate=True,
        )

    def _refusal(self, exc: Exception) -> str | None:
        errors = importlib.import_module("redis.exceptions")
        moved = (errors.ReadOnlyError, errors.AskError, errors.ClusterError)
        if isinstance(exc, errors.ResponseError) and not isinstance(exc, moved):
            # An error reply to XADD (WRONGTYPE, OOM, NOPERM): a replica's READONLY or
            # a cluster's redirect means the connection points at the wrong server.
            return f"XADD to {self.stream!r} refused: {exc}"
        return None

    async def _disconnect(self, conn: Any) -> None:
        await conn.aclose()


def broker_channel(settings: BrokerSettings) -> BrokerChannel:
    """The channel an ``[outbound.brokers.<name>]`` table declares."""
    common: dict[str, Any] = {
        "url": settings.url.get_secret_value(),
        "connect_timeout": settings.connect_timeout,
        "publish_timeout": settings.publish_timeout,
        "uncertain": settings.uncertain,
        "max_in_flight": settings.max_in_flight,
        "schedule": settings.schedule,
    }
    if settings.kind == "rabbitmq":
        assert settings.routing_key is not None
        return RabbitMQChannel(
            exchange=settings.exchange, routing_key=settings.routing_key, **common
        )
    if settings.kind == "nats":
        assert settings.subject is not None
        return NatsChannel(subject=settings.subject, stream=settings.stream, **common)
    assert settings.stream is not None
    return RedisStreamChannel(stream=settings.stream, maxlen=settings.maxlen, **common)
