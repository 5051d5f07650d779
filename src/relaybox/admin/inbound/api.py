"""The receiving side's admin API operations: inbox events and their history,
replay (one event or a selection), dead letters (retry, retry many, discard),
quarantine (read, resolve) and the queue numbers. Each calls one use case of
:mod:`relaybox.ops.inbound`, as the dashboard's :mod:`relaybox.admin.inbound.pages`
and the CLI do."""

from __future__ import annotations

from pydantic import BaseModel

from relaybox.admin.sections import Call, Operation
from relaybox.ops import inbound as ops
from relaybox.ops import inbound_models as m

__all__ = ["DEAD_OPERATIONS", "INBOX_OPERATIONS", "QUARANTINE_OPERATIONS", "STATS_OPERATIONS"]


async def _inbox_list(c: Call) -> BaseModel:
    return await ops.inbox_list(c.box, c.query)


async def _inbox_get(c: Call) -> BaseModel:
    return await ops.event_get(c.box, c.path["id"])


async def _inbox_replay(c: Call) -> BaseModel:
    return await ops.replay_event(c.box, c.path["id"], actor=c.actor, reason=c.body.reason)


async def _replay_many(c: Call) -> BaseModel:
    b: m.ReplaySelectionRequest = c.body
    return await ops.replay_selection(
        c.box,
        source=b.source,
        since=b.since,
        until=b.until,
        statuses=b.statuses,
        limit=b.limit,
        actor=c.actor,
        reason=b.reason,
        include_discarded=b.include_discarded,
    )


async def _dead_list(c: Call) -> BaseModel:
    return await ops.dead_list(c.box, c.query)


async def _dead_retry(c: Call) -> BaseModel:
    return await ops.dead_retry(c.box, c.path["id"], actor=c.actor, reason=c.body.reason)


async def _dead_retry_many(c: Call) -> BaseModel:
    return await ops.dead_retry_many(c.box, c.body, actor=c.actor)


async def _dead_discard(c: Call) -> BaseModel:
    return await ops.dead_discard(c.box, c.path["id"], actor=c.actor, reason=c.body.reason)


async def _quarantine_list(c: Call) -> BaseModel:
    return await ops.quarantine_list(c.box, c.query)


async def _quarantine_get(c: Call) -> BaseModel:
    return await ops.quarantine_get(c.box, c.path["id"])


async def _quarantine_resolve(c: Call) -> BaseModel:
    b: m.ResolveRequest = c.body
    return await ops.quarantine_resolve(
        c.box, c.path["id"], resolution=b.resolution, actor=c.actor, reason=b.reason
    )


async def _stats(c: Call) -> BaseModel:
    return await ops.stats(c.box)


INBOX_OPERATIONS = (
    Operation(
        "GET",
        "/inbox",
        "listInboxEvents",
        "List inbox events, newest first",
        _inbox_list,
        m.EventPage,
        query=m.InboxFilter,
        errors=(400,),
        description="Filter by source, type, status, tenant and receipt time; follow "
        "next_cursor for the next page.",
    ),
    Operation(
        "GET",
        "/inbox/{id}",
        "getInboxEvent",
        "One event with its attempts, errors, business keys, outbox rows and replays",
        _inbox_get,
        m.EventDetail,
        errors=(404,),
    ),
    Operation(
        "POST",
        "/inbox/{id}/replay",
        "replayInboxEvent",
        "Run a finished event through its handler again",
        _inbox_replay,
        m.ReplayResult,
        body=m.ReplayRequest,
        errors=(400, 404, 409),
        description="Business keys still hold, so a replay never repeats an operation. "
        "409 payload_purged when retention dropped the payload.",
    ),
    Operation(
        "POST",
        "/replay",
        "replayEvents",
        "Replay finished events matching a selection",
        _replay_many,
        m.ReplayResult,
        body=m.ReplaySelectionRequest,
        errors=(400,),
    ),
)

DEAD_OPERATIONS = (
    Operation(
        "GET",
        "/dead",
        "listDeadLetters",
        "Dead letters waiting for an operator",
        _dead_list,
        m.EventPage,
        query=m.DeadFilter,
        errors=(400,),
    ),
    Operation(
        "POST",
        "/dead/{id}/retry",
        "retryDeadLetter",
        "Retry one dead letter",
        _dead_retry,
        m.ReplayResult,
        body=m.ReplayRequest,
        errors=(400, 404, 409),
    ),
    Operation(
        "POST",
        "/dead/retry",
        "retryDeadLetters",
        "Retry every dead letter matching a filter",
        _dead_retry_many,
        m.DeadRetryResult,
        body=m.DeadRetryRequest,
        errors=(400,),
    ),
    Operation(
        "POST",
        "/dead/{id}/discard",
        "discardDeadLetter",
        "Take a dead letter out of the queue, with a reason",
        _dead_discard,
        m.DiscardResult,
        body=m.DiscardRequest,
        errors=(400, 404, 409),
    ),
)

QUARANTINE_OPERATIONS = (
    Operation(
        "GET",
        "/quarantine",
        "listQuarantine",
        "Deliveries that reused an event id",
        _quarantine_list,
        m.QuarantinePage,
        query=m.QuarantineFilter,
        errors=(400,),
    ),
    Operation(
        "GET",
        "/quarantine/{id}",
        "getQuarantineEntry",
        "A quarantined delivery next to the original, with their differences",
        _quarantine_get,
        m.QuarantineDetail,
        errors=(404,),
    ),
    Operation(
        "POST",
        "/quarantine/{id}/resolve",
        "resolveQuarantineEntry",
        "Record the operator's decision on a quarantined delivery",
        _quarantine_resolve,
        m.ResolveResult,
        body=m.ResolveRequest,
        errors=(400, 404, 409),
    ),
)

STATS_OPERATIONS = (
    Operation(
        "GET",
        "/stats",
        "getStats",
        "Queue numbers (the same as /metrics and the overview)",
        _stats,
        m.StatsResponse,
    ),
)
