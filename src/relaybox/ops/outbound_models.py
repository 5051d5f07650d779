"""The admin API's models of the sending side: endpoints, messages, deliveries,
attempts, event types, operational events, an endpoint's headers and credentials, and
the actions' requests and answers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from relaybox.ops.inbound_models import RequestModel
from relaybox.outbound.credentials import CredentialsSpec
from relaybox.timespec import TIME_FORMS, TimeSpec

if TYPE_CHECKING:
    pass


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EndpointFilter(RequestModel):
    tenant: str | None = Field(None, max_length=200)
    limit: int = Field(100, ge=1, le=1000)


class Health(_Model):
    attempts: int = Field(description="delivery attempts in the last 24 h")
    succeeded: int
    success_rate: float | None = Field(description="succeeded / attempts; null without attempts")
    last_attempt_at: float | None
    pending: int
    dead: int
    held: int
    oldest_pending_age_seconds: float | None


class EndpointSummary(_Model):
    id: str
    tenant: str
    url: str
    description: str
    event_types: list[str]
    status: str
    disabled_reason: str | None
    failing_since: float | None
    created_at: float
    health: Health
    paused_at: float | None = Field(None, description="when it was paused; null: not paused")
    filter: dict[str, Any] | None = Field(None, description="its payload filter, if any")
    ordered: bool = Field(False, description="ordered delivery per ordering key")
    on_dead: str = Field("hold", description="a dead head: hold its key, or skip it")


class EndpointList(_Model):
    items: list[EndpointSummary]


class EndpointAttempt(_Model):
    outbox_id: int
    message_id: str | None
    attempt: int
    started_at: float
    duration: float
    outcome: str
    status_code: int | None
    error: str | None


class BlockedKeyInfo(_Model):
    ordering_key: str
    sequence: int = Field(description="the first dead delivery's sequence number")
    dead: int = Field(description="dead deliveries holding the key")
    waiting: int = Field(description="deliveries of the key waiting behind them")


class EndpointDetail(EndpointSummary):
    recent_attempts: list[EndpointAttempt]
    blocked_keys: list[BlockedKeyInfo] = Field(
        default_factory=list, description="ordering keys dead deliveries hold back"
    )


class MessageFilter(RequestModel):
    tenant: str | None = Field(None, max_length=200)
    type: str | None = Field(None, max_length=200, description="event type, exact")
    limit: int = Field(50, ge=1, le=500)
    cursor: str | None = Field(None, max_length=200)


class MessageSummary(_Model):
    id: str
    tenant: str
    event_type: str
    idempotency_key: str | None
    created_at: float


class MessagePage(_Model):
    items: list[MessageSummary]
    next_cursor: str | None


class Delivery(_Model):
    id: int
    endpoint_id: str | None
    channel: str
    status: str
    dead_reason: str | None
    attempts: int
    next_attempt_at: float | None
    last_error: str | None
    last_status: int | None
    created_at: float
    sent_at: float | None


class MessageAttempt(_Model):
    outbox_id: int
    endpoint_id: str | None
    attempt: int
    started_at: float
    duration: float
    outcome: str
    status_code: int | None
    error: str | None
    response: str | None


class MessageDetail(MessageSummary):
    payload: Any = Field(description="the envelope every endpoint receives; null once purged")
    purged_at: float | None = Field(
        description="when retention dropped the body (it can no longer be redelivered)"
    )
    deliveries: list[Delivery]
    attempts: list[MessageAttempt]


class EventTypeInfo(_Model):
    name: str
    description: str
    schema_: dict[str, Any] | None = Field(
        alias="schema", serialization_alias="schema", description="JSON Schema of data"
    )
    subject: str | None = Field(
        None,
        description="where its messages name their subject (a dotted path into the "
        "envelope, data.customer.id): each is indexed under it for erasure",
    )


class EventTypeList(_Model):
    items: list[EventTypeInfo]


class EventTypeDefinition(RequestModel):
    description: str = Field("", max_length=2000, description="what it means, for subscribers")
    schema_: dict[str, Any] | None = Field(
        None, alias="schema", description="JSON Schema that published data must match"
    )
    subject: str | None = Field(
        None,
        min_length=1,
        max_length=512,
        description="where its messages name their subject (a dotted path into the "
        "envelope, data.customer.id; at most erasure.path_max_depth names and "
        "erasure.path_max_chars characters)",
    )


class RedeliverRequest(RequestModel):
    reason: str = Field(min_length=1, max_length=2000)
    endpoint_id: str | None = Field(None, max_length=200, description="only this endpoint")
    actor: str | None = Field(None, min_length=1, max_length=200)


class RedeliverResult(_Model):
    message_id: str
    redelivered: int = Field(description="finished deliveries sent again")


class EndpointActionRequest(RequestModel):
    """Disable or enable an endpoint; ``reason`` (and ``actor``) are logged, and a
    disable keeps them as the endpoint's ``disabled_reason``."""

    reason: str = Field(min_length=1, max_length=2000, description="why: kept with the record")
    actor: str | None = Field(
        None, min_length=1, max_length=200, description="who asks (default: admin-api)"
    )


class EndpointActionResult(_Model):
    endpoint_id: str
    status: str = Field(description="enabled or disabled, after the action")
    disabled_reason: str | None
    message: str


class RecoverRequest(EndpointActionRequest):
    since: TimeSpec = Field(description=f"dead deliveries created at or after: {TIME_FORMS}")
    until: TimeSpec | None = Field(None, description=f"created before: {TIME_FORMS}")


class RecoverResult(_Model):
    endpoint_id: str
    recovered: int = Field(description="dead deliveries back to pending")
    message: str


class OrderingRequest(EndpointActionRequest):
    ordered: bool | None = Field(None, description="ordered delivery per ordering key")
    on_dead: Literal["hold", "skip"] | None = Field(
        None, description="a dead head holds its key (hold) or is skipped (skip)"
    )


class OrderingResult(_Model):
    endpoint_id: str
    ordered: bool
    on_dead: str
    message: str


class ReleaseKeyRequest(EndpointActionRequest):
    ordering_key: str = Field(min_length=1, max_length=256)


class ReleaseKeyResult(_Model):
    endpoint_id: str
    ordering_key: str
    released: int = Field(description="dead deliveries that held the key (they stay dead)")
    message: str


# -- operational events, an endpoint's headers and credentials -----------------


class EventFilter(RequestModel):
    limit: int = Field(50, ge=1, le=500)


class OperationalEvent(_Model):
    id: str
    event_type: str
    created_at: float
    data: Any = Field(
        description="the event's payload (docs/howto/operational-events.md lists each)"
    )


class OperationalEventList(_Model):
    tenant: str = Field(description="the operational tenant the events are published to")
    items: list[OperationalEvent]


class HeadersRequest(RequestModel):
    headers: dict[str, str] = Field(description="the endpoint's custom headers ({}: none)")


class CredentialsRequest(RequestModel):
    credentials: CredentialsSpec


class EndpointAccess(_Model):
    id: str
    tenant: str
    headers: dict[str, str]
    credentials: dict[str, Any] | None = Field(
        description='{"type": ..., "set": true}, or null; the credentials are never shown'
    )
