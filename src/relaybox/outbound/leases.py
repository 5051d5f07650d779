"""Leasing due outbox rows, lane by lane: one statement on PostgreSQL, one short
transaction on SQLite.

A *lane* is where a row goes: its endpoint (webhook rows) or its channel (rows from
``ctx.outbox.add``). Each lane has an in-flight cap and an optional rate limit (a
token bucket). One lease:

1. picks lanes that have due rows *and* room (in-flight below the cap, a token in the
   bucket), least recently served first, locking them (``SKIP LOCKED``) so that two
   dispatchers never lease one lane at once and overshoot its cap;
2. shares the free slots among those lanes round robin, one row each, then a second
   each, ..., a lane's cap bounded by the dispatcher's concurrency; a tenant's lanes
   take at most its rows (:class:`Fairness`: its share of the dispatcher's slots,
   minus what the dispatcher holds of it), and turns go tenant by tenant, so one
   tenant's many lanes never fill a lease while another tenant's rows wait;
3. leases that many rows per lane: owner, a fencing token incremented on every lease,
   the lease's end, one more attempt counted, ``uncertain`` when the row's previous
   lease expired without a recorded outcome;
4. debits the token buckets and sends the served lanes to the back of the queue;
5. loads what the channels need (message bodies, endpoints, active secrets).

A lane at capacity (a hanging endpoint) is never selected, so its backlog cannot
crowd out other lanes; its in-flight rows only hold their own slots until timeout.

On PostgreSQL the five steps are one autocommit statement (``outbox_lease`` in
``postgres_outbound.sql``, data-modifying CTEs, on the accept's asyncpg connections,
generic plans forced: with array parameters custom plans cost more backend CPU,
bench/README.md): one round trip per lease instead of eight. The same statement first
records the dispatcher's plain successes that finished meanwhile
(:func:`lease_recording`), so a finished attempt's slot is leased again without a
record round trip in between. ``allocate`` is done in SQL there (same round robin;
``tests/test_outbound_isolation.py`` checks both backends agree). One statement has
one snapshot: a lane that another lease served after it was taken is locked in its
new version but would be counted with the old in-flight rows, so such a lane (its
row version changed) is left for the next lease rather than overshoot its cap.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from relaybox.outbound import db
from relaybox.outbound.channels.base import Delivery, MessageBody, Target
from relaybox.outbound.registry import outbound
from relaybox.outbound.vault import SecretsLocked, Vault

if TYPE_CHECKING:
    from relaybox.app import Relaybox

__all__ = [
    "LEASE_MARGIN",
    "UNBOUNDED",
    "Fairness",
    "Lane",
    "allocate",
    "lease",
    "lease_recording",
    "release",
]

LEASE_MARGIN = 5.0
"""Seconds kept between the end of an attempt and the end of its lease, to record."""


@dataclass(frozen=True)
class Lane:
    lane: str
    max_in_flight: int
    rate_limit: float | None
    tokens: float
    refilled_at: float
    in_flight: int
    tenant: str | None = None
    """The endpoint's tenant; ``None`` for a channel's lane (no tenant bound)."""

    def room(self, now: float) -> tuple[int, float]:
        """(rows it may take now, tokens in its bucket now). The bucket holds at most
        one second of its rate (at least one token): bursts stay small."""
        room = self.max_in_flight - self.in_flight
        if self.rate_limit is None:
            return room, 1.0
        refill = (now - self.refilled_at) * self.rate_limit
        tokens = min(max(1.0, self.rate_limit), self.tokens + refill)
        return min(room, int(tokens)), tokens


@dataclass(frozen=True)
class Fairness:
    """What one lease may take per tenant and per lane: every lane's cap is at most
    ``cap`` (the dispatcher's concurrency), and one tenant's lanes take at most
    ``rows`` rows, or ``held[tenant]`` for a tenant listed there (what the dispatcher
    already holds of it counted; 0: none, its lanes are not even looked at)."""

    cap: int = 2**31 - 1
    rows: int = 2**31 - 1
    held: Mapping[str, int] = field(default_factory=dict)

    def full(self) -> list[str]:
        return sorted(t for t, n in self.held.items() if n <= 0)


UNBOUNDED = Fairness()


def allocate(
    lanes: Sequence[Lane], slots: int, now: float, fair: Fairness = UNBOUNDED
) -> dict[str, int]:
    """Share ``slots`` among ``lanes`` in order: one row per lane per round, within
    each lane's room; a tenant's turns are numbered over its lanes' rounds (at most
    ``fair``'s rows for it), and turns go tenant by tenant (``outbox_lease``'s plan)."""
    entries: list[tuple[int, int, int, str]] = []  # (turn, round, lane order, lane)
    turns: dict[tuple[str | None, str | None], int] = {}
    room = {lane.lane: min(lane.room(now)[0], fair.cap - lane.in_flight) for lane in lanes}
    most = max(room.values(), default=0)
    for rnd in range(1, most + 1):
        for order, lane in enumerate(lanes):
            if room[lane.lane] < rnd:
                continue
            group = (lane.tenant, None if lane.tenant is not None else lane.lane)
            turn = turns[group] = turns.get(group, 0) + 1
            if lane.tenant is not None and turn > fair.held.get(lane.tenant, fair.rows):
                continue
            entries.append((turn, rnd, order, lane.lane))
    entries.sort()
    plan: dict[str, int] = {}
    for _, _, _, name in entries[: max(slots, 0)]:
        plan[name] = plan.get(name, 0) + 1
    return plan


async def lease(
    box: Relaybox,
    *,
    owner: str,
    slots: int,
    channels: Sequence[str],
    lease_ttl: float,
    fair: Fairness = UNBOUNDED,
) -> list[Delivery]:
    """Lease up to ``slots`` due rows of the given channels; see the module docstring."""
    store = box.store
    now = box.clock.now()
    until = now + lease_ttl
    if store.backend == "postgres":
        found, _, _ = await _lease_postgres(
            box, owner, slots, channels, now, until, lease_ttl, (), (), 1, fair
        )
        return found
    async with store.transaction() as conn:
        lane_rows = await db.rows(
            conn,
            store,
            "outbox_lease_lanes",
            now,
            slots,
            db.array(store, channels),
            fair.cap,
            db.array(store, fair.full()),
        )
        lanes = [Lane(**dict(r)) for r in lane_rows]
        plan = allocate(lanes, slots, now, fair)
        if not plan:
            return []
        names = list(plan)
        leased = await db.rows(
            conn,
            store,
            "outbox_lease_rows",
            now,
            owner,
            until,
            db.array(store, names),
            db.array(store, [plan[n] for n in names]),
        )
        if not leased:
            return []
        taken = Counter(r["lane"] or r["channel"] for r in leased)
        served = [lane for lane in lanes if taken[lane.lane]]
        await db.execute(
            conn,
            store,
            "lane_mark",
            now,
            db.array(store, [lane.lane for lane in served]),
            db.array(store, [lane.room(now)[1] - taken[lane.lane] for lane in served]),
        )
        messages, endpoints = await _load(box, conn, leased, now)
    deadline = lease_ttl - LEASE_MARGIN
    return sorted(
        (
            _delivery(r, deadline, messages.get(r["message_id"]), endpoints.get(r["endpoint_id"]))
            for r in leased
        ),
        key=lambda d: d.id,
    )


def _delivery(
    r: Any, deadline: float, message: MessageBody | None, endpoint: Target | None
) -> Delivery:
    """A leased row as the channels take it (both backends' lease rows). Positional
    and without parsing a webhook row's payload (``null``: the body is the message's):
    this runs for every delivery."""
    payload = r["payload"]
    return Delivery(
        r["id"],
        r["channel"],
        r["key"],
        None if payload == "null" else json.loads(payload),
        r["tenant"],
        r["attempts"],
        r["lease_token"],
        bool(r["uncertain"]),
        deadline,
        message,
        endpoint,
        r["lane"] or r["channel"],
    )


async def lease_recording(
    box: Relaybox,
    *,
    owner: str,
    slots: int,
    channels: Sequence[str],
    lease_ttl: float,
    sent: Sequence[tuple[Any, ...]],
    ahead: Sequence[str] = (),
    factor: int = 1,
    fair: Fairness = UNBOUNDED,
) -> tuple[list[Delivery], set[tuple[int, int]], dict[str, int]]:
    """PostgreSQL: record the plain successes ``sent`` (rows of id, lease token,
    attempt, endpoint id, started, duration, status code, error, response) and lease
    up to ``slots`` due rows (none: only record), their slots included, in the one
    ``outbox_lease`` statement. Lanes of the channels ``ahead`` may be leased up to
    twice their cap while no other dispatcher holds leases in them. Returns the
    deliveries, the (id, lease token) pairs written (the others were fenced), and for
    each lane leased how many attempts this dispatcher may run in it at once (its cap
    minus the live leases other dispatchers held). ``fair`` bounds lanes' caps and
    each tenant's rows (:class:`Fairness`)."""
    now = box.clock.now()
    return await _lease_postgres(
        box, owner, slots, channels, now, now + lease_ttl, lease_ttl, sent, ahead, factor, fair
    )


async def release(box: Relaybox, deliveries: Sequence[Delivery]) -> None:
    """Give back leases never started (:func:`lease_recording`'s rows leased ahead):
    the rows are due again at once, as if never leased (``outbox_release``)."""
    store = box.store
    ids = [d.id for d in deliveries]
    tokens = [d.lease_token for d in deliveries]
    uncertain = [d.uncertain for d in deliveries]
    async with store.transaction() as conn:
        await db.execute(
            conn,
            store,
            "outbox_release",
            db.array(store, ids),
            db.array(store, tokens),
            db.array(store, uncertain),
        )


async def _lease_postgres(
    box: Relaybox,
    owner: str,
    slots: int,
    channels: Sequence[str],
    now: float,
    until: float,
    lease_ttl: float,
    sent: Sequence[tuple[Any, ...]],
    ahead: Sequence[str],
    factor: int,
    fair: Fairness,
) -> tuple[list[Delivery], set[tuple[int, int]], dict[str, int]]:
    """PostgreSQL: every step in one autocommit statement (``outbox_lease``): one round
    trip, no BEGIN / COMMIT."""
    store = box.store
    columns = [[row[i] for row in sent] for i in range(9)]
    tenants = list(fair.held)
    pool = await store.generic_pool()  # type: ignore[attr-defined]
    async with pool.acquire() as conn:
        leased = await conn.fetch(
            store.q["outbox_lease"],
            now,
            slots,
            list(channels),
            owner,
            until,
            *columns,
            list(ahead),
            factor,
            fair.cap,
            fair.rows,
            tenants,
            [fair.held[t] for t in tenants],
        )
    written: set[tuple[int, int]] = set()
    if leased and leased[0]["recorded"] is not None:
        written = set(zip(leased[0]["recorded"], leased[0]["tokens"], strict=True))
    allowed: dict[str, int] = {}
    deadline = lease_ttl - LEASE_MARGIN
    vault = outbound(box).vault
    # An endpoint's columns come with its first row (rows are in id order); None: the
    # endpoint no longer exists.
    targets: dict[str, Target | None] = {}
    deliveries = []
    for r in leased:
        if r["id"] is None:
            continue  # nothing leased: the one row carries what was recorded
        endpoint_id = r["endpoint_id"]
        target = None
        if endpoint_id is not None:
            if endpoint_id in targets:
                target = targets[endpoint_id]
            elif r["url"] is not None:
                schedule = r["schedule"]
                opened, locked = _open(vault, r["secrets"] or ())
                target = targets[endpoint_id] = Target(
                    id=endpoint_id,
                    tenant=r["endpoint_tenant"],
                    url=r["url"],
                    signature=r["signature"],
                    timeout=r["timeout"],
                    schedule=tuple(json.loads(schedule)) if schedule else None,
                    secrets=opened,
                    locked=locked,
                )
            else:
                targets[endpoint_id] = None
        message_id = r["message_id"]
        body = r["body"]
        message = (
            MessageBody(message_id, r["event_type"], body.encode())
            if message_id is not None and body is not None
            else None
        )
        delivery = _delivery(r, deadline, message, target)
        deliveries.append(delivery)
        allowed[delivery.lane] = r["allowed"]  # type: ignore[index]
    return deliveries, written, allowed


async def _load(
    box: Relaybox, conn: Any, leased: Sequence[Any], now: float
) -> tuple[dict[str, MessageBody], dict[str, Target]]:
    store = box.store
    message_ids = sorted({r["message_id"] for r in leased if r["message_id"]})
    endpoint_ids = sorted({r["endpoint_id"] for r in leased if r["endpoint_id"]})
    messages: dict[str, MessageBody] = {}
    endpoints: dict[str, Target] = {}
    if message_ids:
        for r in await db.rows(conn, store, "delivery_messages", db.array(store, message_ids)):
            messages[r["id"]] = MessageBody(r["id"], r["event_type"], r["body"].encode())
    if endpoint_ids:
        secrets: dict[str, list[str]] = {}
        for r in await db.rows(
            conn, store, "endpoint_secrets_active", db.array(store, endpoint_ids), now
        ):
            secrets.setdefault(r["endpoint_id"], []).append(r["secret"])
        vault = outbound(box).vault
        for r in await db.rows(conn, store, "delivery_endpoints", db.array(store, endpoint_ids)):
            opened, locked = _open(vault, secrets.get(r["id"], ()))
            endpoints[r["id"]] = Target(
                id=r["id"],
                tenant=r["tenant"],
                url=r["url"],
                signature=r["signature"],
                timeout=r["timeout"],
                schedule=tuple(json.loads(r["schedule"])) if r["schedule"] else None,
                secrets=opened,
                locked=locked,
            )
    return messages, endpoints


def _open(vault: Vault, stored: Sequence[str]) -> tuple[tuple[str, ...], str | None]:
    """An endpoint's secrets as stored, opened; or none and the reason (a sealed
    secret that no configured key opens: its deliveries retry, never unsigned)."""
    try:
        return tuple(vault.open(s) for s in stored), None
    except SecretsLocked as exc:
        return (), str(exc)
