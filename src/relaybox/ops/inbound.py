"""Operator reads and actions: the one place that runs the ``ops_*`` queries and maps
rows to :mod:`relaybox.ops.inbound_models`. The JSON API, the dashboard and the CLI all call
these functions, so a dead letter retried from any of them goes the same way: through
:func:`relaybox.inbound.replay.replay`, the worker and the handler's business keys.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from relaybox.errors import Conflict, InvalidRequest, NotFound
from relaybox.inbound.replay import Selection, replay
from relaybox.metrics import read_ops_stats
from relaybox.ops.inbound_models import (
    Attempt,
    BusinessKey,
    DeadFilter,
    DeadRetryRequest,
    DeadRetryResult,
    Difference,
    DiscardResult,
    EventDetail,
    EventPage,
    EventSummary,
    InboxFilter,
    OutboxRow,
    QuarantineDetail,
    QuarantineFilter,
    QuarantinePage,
    QuarantineRef,
    QuarantineSide,
    QuarantineSummary,
    ReplayRecord,
    ReplayResult,
    ResolveResult,
    StatsResponse,
)
from relaybox.wire import parse_json

if TYPE_CHECKING:
    from relaybox.runtime import Runtime
    from relaybox.store.operator import EventListing

__all__ = [
    "age_text",
    "dead_discard",
    "dead_list",
    "dead_retry",
    "dead_retry_many",
    "decode_cursor",
    "decode_payload",
    "encode_cursor",
    "event_get",
    "inbox_list",
    "json_differences",
    "quarantine_get",
    "quarantine_list",
    "quarantine_resolve",
    "replay_event",
    "replay_selection",
    "stats",
    "table_exists",
    "throughput",
    "when",
]


# -- cursors --------------------------------------------------------------------


def encode_cursor(last_id: int) -> str:
    """Opaque so clients do not build them; versioned so the format can change."""
    return base64.urlsafe_b64encode(f"v1:{last_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None) -> int | None:
    if cursor is None or cursor == "":
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        version, _, value = raw.partition(":")
        if version == "v1" and value.isdigit():
            return int(value)
    except (binascii.Error, UnicodeDecodeError, ValueError):
        pass
    raise InvalidRequest("cursor is not one this API returned")


def _page_ids(rows: Sequence[Any], limit: int) -> str | None:
    return encode_cursor(rows[-1]["id"]) if len(rows) == limit else None


# -- helpers --------------------------------------------------------------------


def when(ts: float | None) -> str:
    """ISO 8601 in UTC, for messages people read."""
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def age_text(seconds: float | None) -> str:
    """``3d 4h``, ``12m 5s``: two units are what a person reads at a glance."""
    if seconds is None:
        return "-"
    s = round(seconds)
    if s >= 86400:
        return f"{s // 86400}d {s % 86400 // 3600}h"
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60}m"
    if s >= 60:
        return f"{s // 60}m {s % 60}s"
    return f"{s}s"


def decode_payload(raw: bytes | memoryview | None) -> Any:
    """The body as JSON when it is JSON, else as text (an operator can still read a
    form-encoded provider's body), ``None`` when purged."""
    if raw is None:
        return None
    data = bytes(raw)
    try:
        return parse_json(data)  # NaN or Infinity: not JSON, shown as the text it is
    except (ValueError, RecursionError):
        return data.decode("utf-8", errors="replace")


def _headers(raw: str | None) -> dict[str, str] | None:
    return json.loads(raw) if raw else None


def _summary(m: Any) -> EventSummary:
    """An event's summary from its row: the columns of the same names, ``purged`` as
    a truth value."""
    fields = {k: m[k] for k in EventSummary.model_fields}
    return EventSummary(**{**fields, "purged": bool(m["purged"])})


async def table_exists(box: Runtime, table: str) -> bool:
    """Whether a migration created ``table`` (outbound sections plug in on this)."""
    return await box.store.operator.table_exists(table)


# -- inbox ----------------------------------------------------------------------


def _event_filter(
    f: InboxFilter | DeadFilter | DeadRetryRequest, before_id: int | None
) -> EventListing:
    """The listing (:class:`~relaybox.store.operator.EventListing`) the lists of events
    share (the inbox's, the dead letters'), from an operator's filter: below
    ``before_id``, the newest first."""
    return {
        "source": f.source,
        "event_type": f.type,
        "tenant": f.tenant,
        "since": f.since,
        "until": f.until,
        "before_id": before_id,
        "limit": f.limit,
    }


async def inbox_list(box: Runtime, f: InboxFilter) -> EventPage:
    query = _event_filter(f, decode_cursor(f.cursor))
    rows = await box.store.operator.inbox_list(status=f.status, **query)
    return EventPage(items=[_summary(r) for r in rows], next_cursor=_page_ids(rows, f.limit))


async def event_get(box: Runtime, inbox_id: int) -> EventDetail:
    """One event with everything an operator asks about it, read in one transaction."""
    history = await box.store.operator.inbox_history(inbox_id)
    if history is None:
        raise NotFound(f"no inbox event {inbox_id}")
    m = dict(history.event)
    m["purged"] = m["payload"] is None
    return EventDetail(
        **_summary(m).model_dump(),
        payload=decode_payload(m["payload"]),
        headers=_headers(m["headers"]),
        version=m["version"],
        purged_at=m["purged_at"],
        erased_at=m.get("erased_at"),
        discarded_by=m["discarded_by"],
        discard_reason=m["discard_reason"],
        attempt_log=[Attempt(**a) for a in history.attempts],
        business_keys=[BusinessKey(**k) for k in history.business_keys],
        outbox=[OutboxRow(**o) for o in history.outbox],
        replays=[ReplayRecord(**r) for r in history.replays],
        quarantine=[QuarantineRef(**q) for q in history.quarantine],
    )


def _replay_message(
    result: Any,
    purged_at: dict[int, float | None],
    erased_at: dict[int, float | None] | None = None,
) -> str:
    parts = []
    if result.replayed:
        parts.append(f"{len(result.replayed)} event(s) back to pending")
    for inbox_id in result.purged:
        erased = (erased_at or {}).get(inbox_id)
        if erased is not None:
            parts.append(
                f"event {inbox_id} cannot be replayed: its payload was erased on "
                f"{when(erased)} at a request to erase its subject (its keys and outcome "
                "are kept)"
            )
            continue
        parts.append(
            f"event {inbox_id} cannot be replayed: its payload was purged by retention "
            f"on {when(purged_at.get(inbox_id))} (its keys and outcome are kept)"
        )
    if result.skipped:
        parts.append(f"{len(result.skipped)} skipped (status changed meanwhile)")
    if result.discarded:
        parts.append(
            f"{len(result.discarded)} discarded dead letter(s) left out"
            " (include_discarded to replay them)"
        )
    return "; ".join(parts) or "nothing matched"


async def _replay(box: Runtime, selection: Selection, actor: str, reason: str) -> ReplayResult:
    result = await replay(box, selection, actor=actor, reason=reason)
    purged = await box.store.operator.inbox_purged_at(result.purged)
    erased = await box.store.operator.inbox_purged_at(result.purged, column="erased_at")
    return ReplayResult(**result.as_dict(), message=_replay_message(result, purged, erased))


async def _replay_one(box: Runtime, selection: Selection, actor: str, reason: str) -> ReplayResult:
    """Replay one event: a purged one is a 409 naming the purge."""
    result = await _replay(box, selection, actor, reason)
    if result.purged:
        raise Conflict(result.message, code="payload_purged")
    return result


async def replay_event(box: Runtime, inbox_id: int, *, actor: str, reason: str) -> ReplayResult:
    """Replay one finished event. A purged one is a 409 naming the purge: replaying
    without the payload would run the handler on nothing."""
    event = await event_get(box, inbox_id)
    if event.status == "pending":
        raise Conflict(f"event {inbox_id} is pending: it is already on its way", code="pending")
    return await _replay_one(box, Selection(ids=[inbox_id]), actor, reason)


async def replay_selection(
    box: Runtime,
    *,
    source: str | None,
    since: float | None,
    until: float | None,
    statuses: Sequence[str] | None,
    limit: int,
    actor: str,
    reason: str,
    include_discarded: bool = False,
) -> ReplayResult:
    try:
        selection = Selection(
            source=source,
            since=since,
            until=until,
            statuses=statuses,
            limit=limit,
            include_discarded=include_discarded,
        )
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    return await _replay(box, selection, actor, reason)


# -- dead letters ---------------------------------------------------------------


async def dead_list(box: Runtime, f: DeadFilter) -> EventPage:
    query = _event_filter(f, decode_cursor(f.cursor))
    rows = await box.store.operator.dead_list(reason=f.reason, **query)
    return EventPage(items=[_summary(r) for r in rows], next_cursor=_page_ids(rows, f.limit))


async def dead_retry(box: Runtime, inbox_id: int, *, actor: str, reason: str) -> ReplayResult:
    event = await event_get(box, inbox_id)
    if event.status != "dead" or event.discarded_at is not None:
        state = "discarded" if event.discarded_at is not None else event.status
        raise Conflict(f"event {inbox_id} is not a dead letter (it is {state})", code="not_dead")
    return await _replay_one(box, Selection(ids=[inbox_id], statuses=["dead"]), actor, reason)


async def dead_retry_many(box: Runtime, req: DeadRetryRequest, *, actor: str) -> DeadRetryResult:
    """Select the matching dead letters first (the same filter as the list, so what an
    operator saw is what is retried), then replay exactly those ids."""
    rows = await box.store.operator.dead_list(
        reason=req.dead_reason, **_event_filter(req, before_id=None)
    )
    ids = sorted(r["id"] for r in rows)
    if not ids:
        return DeadRetryResult(
            replayed=[], purged=[], skipped=[], message="no dead letter matched", matched=0
        )
    result = await _replay(box, Selection(ids=ids, statuses=["dead"]), actor, req.reason)
    return DeadRetryResult(**result.model_dump(), matched=len(ids))


async def dead_discard(box: Runtime, inbox_id: int, *, actor: str, reason: str) -> DiscardResult:
    now = box.clock.now()
    if await box.store.operator.dead_discard(inbox_id, now=now, actor=actor, reason=reason):
        return DiscardResult(id=inbox_id, discarded_at=now)
    event = await event_get(box, inbox_id)
    state = "already discarded" if event.discarded_at is not None else event.status
    raise Conflict(f"event {inbox_id} is not a dead letter (it is {state})", code="not_dead")


# -- quarantine -----------------------------------------------------------------


async def quarantine_list(box: Runtime, f: QuarantineFilter) -> QuarantinePage:
    rows = await box.store.operator.quarantine_list(
        source=f.source, resolved=f.resolved, before_id=decode_cursor(f.cursor), limit=f.limit
    )
    return QuarantinePage(
        items=[QuarantineSummary(**r) for r in rows], next_cursor=_page_ids(rows, f.limit)
    )


def json_differences(original: Any, quarantined: Any, path: str = "$") -> list[Difference]:
    """Leaf-level differences between two JSON documents, in document order: what an
    operator needs to decide whether the newcomer is an attack, a bug or a change."""
    if isinstance(original, dict) and isinstance(quarantined, dict):
        out: list[Difference] = []
        for key in [*original, *(k for k in quarantined if k not in original)]:
            sub = f"{path}.{key}"
            if key not in quarantined:
                out.append(Difference(path=sub, original=original[key], change="removed"))
            elif key not in original:
                out.append(Difference(path=sub, quarantined=quarantined[key], change="added"))
            else:
                out.extend(json_differences(original[key], quarantined[key], sub))
        return out
    if isinstance(original, list) and isinstance(quarantined, list):
        out = []
        for i in range(max(len(original), len(quarantined))):
            sub = f"{path}[{i}]"
            if i >= len(quarantined):
                out.append(Difference(path=sub, original=original[i], change="removed"))
            elif i >= len(original):
                out.append(Difference(path=sub, quarantined=quarantined[i], change="added"))
            else:
                out.extend(json_differences(original[i], quarantined[i], sub))
        return out
    if original == quarantined and type(original) is type(quarantined):
        return []
    return [Difference(path=path, original=original, quarantined=quarantined, change="changed")]


def _side(m: Mapping[str, Any], prefix: str) -> QuarantineSide:
    """One side of a quarantine entry from its row's columns (the original's are
    named ``original_...``)."""
    return QuarantineSide(
        event_type=m[prefix + "event_type"],
        received_at=m[prefix + "received_at"],
        payload=decode_payload(m[prefix + "payload"]),
        headers=_headers(m[prefix + "headers"]),
        purged=m[prefix + "payload"] is None,
    )


async def quarantine_get(box: Runtime, quarantine_id: int) -> QuarantineDetail:
    m = await box.store.operator.quarantine_get(quarantine_id)
    if m is None:
        raise NotFound(f"no quarantine entry {quarantine_id}")
    # The original's side, when its row still exists.
    original = None if m["original_status"] is None else _side(m, "original_")
    newcomer = _side(m, "")
    summary = {k: m[k] for k in QuarantineSummary.model_fields}
    return QuarantineDetail(
        **summary,
        original=original,
        quarantined=newcomer,
        differences=[]
        if original is None
        else json_differences(original.payload, newcomer.payload),
    )


async def quarantine_resolve(
    box: Runtime, quarantine_id: int, *, resolution: str, actor: str, reason: str
) -> ResolveResult:
    now = box.clock.now()
    resolved = await box.store.operator.quarantine_resolve(
        quarantine_id, now=now, resolution=resolution, actor=actor, reason=reason
    )
    if resolved:
        return ResolveResult(id=quarantine_id, resolved_at=now, resolution=resolution)
    await quarantine_get(box, quarantine_id)  # 404 when it does not exist
    raise Conflict(f"quarantine entry {quarantine_id} is already resolved", code="resolved")


# -- numbers --------------------------------------------------------------------


async def stats(box: Runtime) -> StatsResponse:
    """The same snapshot ``/metrics`` exports, read now."""
    snapshot = await read_ops_stats(box.store, box.clock.now())
    return StatsResponse(**snapshot.summary())


async def unregistered_channels(box: Runtime) -> dict[str, int]:
    """Pending outbox rows by channel, for the channels this app never registers: no
    dispatcher of it delivers them (``ctx.outbox.add("email", …)`` without an
    ``email`` channel)."""
    from relaybox.outbound.registry import outbound

    snapshot = await read_ops_stats(box.store, box.clock.now())
    known = set(outbound(box).channels)
    stuck: dict[str, int] = {}
    for g in snapshot.groups:
        if g.queue == "outbox" and g.status == "pending" and g.source not in known:
            stuck[g.source] = stuck.get(g.source, 0) + g.count
    return stuck


async def throughput(box: Runtime, *, minutes: int = 60) -> list[dict[str, Any]]:
    """Deliveries accepted per minute over the last ``minutes``, by status now; every
    minute present (zeros included) so a chart has no gaps."""
    now = box.clock.now()
    first = int(now // 60) - minutes + 1
    rows = await box.store.operator.inbox_throughput(first * 60.0)
    buckets: list[dict[str, Any]] = [
        {"minute": first + i, "total": 0, "by_status": {}} for i in range(minutes)
    ]
    for r in rows:
        i = r.minute - first
        if 0 <= i < minutes:
            buckets[i]["total"] += r.count
            buckets[i]["by_status"][r.status] = r.count
    return buckets
