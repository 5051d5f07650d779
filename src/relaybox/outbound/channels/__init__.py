"""Channels: the ways out of the outbox. See :mod:`relaybox.outbound.channels.base`
for the extension point."""

from relaybox.outbound.channels.base import Channel, Outcome, Result
from relaybox.outbound.channels.brokers import (
    BrokerChannel,
    NatsChannel,
    RabbitMQChannel,
    RedisStreamChannel,
)
from relaybox.outbound.channels.email import EmailChannel, render_message
from relaybox.outbound.channels.http import HttpChannel
from relaybox.outbound.channels.webhook import WebhookChannel
from relaybox.store.outbox_rows import Delivery, MessageBody, Target

__all__ = [
    "BrokerChannel",
    "Channel",
    "Delivery",
    "EmailChannel",
    "HttpChannel",
    "MessageBody",
    "NatsChannel",
    "Outcome",
    "RabbitMQChannel",
    "RedisStreamChannel",
    "Result",
    "Target",
    "WebhookChannel",
    "render_message",
]
