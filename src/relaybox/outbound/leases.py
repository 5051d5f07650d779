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

Leases take the database's clock (:class:`relaybox.clock.DatabaseClock`), so
dispatchers on hosts whose clocks disagree agree on when a lease ends; a host whose
clock is past ``clock_max_skew`` leases nothing.

On PostgreSQL the five steps are one autocommit statement (``outbox_lease`` in
``postgres_outbound.sql``, data-modifying CTEs, on the accept's asyncpg connections,
generic plans forced: with array parameters custom plans cost more backend CPU,
bench/README.md): one round trip per lease instead of eight. The same statement first
records the dispatcher's plain successes that finished meanwhile
(:func:`lease_recording`), so a finished attempt's slot is leased again without a
record round trip in between. ``allocate`` is done in SQL there (same round robin;
``tests/integration/test_outbound_isolation.py`` checks both backends agree). One statement has
one snapshot: a lane that another lease served after it was taken is locked in its
new version but would be counted with the old in-flight rows, so such a lane (its
row version changed) is left for the next lease rather than overshoot its cap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from relaybox import tracing
from relaybox.clock import may_take_work
from relaybox.outbound.registry import outbound
from relaybox.outbound.vault import SecretsLocked
from relaybox.store.dispatch_rows import UNBOUNDED, Attempt, Fairness, Leased, LeaseRequest
from relaybox.store.outbox_rows import Delivery, SecretOpener

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = [
    "LEASE_MARGIN",
    "UNBOUNDED",
    "lease",
    "lease_recording",
    "release",
]

LEASE_MARGIN = 5.0
"""Seconds kept between the end of an attempt and the end of its lease, to record."""


async def lease(
    box: Runtime,
    *,
    owner: str,
    slots: int,
    channels: Sequence[str],
    lease_ttl: float,
    fair: Fairness = UNBOUNDED,
) -> list[Delivery]:
    """Lease up to ``slots`` due rows of the given channels; see the module docstring.
    None while this host's clock is past ``clock_max_skew`` (:class:`ClockGuard`)."""
    if not await may_take_work(box):
        return []
    leased = await _take(
        box, owner=owner, slots=slots, channels=channels, lease_ttl=lease_ttl, fair=fair
    )
    return leased.deliveries


async def _take(
    box: Runtime,
    *,
    owner: str,
    slots: int,
    channels: Sequence[str],
    lease_ttl: float,
    fair: Fairness,
    sent: Sequence[Attempt] = (),
    ahead: Sequence[str] = (),
    factor: int = 1,
) -> Leased:
    """One :class:`LeaseRequest` through the store, from now until ``lease_ttl`` is
    over, in a ``relaybox.lease`` span when it took rows."""
    now = box.clock.now()
    request = LeaseRequest(
        owner=owner,
        slots=slots,
        channels=channels,
        now=now,
        until=now + lease_ttl,
        deadline=lease_ttl - LEASE_MARGIN,
        fair=fair,
        sent=sent,
        ahead=ahead,
        factor=factor,
    )
    began = tracing.now_ns() if tracing.enabled() else 0
    leased = await box.store.outbox_lease(request, _opener(box))
    if began and leased.deliveries:
        _traced(began, owner, leased.deliveries)
    return leased


def _traced(began: int, owner: str, deliveries: Sequence[Delivery]) -> None:
    """A ``relaybox.lease`` span for a lease that took rows, linked to their messages'
    contexts."""
    tracing.record(
        "relaybox.lease",
        began,
        {"relaybox.leased": len(deliveries), "relaybox.dispatcher": owner},
        (d.message.traceparent for d in deliveries if d.message is not None),
    )


async def lease_recording(
    box: Runtime,
    *,
    owner: str,
    slots: int,
    channels: Sequence[str],
    lease_ttl: float,
    sent: Sequence[Attempt],
    ahead: Sequence[str] = (),
    factor: int = 1,
    fair: Fairness = UNBOUNDED,
) -> tuple[list[Delivery], set[tuple[int, int]], dict[str, int]]:
    """A store that records with its lease (:attr:`Store.lease_records`, PostgreSQL):
    record the plain successes ``sent`` (``owner``'s attempts) and lease up to
    ``slots`` due rows (none: only record), their slots included, in one statement.
    Lanes of the channels ``ahead`` may be leased up to ``factor`` times their cap
    while no other dispatcher holds leases in them. Returns the deliveries, the (id,
    lease token) pairs written (the others were fenced), and for each lane leased how
    many attempts this dispatcher may run in it at once (its cap minus the live leases
    other dispatchers held). ``fair`` bounds lanes' caps and each tenant's rows (:class:`Fairness`).
    While this host's clock is past ``clock_max_skew`` (:class:`ClockGuard`) it only
    records ``sent``."""
    if not await may_take_work(box):
        slots = 0
    leased = await _take(
        box,
        owner=owner,
        slots=slots,
        channels=channels,
        lease_ttl=lease_ttl,
        fair=fair,
        sent=sent,
        ahead=ahead,
        factor=factor,
    )
    return leased.deliveries, leased.written, leased.allowed


async def release(box: Runtime, deliveries: Sequence[Delivery]) -> None:
    """Give back leases never started (:func:`lease_recording`'s rows leased ahead):
    the rows are due again at once, as if never leased (``outbox_release``)."""
    await box.store.outbox_release(deliveries)


def _opener(box: Runtime) -> SecretOpener:
    vault = outbound(box).vault

    def open_secrets(stored: Sequence[str]) -> tuple[tuple[str, ...], str | None]:
        """An endpoint's secrets as stored, opened; or none and the reason (a sealed
        secret that no configured key opens: its deliveries retry, never unsigned)."""
        try:
            return tuple(vault.open(s) for s in stored), None
        except SecretsLocked as exc:
            return (), str(exc)

    return open_secrets
