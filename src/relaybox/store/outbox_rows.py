"""Records of the sending side: what :class:`~relaybox.store.outbox.OutboxStore`
takes and returns (endpoints, messages, deliveries, attempts as listed, keys), and a
leased row as the channels take it (:class:`Delivery`, with its :class:`MessageBody`
and its endpoint's :class:`Target`). What the dispatcher's statements take and return
(a lease's request and plan, an attempt's record) is in
:mod:`relaybox.store.dispatch_rows`."""

from __future__ import annotations

import dataclasses
import json
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from relaybox.store.keys import message_digest, message_ref, scope_of
from relaybox.wire import stored_json

__all__ = [
    "ApiKey",
    "AttemptRow",
    "BlockedKey",
    "Delivery",
    "DeliveryRow",
    "Endpoint",
    "EndpointAttempt",
    "EndpointBacklog",
    "EndpointHealth",
    "EndpointQuotaReached",
    "EndpointStatusChange",
    "EndpointWrite",
    "EventTypeRow",
    "FailureStreak",
    "Message",
    "MessageBody",
    "NewMessage",
    "PublishContext",
    "SecretOpener",
    "StoredSecret",
    "Target",
    "filter_text",
    "new_id",
    "with_extras",
]


@dataclass(frozen=True, slots=True)
class Target:
    """A webhook endpoint as the dispatcher loaded it for one attempt."""

    id: str
    tenant: str
    url: str
    signature: Literal["standard", "sha256"]
    timeout: float | None
    schedule: tuple[float, ...] | None
    secrets: tuple[str, ...] = ()
    locked: str | None = None  # why the secrets could not be opened (outbound.vault)
    headers: tuple[tuple[str, str], ...] = ()
    """The endpoint's custom request headers."""
    credentials: str | None = None
    """Its HTTP credentials as JSON text, opened (outbound.credentials); ``None``: none."""
    failing: bool = False
    """It was announced failing (``relaybox.endpoint.failing``): a success is recorded
    with its recovery (``relaybox.endpoint.recovered``)."""
    trace_context: bool = True
    """Its requests carry the attempt's ``traceparent`` when tracing is on."""

    def __repr__(self) -> str:  # never print secret material
        return f"Target(id={self.id!r}, tenant={self.tenant!r}, secrets=<{len(self.secrets)}>)"


def with_extras(
    target: Target,
    headers: str | None,
    credentials: str | None,
    failing_level: int | None,
    open_secrets: SecretOpener,
) -> Target:
    """``target`` with its endpoint's headers (JSON object text), credentials (sealed:
    opened like its secrets; one that no key opens locks the endpoint as they do)
    and whether it was announced failing. Only endpoints that have one of them pay
    for this."""
    pairs = tuple(json.loads(headers).items()) if headers else ()
    opened: str | None = None
    locked = target.locked
    if credentials:
        found, why = open_secrets((credentials,))
        opened = found[0] if found else None
        locked = locked or why
    return dataclasses.replace(
        target,
        headers=pairs,
        credentials=opened,
        locked=locked,
        failing=bool(failing_level),
    )


@dataclass(frozen=True, slots=True)
class MessageBody:
    """A published message: its id (the ``webhook-id``) and the exact bytes to send."""

    id: str
    event_type: str
    body: bytes
    sequence: int | None = None
    """Its number within its ordering key (``webhook-sequence``); ``None``: no key."""
    traceparent: str | None = None
    """The trace context it was published in (:mod:`relaybox.tracing`), if traced."""


@dataclass(frozen=True, slots=True)
class Delivery:
    """One attempt of one outbox row, handed to :meth:`Channel.deliver`."""

    id: int
    channel: str
    key: str
    """Stable across attempts: the idempotency key the destination deduplicates on."""
    payload: Any
    tenant: str | None
    attempt: int
    lease_token: int
    uncertain: bool
    deadline: float
    """Seconds this attempt may take: the channel's timeout, capped so the result is
    recorded before the lease runs out."""
    message: MessageBody | None = None
    endpoint: Target | None = None
    lane: str | None = None
    """Its lane (the endpoint id, or the channel for a handler's row)."""


def new_id(prefix: str, now: float) -> str:
    """``prefix_`` + milliseconds (hex, so ids sort by time) + 64 random bits."""
    return f"{prefix}_{int(now * 1000):011x}{secrets.token_hex(8)}"


class EndpointQuotaReached(Exception):
    """The tenant has ``count`` endpoints already, the quota's worth."""

    def __init__(self, count: int) -> None:
        super().__init__(f"the tenant has {count} endpoints")
        self.count = count


@dataclass(frozen=True)
class Endpoint:
    id: str
    tenant: str
    url: str
    description: str
    event_types: list[str]
    status: str
    disabled_reason: str | None
    signature: str
    timeout: float | None
    schedule: list[float] | None
    failing_since: float | None
    created_at: float
    updated_at: float
    max_in_flight: int
    rate_limit: float | None
    payload_filter: dict[str, Any] | None = None
    paused_at: float | None = None
    headers: dict[str, str] | None = None
    credentials_type: str | None = None
    """Which credentials are set (``basic``, ``bearer``, ``oauth2``); never them."""
    ordered: bool = False
    on_dead: str = "hold"
    trace_context: bool = True
    """Its requests carry ``traceparent`` when tracing is on (:mod:`relaybox.tracing`)."""

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Endpoint:
        """From ``endpoint_get``'s columns, in their order."""
        return cls(
            id=row[0],
            tenant=row[1],
            url=row[2],
            description=row[3],
            event_types=json.loads(row[4]),
            status=row[5],
            disabled_reason=row[6],
            signature=row[7],
            timeout=row[8],
            schedule=json.loads(row[9]) if row[9] else None,
            failing_since=row[10],
            created_at=row[11],
            updated_at=row[12],
            max_in_flight=row[13],
            rate_limit=row[14],
            payload_filter=json.loads(row[15]) if row[15] else None,
            paused_at=row[16],
            headers=json.loads(row[17]) if len(row) > 17 and row[17] else None,
            credentials_type=row[18] if len(row) > 18 else None,
            ordered=bool(row[19]),
            on_dead=row[20],
            trace_context=bool(row[21]),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "url": self.url,
            "description": self.description,
            "event_types": self.event_types,
            "enabled": self.status == "enabled",
            "disabled_reason": self.disabled_reason,
            "signature": self.signature,
            "timeout": self.timeout,
            "schedule": self.schedule,
            "max_in_flight": self.max_in_flight,
            "rate_limit": self.rate_limit,
            "ordered": self.ordered,
            "on_dead": self.on_dead,
            "trace_context": self.trace_context,
            "failing_since": self.failing_since,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "filter": self.payload_filter,
            "paused": self.paused_at is not None,
            "paused_at": self.paused_at,
            "headers": self.headers or {},
            "credentials": (
                None
                if self.credentials_type is None
                else {"type": self.credentials_type, "set": True}
            ),
        }


@dataclass(frozen=True, slots=True)
class EndpointWrite:
    """An endpoint's mutable fields and lane settings, as written at once (a create, or
    an update with the patch merged into the current row)."""

    id: str
    tenant: str
    url: str
    description: str
    event_types: Sequence[str]
    signature: str
    timeout: float | None
    schedule: Sequence[float] | None
    max_in_flight: int
    rate_limit: float | None
    payload_filter: Mapping[str, Any] | None = None
    ordered: bool = False
    on_dead: str = "hold"
    trace_context: bool = True


def filter_text(payload_filter: Mapping[str, Any]) -> str:
    """A payload filter as stored: compact JSON, so that what a publish reads of it
    (``publish_context`` reads every filter of the tenant, each time) is the size the
    filter was checked against (``filter_max_bytes``, ``filter_tenant_max_bytes``).
    A filter was checked before (no lone surrogate: it encodes as UTF-8)."""
    return json.dumps(payload_filter, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class EndpointStatusChange:
    """An endpoint whose status a call changed."""

    id: str
    tenant: str
    url: str
    failing_since: float | None


@dataclass(frozen=True, slots=True)
class StoredSecret:
    """An endpoint secret as stored (sealed, or plaintext from older versions)."""

    endpoint_id: str
    secret: str
    created_at: float
    expires_at: float | None


@dataclass(frozen=True)
class Message:
    """A published message. ``created`` is ``False`` when an earlier publish with the
    same idempotency key already created it (nothing new was written)."""

    id: str
    tenant: str
    event_type: str
    idempotency_key: str | None
    body: bytes
    created_at: float
    created: bool = True
    endpoints: tuple[str, ...] = ()
    ordering_key: str | None = None
    sequence: int | None = None

    @property
    def envelope(self) -> dict[str, Any]:
        # stored_json: a NaN or Infinity an earlier version stored reads as null
        result: dict[str, Any] = stored_json(self.body.decode())
        return result

    @classmethod
    def from_row(cls, row: Sequence[Any], *, created: bool = False) -> Message:
        """From (id, tenant, event_type, idempotency_key, body, created_at,
        ordering_key, sequence)."""
        return cls(
            id=row[0],
            tenant=row[1],
            event_type=row[2],
            idempotency_key=row[3],
            body=row[4].encode(),
            created_at=row[5],
            created=created,
            ordering_key=row[6],
            sequence=row[7],
        )

    @classmethod
    def from_key_row(cls, row: Sequence[Any], tenant: str, idempotency_key: str) -> Message:
        """From ``message_get_by_key``: the message row's columns, then the day its key
        was first seen. When the message row is gone (its history dropped, the key
        kept), the message is known by its id alone: no event type (``""``), its body
        JSON ``null`` (as a purged message's), created at the start of that day."""
        if row[1] is not None:
            return cls.from_row(row)
        return cls(
            id=row[0],
            tenant=tenant,
            event_type="",
            idempotency_key=idempotency_key,
            body=b"null",
            created_at=float(row[8]) * 86400,
            created=False,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "event_type": self.event_type,
            "idempotency_key": self.idempotency_key,
            "ordering_key": self.ordering_key,
            "sequence": self.sequence,
            "created_at": self.created_at,
            "payload": self.envelope,
        }


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A message to insert; ``body`` is its envelope as JSON text."""

    id: str
    tenant: str
    event_type: str
    idempotency_key: str | None
    body: str
    created_at: float
    ordering_key: str | None = None
    sequence: int | None = None
    traceparent: str | None = None
    """The trace context of the publish (:func:`relaybox.tracing.traceparent`)."""

    def params(self) -> tuple[Any, ...]:
        """Parameters of ``message_insert``."""
        return (
            self.id,
            self.tenant,
            self.event_type,
            self.idempotency_key,
            self.body,
            self.created_at,
            self.ordering_key,
            self.sequence,
            self.traceparent,
        )

    def key_params(self) -> tuple[Any, ...] | None:
        """Parameters of ``message_key_insert`` (``None`` without an idempotency key): the
        key's digest, its tenant's scope, the publish time and the message's id as
        :func:`~relaybox.store.keys.message_ref` stores it."""
        if self.idempotency_key is None:
            return None
        return (
            message_digest(self.tenant, self.idempotency_key),
            scope_of(self.tenant),
            self.created_at,
            *message_ref(self.id),
        )


@dataclass(frozen=True, slots=True)
class PublishContext:
    """What a publish reads (``OutboxStore.publish_context``): the catalog's schema of its
    event type (JSON text, ``None`` without one), its tenant's enabled endpoints as
    (id, event type patterns as JSON text, payload filter as JSON text or ``None``),
    by id, and the type's subject path (``None`` without one)."""

    schema: str | None
    subscribers: list[tuple[str, str, str | None]]
    subject: str | None = None

    @classmethod
    def from_rows(cls, rows: Iterable[Sequence[Any]]) -> PublishContext:
        """From the ``publish_context`` statement's rows (the event type's row first,
        its id NULL, its subject path in the second column)."""
        schema = subject = None
        subscribers = []
        for r in rows:
            if r[0] is None:
                schema = str(r[3]) if r[3] else None
                subject = None if r[1] is None else str(r[1])
            else:
                subscribers.append((r[0], r[1], r[2]))
        return cls(schema, subscribers, subject)


@dataclass(frozen=True, slots=True)
class DeliveryRow:
    """An outbox row (a webhook delivery or a channel row) as listings show it; under a
    lease, ``attempts`` counts the leased attempt."""

    id: str
    message_id: str | None
    endpoint_id: str | None
    channel: str | None
    key: str | None
    tenant: str | None
    status: str
    dead_reason: str | None
    attempts: int
    next_attempt_at: float | None
    last_error: str | None
    last_status: int | None
    created_at: float
    updated_at: float | None
    sent_at: float | None
    event_type: str | None
    broker: str | None = None
    """``delivery_list``: the broker destination of the row's endpoint, when it routes
    to one (``broker:<name>``): its deliveries go out through that channel."""


@dataclass(frozen=True, slots=True)
class BlockedKey:
    """An ordering key held back on an ordered endpoint by a dead delivery (its first
    dead ``sequence``), with the endpoint's deliveries of the key waiting behind it."""

    endpoint_id: str
    tenant: str
    ordering_key: str
    sequence: int
    dead: int
    waiting: int

    def to_json(self) -> dict[str, Any]:
        return {
            "endpoint_id": self.endpoint_id,
            "ordering_key": self.ordering_key,
            "sequence": self.sequence,
            "dead": self.dead,
            "waiting": self.waiting,
        }


@dataclass(frozen=True, slots=True)
class AttemptRow:
    """One recorded delivery attempt of a message."""

    outbox_id: str
    endpoint_id: str | None
    attempt: int
    started_at: float
    duration: float | None
    outcome: str
    status_code: int | None
    error: str | None
    response: Any
    headers: str | None = None
    """The request and response headers as recorded (JSON text), or ``None``."""


@dataclass(frozen=True, slots=True)
class EventTypeRow:
    """A catalog entry; ``schema`` is the JSON Schema as stored text, or ``None``;
    ``subject`` the path of the subject in its messages, or ``None``."""

    name: str
    description: str
    schema: str | None
    subject: str | None = None


@dataclass(frozen=True, slots=True)
class ApiKey:
    """A tenant API key's record (never the key: only its hash is stored)."""

    id: str
    tenant: str
    name: str
    created_at: float
    revoked_at: float | None


SecretOpener = Callable[[Sequence[str]], tuple[tuple[str, ...], str | None]]
"""Opens an endpoint's stored secrets: (the secrets, ``None``), or ((), why not)."""


@dataclass(frozen=True, slots=True)
class FailureStreak:
    """An endpoint's status and the start of its failure streak after a failure."""

    status: str
    failing_since: float
    failures: int = 1
    """Attempts failed in a row, this one included."""
    failing_level: int = 0
    """The failure threshold announced so far (0: none)."""


@dataclass(frozen=True, slots=True)
class EndpointHealth:
    """An endpoint's delivery attempts in a window: how many, how many were accepted,
    the last one's start."""

    attempts: int
    succeeded: int
    last_attempt_at: float | None


@dataclass(frozen=True, slots=True)
class EndpointBacklog:
    """An endpoint's undelivered rows by status, and the oldest pending row's time."""

    pending: int
    dead: int
    held: int
    oldest: float | None


@dataclass(frozen=True, slots=True)
class EndpointAttempt:
    """One recent attempt to an endpoint."""

    outbox_id: int
    message_id: str | None
    attempt: int
    started_at: float
    duration: float
    outcome: str
    status_code: int | None
    error: str | None
