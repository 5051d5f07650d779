"""Versioned projections: the current state of a resource, written only by a newer version.

Retries do not put events in order. History (each paid invoice grants
credits) is not affected: two invoices are two operations, each with its business
key. A *projection* of current state is: a late "active" must not overwrite a newer
"canceled". Deduplication cannot tell which one is current; an authoritative,
monotonic version from the provider can::

    @box.handler("billing", "subscription.*")
    async def subscription(ctx: Context) -> None:
        sub = ctx.payload["data"]
        if await ctx.project(f"subscription:{sub['id']}", sub["version"], sub):
            ...  # this event's state is now current: update your own tables

:func:`project` is one compare-and-set statement in the handler's transaction
(``INSERT … ON CONFLICT DO UPDATE … WHERE stored.version_key < new.version_key``), so
two workers racing on one resource cannot both win, and the state commits with the
inbox row's completion or not at all. A stale event is not an error: nothing is
written, its inbox row is marked ``superseded_by`` (``resource@stored_version``) in
the same transaction, and the row still completes.

Versions: the provider's monotonic version, read by the source's ``version_path``
(``header:X-Version`` or a dotted JSON path) into ``ctx.event.version``, or passed
explicitly. Arrival order and ordinary timestamps are never versions: with no
version, :func:`project` refuses (:class:`~relaybox.errors.PermanentError`); such
resources are kept current by :mod:`relaybox.inbound.reconcile` instead. Versions are
compared through an order (``order=``): ``"auto"`` (integers numerically, anything
else by code point), ``"integer"`` (refuses non-integers), ``"text"``, or any
function mapping a version to a key whose byte order is the version order.
"""

from __future__ import annotations

import json
import re
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import structlog
from prometheus_client import CollectorRegistry, Counter
from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox.errors import PermanentError
from relaybox.store.history import Projection, ProjectionWrite

if TYPE_CHECKING:
    from relaybox.inbound.worker import Context
    from relaybox.inbound.worker.context import Handling
    from relaybox.runtime import Runtime

__all__ = [
    "VERSION_ORDERS",
    "VersionOrder",
    "applied",
    "auto_order",
    "canonical_state",
    "counter",
    "current",
    "integer_order",
    "offer",
    "project",
    "refused",
    "text_order",
    "write",
]

log = structlog.get_logger("relaybox.projections")

VersionOrder = Callable[[str], str]
"""Maps a version to a text key; keys compare byte-wise in the database (``COLLATE
"C"`` on PostgreSQL, ``BINARY`` on SQLite) the way versions should."""

_INTEGER = re.compile(r"[+-]?[0-9]+")
_WIDTH = 4  # digits of the length prefix: integers of up to 9999 digits


def integer_order(version: str) -> str:
    """Integers in numeric order, whatever their size: ``"9" < "10"``.

    A length prefix makes longer (bigger) numbers sort after shorter ones; negative
    numbers sort first, with complemented digits so that -10 < -9.
    """
    text = version.strip()
    if not _INTEGER.fullmatch(text):
        raise ValueError(f"version {version!r} is not an integer")
    negative = text.startswith("-")
    digits = text.lstrip("+-").lstrip("0") or "0"
    if len(digits) >= 10**_WIDTH:
        raise ValueError("version has too many digits")
    if not negative or digits == "0":
        return f"B{len(digits):0{_WIDTH}d}{digits}"
    complement = digits.translate(str.maketrans("0123456789", "9876543210"))
    return f"A{10**_WIDTH - 1 - len(digits):0{_WIDTH}d}{complement}"


def text_order(version: str) -> str:
    """Versions compared as text, by code point (ISO dates of equal precision, ULIDs)."""
    return "T" + version


def auto_order(version: str) -> str:
    """Integers numerically; any other version as text, after every integer."""
    try:
        return integer_order(version)
    except ValueError:
        return text_order(version)


VERSION_ORDERS: dict[str, VersionOrder] = {
    "auto": auto_order,
    "integer": integer_order,
    "text": text_order,
}


def canonical_state(state: Any) -> str:
    """The stored form of a state: canonical JSON, so equal states compare equal
    (reconciliation counts a divergence when they do not)."""
    try:
        return json.dumps(
            state, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        raise PermanentError(f"projected state is not JSON: {exc}") from None


def _resolve_order(order: VersionOrder | str) -> VersionOrder:
    if callable(order):
        return order
    try:
        return VERSION_ORDERS[order]
    except KeyError:
        raise ValueError(
            f"unknown version order {order!r}; expected one of {', '.join(VERSION_ORDERS)}"
        ) from None


async def write(
    box: Runtime,
    conn: AsyncConnection,
    *,
    resource_key: str,
    origin: str,
    version: str,
    version_key: str,
    state_json: str,
    source: str | None,
    inbox_id: int | None,
) -> bool:
    """The compare-and-set shared by :func:`project` and reconciliation: write
    ``state_json`` if the resource is new or its stored ``version_key`` is lower.
    Returns whether it was written."""
    return await box.store.history.projection_upsert(
        conn,
        ProjectionWrite(
            resource_key=resource_key,
            origin=origin,
            version=version,
            version_key=version_key,
            state_json=state_json,
            source=source,
            inbox_id=inbox_id,
            updated_at=box.clock.now(),
        ),
    )


async def stored(box: Runtime, conn: AsyncConnection, resource_key: str) -> Projection | None:
    return await box.store.history.projection_get(conn, resource_key)


async def current(
    box: Runtime, resource_key: str, *, conn: AsyncConnection | None = None
) -> Projection | None:
    """The stored current state of ``resource_key`` (in ``conn``'s transaction if given)."""
    if conn is not None:
        return await stored(box, conn, resource_key)
    async with box.store.transaction() as own:
        return await stored(box, own, resource_key)


async def project(
    ctx: Context,
    resource_key: str,
    version: str | int | None,
    state: Any,
    *,
    order: VersionOrder | str = "auto",
) -> bool:
    """Make ``state`` the current state of ``resource_key`` if ``version`` is newer.

    Runs in the handler's transaction. Returns ``True`` when written (apply what
    depends on the new state), ``False`` when the stored version is newer (the
    event is *superseded*: its inbox row is marked, and still completes) or equal (a
    re-delivery or a replay of the event that is already current). ``version``
    defaults to ``ctx.event.version`` (the source's ``version_path``).
    """
    offered = offer(ctx, resource_key, version, state, order=order)
    store = ctx.box.store
    if await store.history.projection_upsert(ctx.conn, offered):
        return applied(ctx)
    winner = await store.history.projection_get(ctx.conn, resource_key)
    superseded = refused(ctx, offered, winner)
    if superseded is not None:
        await store.history.inbox_mark_superseded(ctx.conn, ctx.event.id, superseded)
    return False


def offer(
    ctx: Handling,
    resource_key: str,
    version: str | int | None,
    state: Any,
    *,
    order: VersionOrder | str = "auto",
) -> ProjectionWrite:
    """The write :func:`project` offers to the compare-and-set (either kind of
    handler): :class:`~relaybox.errors.PermanentError` without a usable version."""
    if version is None:
        version = ctx.event.version
    if version is None or isinstance(version, bool) or str(version).strip() == "":
        raise PermanentError(
            f"no version for {resource_key!r}: set the source's version_path, pass the "
            "provider's version, or keep this resource current with relaybox.inbound.reconcile"
        )
    text = str(version).strip()
    try:
        key = _resolve_order(order)(text)
    except ValueError as exc:
        raise PermanentError(f"version of {resource_key!r}: {exc}") from None
    box, event = ctx.box, ctx.event
    return ProjectionWrite(
        resource_key=resource_key,
        origin="event",
        version=text,
        version_key=key,
        state_json=canonical_state(state),
        source=event.source,
        inbox_id=event.id,
        updated_at=box.clock.now(),
    )


def applied(ctx: Handling) -> bool:
    """Count a written projection; :func:`project`'s answer (True)."""
    counter(ctx.box, "projection_writes").labels("applied").inc()
    return True


def refused(ctx: Handling, offered: ProjectionWrite, winner: Projection | None) -> str | None:
    """After the compare-and-set refused ``offered``: the ``superseded_by`` mark of the
    event's row (``resource@version``), or ``None`` when the stored version is the same
    (a re-delivery). :class:`~relaybox.errors.PermanentError` for a resource that
    reconciliation keeps current."""
    assert winner is not None  # the conflicting row exists and is locked by us
    resource_key, text = offered.resource_key, offered.version
    if winner.origin != "event":
        raise PermanentError(
            f"{resource_key!r} is kept current by reconciliation: it has no provider version"
        )
    event = ctx.event
    fields = {
        "inbox_id": event.id,
        "event_key": list(event.key),
        "resource_key": resource_key,
        "version": text,
        "current_version": winner.version,
    }
    writes = counter(ctx.box, "projection_writes")
    if winner.version_key == offered.version_key:
        writes.labels("current").inc()
        if canonical_state(winner.state) != offered.state_json:
            log.warning("projection_version_reused", **fields)
        return None
    writes.labels("superseded").inc()
    log.info("projection_superseded", **fields)
    return f"{resource_key}@{winner.version}"


# -- metrics ------------------------------------------------------------------------

_COUNTERS: dict[str, tuple[str, str, Sequence[str]]] = {
    "projection_writes": (
        "relaybox_projection_writes",
        "Projection writes by outcome: applied, superseded (stale version), current.",
        ("outcome",),
    ),
    "reconcile_outcomes": (
        "relaybox_reconcile_outcomes",
        "Reconciled resources by outcome: in_sync, repaired, superseded, failed.",
        ("source", "outcome"),
    ),
    "reconcile_divergences": (
        "relaybox_reconcile_divergences",
        "Resources whose stored state differed from the provider's, repaired.",
        ("source",),
    ),
    "recovered_deliveries": (
        "relaybox_recovered_deliveries",
        "Deliveries found missing by pull-based recovery, by action.",
        ("source", "action"),
    ),
}
_registered: weakref.WeakKeyDictionary[CollectorRegistry, dict[str, Counter]] = (
    weakref.WeakKeyDictionary()
)


def counter(box: Runtime, attr: str) -> Counter:
    """The ordering area's counter ``attr`` on ``box.metrics``: the attribute when
    :class:`~relaybox.metrics.Metrics` defines it, else one registered once on the
    box's own registry (so ``/metrics`` shows it and two boxes never collide)."""
    existing = getattr(box.metrics, attr, None)
    if isinstance(existing, Counter):
        return existing
    name, documentation, labels = _COUNTERS[attr]
    registry = box.metrics.registry
    made = _registered.setdefault(registry, {})
    if attr not in made:
        made[attr] = Counter(name, documentation, list(labels), registry=registry)
    return made[attr]
