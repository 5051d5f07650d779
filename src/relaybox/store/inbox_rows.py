"""The rows of the receiving side as the store hands them over: a delivery to accept
and the outcome of accepting it, an inbox event, a worker's claim, the inbox's counts.
Shared by the asynchronous store (:mod:`relaybox.store.base`) and the synchronous one
(:mod:`relaybox.store.sync`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, Protocol

__all__ = [
    "AcceptOutcome",
    "Claim",
    "InboxEvent",
    "Listener",
    "NewAttempt",
    "NewDelivery",
    "NewOperation",
    "OutboxRow",
    "Stats",
]


class Listener(Protocol):
    async def close(self) -> None: ...


AcceptStatus = Literal["accepted", "duplicate", "quarantined", "ignored"]


@dataclass(slots=True)
class NewDelivery:
    """A verified delivery on its way into the inbox."""

    source: str
    account: str
    event_id: str
    event_type: str
    tenant: str | None
    fingerprint: bytes
    payload: bytes
    headers: str | None
    version: str | None
    received_at: float
    ignored: bool = False
    subject: bytes | None = None
    """The digest of the subject its source's ``subject`` path names: the accept
    indexes the new row under it (``relaybox_subjects``) in the same transaction."""
    held_until: float | None = None
    """Set by this process's worker when it takes the row from the accept
    (:meth:`relaybox.inbound.accept.Handoff.offer`; stores with ``starts_at_accept``): the row
    goes in with its first attempt counted and started, held back from every claimer
    until then, as a claim that started it would leave it."""
    traceparent: str | None = None
    """The W3C trace context the delivery was received in (:mod:`relaybox.tracing`):
    the sender's ``traceparent``, else the receive span's; ``None`` when not traced."""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.source, self.account, self.event_id)

    def quarantine_row(self, inbox_id: int) -> tuple[Any, ...]:
        """Parameters of ``quarantine_insert``: this delivery, kept apart from the
        original row ``inbox_id`` it conflicts with."""
        return (
            inbox_id,
            self.source,
            self.account,
            self.event_id,
            self.event_type,
            self.tenant,
            self.fingerprint,
            self.payload,
            self.headers,
            self.received_at,
        )


@dataclass(slots=True)
class AcceptOutcome:
    status: AcceptStatus
    inbox_id: int


@dataclass(frozen=True)
class InboxEvent:
    """An inbox row as a handler or an operator sees it."""

    id: int
    source: str
    account: str
    event_id: str
    event_type: str
    tenant: str | None
    payload: bytes | None
    headers: dict[str, str]
    version: str | None
    attempts: int
    received_at: float
    status: str = "pending"
    dead_reason: str | None = None
    last_error: str | None = None
    next_attempt_at: float | None = None
    done_at: float | None = None
    traceparent: str | None = None
    """The trace context the event was received in (``None`` when not traced)."""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.source, self.account, self.event_id)

    def json(self) -> Any:
        """The payload parsed as JSON (``None`` when it was purged)."""
        return None if self.payload is None else json.loads(self.payload)

    @classmethod
    def from_delivery(cls, d: NewDelivery, inbox_id: int, *, attempts: int) -> InboxEvent:
        """The row ``inbox_id`` as ``d`` inserted it, read back without a query (a row
        the accept inserted started and held: :attr:`NewDelivery.held_until`)."""
        return cls(
            id=inbox_id,
            source=d.source,
            account=d.account,
            event_id=d.event_id,
            event_type=d.event_type,
            tenant=d.tenant,
            payload=d.payload,
            headers=json.loads(d.headers) if d.headers else {},
            version=d.version,
            attempts=attempts,
            received_at=d.received_at,
            next_attempt_at=d.held_until,
            traceparent=d.traceparent,
        )

    @classmethod
    def from_row(cls, row: Any) -> InboxEvent:
        m = row._mapping if hasattr(row, "_mapping") else row  # SQLAlchemy Row or asyncpg Record
        return cls(
            id=m["id"],
            source=m["source"],
            account=m["account"],
            event_id=m["event_id"],
            event_type=m["event_type"],
            tenant=m["tenant"],
            payload=bytes(m["payload"]) if m["payload"] is not None else None,
            headers=json.loads(m["headers"]) if m["headers"] else {},
            version=m["version"],
            attempts=m["attempts"],
            received_at=m["received_at"],
            status=m.get("status", "pending"),
            dead_reason=m.get("dead_reason"),
            last_error=m.get("last_error"),
            next_attempt_at=m.get("next_attempt_at"),
            done_at=m.get("done_at"),
            traceparent=m.get("traceparent"),
        )


@dataclass(frozen=True)
class Claim:
    """Result of one claim: rows to process now, and rows just dead-lettered because
    their attempts were used up by workers that died."""

    ids: list[int]
    exhausted: list[tuple[int, str, str, str, int]]
    suspects: list[int] = field(default_factory=list)
    """Rows whose previous attempt started and never finished: run them alone."""
    events: dict[int, InboxEvent] = field(default_factory=dict)
    """The claimed pending rows (``ids`` and ``suspects``) as claimed: the worker does
    not read them again."""
    started: frozenset[int] = frozenset()
    """Rows of ``ids`` whose attempt the claim counted (``start``): their ``attempts``
    in :attr:`events` is that attempt's number; the others' are counted as they start."""

    @classmethod
    def from_rows(cls, rows: Sequence[Any]) -> Claim:
        """Rows of ``inbox_claim``: (id, status, source, account, event_id, attempts,
        suspect, the other columns of :class:`InboxEvent`, then whether the claim
        counted the row's attempt)."""
        return cls(
            ids=sorted(r[0] for r in rows if r[1] == "pending" and not r[6]),
            exhausted=[(r[0], r[2], r[3], r[4], r[5]) for r in rows if r[1] == "dead"],
            suspects=sorted(r[0] for r in rows if r[1] == "pending" and r[6]),
            events={r[0]: InboxEvent.from_row(r) for r in rows if r[1] == "pending"},
            started=frozenset(r[0] for r in rows if r[1] == "pending" and r[13]),
        )


@dataclass(frozen=True)
class Stats:
    pending: int
    done: int
    ignored: int
    dead_invalid: int
    dead_exhausted: int
    dead_other: int
    quarantined: int
    oldest_pending_at: float | None

    @property
    def dead(self) -> int:
        return self.dead_invalid + self.dead_exhausted + self.dead_other


class OutboxRow(NamedTuple):
    """A handler's outbox row, written before its transaction commits."""

    channel: str
    key: str
    payload: str  # JSON text
    tenant: str | None
    inbox_id: int | None


@dataclass(frozen=True, slots=True)
class NewAttempt:
    """A handler's attempt for the attempts history (``attempt_insert``)."""

    inbox_id: int
    attempt: int
    outcome: str
    error: str | None
    worker: str
    started_at: float
    finished_at: float


@dataclass(frozen=True, slots=True)
class NewOperation:
    """A business key a handler claims (``operation_insert``): the first insert wins;
    another ``fingerprint`` under the key is a conflict."""

    business_key: str
    fingerprint: str
    inbox_id: int | None
    source: str | None
    tenant: str | None
    now: float
