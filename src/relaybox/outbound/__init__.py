"""Sending: publish events in your own transaction; relaybox delivers them.

    from relaybox.outbound import configure

    configure(box, timeout=5)                           # optional: OutboundSettings
    async with box.store.transaction() as conn:
        ...                                             # your change
        await box.publish(conn, "order.created", {...}, tenant="client-42")

``relaybox dispatch`` (or ``serve`` with the ``dispatcher`` role) delivers; tenants
manage their endpoints over ``/api/v1`` (role ``api``). See ``docs/sending.md``.
"""

from relaybox.config.outbound import DEFAULT_SCHEDULE, BrokerSettings, OutboundSettings
from relaybox.outbound.apikeys import authenticate, create_api_key, list_api_keys, revoke_api_key
from relaybox.outbound.catalog import EventType, InvalidMessage, define_event_type, list_event_types
from relaybox.outbound.channels import (
    BrokerChannel,
    Channel,
    Delivery,
    EmailChannel,
    HttpChannel,
    NatsChannel,
    RabbitMQChannel,
    RedisStreamChannel,
    Result,
    WebhookChannel,
)
from relaybox.outbound.deliveries import (
    get_message,
    list_attempts,
    list_deliveries,
    list_messages,
    recover,
    redeliver,
)
from relaybox.outbound.dispatcher import Dispatcher
from relaybox.outbound.endpoints import (
    EndpointPatch,
    EndpointSpec,
    InvalidEndpoint,
    create_endpoint,
    delete_endpoint,
    disable_endpoint,
    enable_endpoint,
    endpoint_secrets,
    get_endpoint,
    list_endpoints,
    rotate_secret,
    seal_secrets,
    update_endpoint,
)
from relaybox.outbound.publish import publish
from relaybox.outbound.registry import Outbound, configure, outbound
from relaybox.outbound.ssrf import Guard, UnsafeDestination
from relaybox.retry import Schedule
from relaybox.store.outbox_rows import Endpoint, Message

__all__ = [
    "DEFAULT_SCHEDULE",
    "BrokerChannel",
    "BrokerSettings",
    "Channel",
    "Delivery",
    "Dispatcher",
    "EmailChannel",
    "Endpoint",
    "EndpointPatch",
    "EndpointSpec",
    "EventType",
    "Guard",
    "HttpChannel",
    "InvalidEndpoint",
    "InvalidMessage",
    "Message",
    "NatsChannel",
    "Outbound",
    "OutboundSettings",
    "RabbitMQChannel",
    "RedisStreamChannel",
    "Result",
    "Schedule",
    "UnsafeDestination",
    "WebhookChannel",
    "authenticate",
    "configure",
    "create_api_key",
    "create_endpoint",
    "define_event_type",
    "delete_endpoint",
    "disable_endpoint",
    "enable_endpoint",
    "endpoint_secrets",
    "get_endpoint",
    "get_message",
    "list_api_keys",
    "list_attempts",
    "list_deliveries",
    "list_endpoints",
    "list_event_types",
    "list_messages",
    "outbound",
    "publish",
    "recover",
    "redeliver",
    "revoke_api_key",
    "rotate_secret",
    "seal_secrets",
    "update_endpoint",
]
