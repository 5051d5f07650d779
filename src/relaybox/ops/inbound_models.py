"""The shapes of the admin API: one pydantic model per document, shared by the JSON
API, the dashboard templates, ``relaybox … --json`` and the OpenAPI document, so the
three surfaces and the published contract cannot drift apart.

Times are epoch seconds (floats), as stored; the dashboard renders them for people.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from relaybox.timespec import TIME_FORMS, TimeSpec

__all__ = [
    "Attempt",
    "BusinessKey",
    "DeadFilter",
    "DeadRetryRequest",
    "DeadRetryResult",
    "Difference",
    "DiscardRequest",
    "DiscardResult",
    "ErrorBody",
    "EventDetail",
    "EventPage",
    "EventSummary",
    "InboxFilter",
    "OutboxRow",
    "OutboxStats",
    "PageQuery",
    "QuarantineDetail",
    "QuarantineFilter",
    "QuarantinePage",
    "QuarantineRef",
    "QuarantineSide",
    "QuarantineSummary",
    "ReplayRecord",
    "ReplayRequest",
    "ReplayResult",
    "ReplaySelectionRequest",
    "RequestModel",
    "ResolveRequest",
    "ResolveResult",
    "StatsResponse",
]

Status = Literal["pending", "done", "dead", "ignored"]
DeadReason = Literal["invalid", "exhausted", "conflict", "unhandled"]
Resolution = Literal["kept_original", "handled_manually"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RequestModel(_Model):
    """Base of every query and body model: text must be storable on both backends."""

    @field_validator("*", mode="after")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        # PostgreSQL text cannot hold U+0000: refuse it as a 400, not a 500 later.
        texts = value if isinstance(value, list) else [value]
        if any(isinstance(t, str) and "\x00" in t for t in texts):
            raise ValueError("must not contain the NUL character")
        return value


class ErrorBody(_Model):
    """Every non-2xx answer: a stable code for scripts, a sentence for people."""

    error: str = Field(description="machine-readable code, e.g. unauthorized, not_found")
    message: str
    details: list[dict[str, Any]] | None = None


# -- requests -------------------------------------------------------------------


class PageQuery(RequestModel):
    limit: int = Field(50, ge=1, le=500, description="rows per page")
    cursor: str | None = Field(
        None, max_length=64, description="next_cursor of the previous page (opaque)"
    )


class InboxFilter(PageQuery):
    source: str | None = Field(None, max_length=200)
    type: str | None = Field(None, max_length=200, description="event type, exact")
    status: Status | None = None
    tenant: str | None = Field(None, max_length=200)
    since: TimeSpec | None = Field(None, description=f"received at or after: {TIME_FORMS}")
    until: TimeSpec | None = Field(None, description=f"received before: {TIME_FORMS}")


class DeadFilter(PageQuery):
    source: str | None = Field(None, max_length=200)
    type: str | None = Field(None, max_length=200)
    reason: DeadReason | None = Field(None, description="why it died")
    tenant: str | None = Field(None, max_length=200)
    since: TimeSpec | None = Field(None, description=f"received at or after: {TIME_FORMS}")
    until: TimeSpec | None = Field(None, description=f"received before: {TIME_FORMS}")


class QuarantineFilter(PageQuery):
    source: str | None = Field(None, max_length=200)
    resolved: bool | None = Field(False, description="false: open only (default); true: resolved")


class _Audited(RequestModel):
    reason: str = Field(min_length=1, max_length=2000, description="why: kept with the record")
    actor: str | None = Field(
        None, min_length=1, max_length=200, description="who asks (default: admin-api)"
    )


class ReplayRequest(_Audited):
    """Replay one finished event through its handler again (business keys still hold)."""


class ReplaySelectionRequest(_Audited):
    source: str | None = Field(None, max_length=200)
    since: TimeSpec | None = Field(None, description=f"received at or after: {TIME_FORMS}")
    until: TimeSpec | None = Field(None, description=f"received before: {TIME_FORMS}")
    statuses: list[Literal["done", "dead", "ignored"]] | None = Field(None, min_length=1)
    limit: int = Field(1000, ge=1, le=10_000)
    include_discarded: bool = Field(
        False, description="replay discarded dead letters too (left out otherwise)"
    )


class DeadRetryRequest(_Audited):
    """Retry every undiscarded dead letter matching the filter (at most ``limit``)."""

    source: str | None = Field(None, max_length=200)
    type: str | None = Field(None, max_length=200)
    dead_reason: DeadReason | None = None
    tenant: str | None = Field(None, max_length=200)
    since: TimeSpec | None = Field(None, description=f"received at or after: {TIME_FORMS}")
    until: TimeSpec | None = Field(None, description=f"received before: {TIME_FORMS}")
    limit: int = Field(1000, ge=1, le=10_000)


class DiscardRequest(_Audited):
    """Take a dead letter out of the queue for good, saying why."""


class ResolveRequest(_Audited):
    resolution: Resolution = Field(
        description="kept_original: the original stands, the newcomer is noise; "
        "handled_manually: an operator dealt with the difference outside relaybox"
    )


# -- responses ------------------------------------------------------------------


class EventSummary(_Model):
    id: int
    source: str
    account: str
    event_id: str
    event_type: str
    tenant: str | None
    status: Status
    dead_reason: str | None
    attempts: int
    received_at: float
    updated_at: float
    done_at: float | None
    next_attempt_at: float | None
    last_error: str | None
    purged: bool = Field(description="the payload was dropped by retention")
    discarded_at: float | None


class EventPage(_Model):
    items: list[EventSummary]
    next_cursor: str | None


class Attempt(_Model):
    attempt: int
    outcome: str
    error: str | None
    worker: str | None
    started_at: float
    finished_at: float


class BusinessKey(_Model):
    business_key: str
    fingerprint: str
    created_at: float


class OutboxRow(_Model):
    id: int
    channel: str
    key: str
    status: str
    attempts: int
    last_error: str | None
    created_at: float
    sent_at: float | None


class ReplayRecord(_Model):
    actor: str
    reason: str
    previous_status: str
    previous_reason: str | None
    replayed_at: float


class QuarantineRef(_Model):
    id: int
    received_at: float
    resolved_at: float | None
    resolution: str | None


class EventDetail(EventSummary):
    payload: Any = Field(None, description="the JSON body (text if not JSON); null if purged")
    headers: dict[str, str] | None
    version: str | None
    purged_at: float | None
    erased_at: float | None = Field(
        None,
        description="when an erasure of its subject emptied it (purged_at is set with it)",
    )
    discarded_by: str | None
    discard_reason: str | None
    attempt_log: list[Attempt]
    business_keys: list[BusinessKey]
    outbox: list[OutboxRow]
    replays: list[ReplayRecord]
    quarantine: list[QuarantineRef]


class ReplayResult(_Model):
    replayed: list[int]
    purged: list[int] = Field(description="payload dropped by retention: cannot be replayed")
    skipped: list[int] = Field(description="changed status meanwhile, or not a dead letter")
    discarded: list[int] = Field(
        default_factory=list,
        description="discarded dead letters the selection left out (include_discarded)",
    )
    message: str


class DeadRetryResult(ReplayResult):
    matched: int


class DiscardResult(_Model):
    id: int
    discarded_at: float


class QuarantineSummary(_Model):
    id: int
    inbox_id: int = Field(
        description="the original event's id (its row may no longer exist: original_status"
        " is then null)"
    )
    source: str
    account: str
    event_id: str
    event_type: str
    tenant: str | None
    received_at: float
    resolved_at: float | None
    resolution: str | None
    resolved_by: str | None
    resolution_reason: str | None
    original_status: str | None = Field(description="null when the original row is gone")


class QuarantinePage(_Model):
    items: list[QuarantineSummary]
    next_cursor: str | None


class QuarantineSide(_Model):
    event_type: str
    received_at: float
    payload: Any
    headers: dict[str, str] | None
    purged: bool


class Difference(_Model):
    path: str = Field(description="JSON path, e.g. $.data.object.amount")
    original: Any = None
    quarantined: Any = None
    change: Literal["changed", "added", "removed"]


class QuarantineDetail(QuarantineSummary):
    original: QuarantineSide | None = Field(
        description="null when the original row no longer exists (its history dropped)"
    )
    quarantined: QuarantineSide
    differences: list[Difference]


class ResolveResult(_Model):
    id: int
    resolved_at: float
    resolution: Resolution


class OutboxStats(_Model):
    pending: int
    oldest_pending_age_seconds: float | None
    sent: int
    held: int
    dead: int


class StatsResponse(_Model):
    """The numbers ``/metrics``, ``relaybox stats`` and the overview share."""

    pending: int
    oldest_pending_age_seconds: float | None
    retrying: int
    done: int
    ignored: int
    dead: int = Field(description="dead letters waiting for an operator (discarded excluded)")
    dead_invalid: int
    dead_exhausted: int
    dead_by_reason: dict[str, int]
    discarded: int
    quarantined: int
    outbox: OutboxStats
