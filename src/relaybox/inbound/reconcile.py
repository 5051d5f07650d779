"""Reconciliation: keep a resource's current state from the provider itself.

When the provider sends no authoritative version, neither arrival order nor an
ordinary timestamp says which event is current. Instead the current state
is read from the provider's API through a user-supplied ``fetch(resource_id)`` and
written through the same compare-and-set as versioned projections
(:func:`relaybox.inbound.projections.write`), so the projection table holds one current state
per resource whichever path wrote it::

    async def fetch_subscription(sub_id: str) -> dict | None:
        return await billing_api.get(f"/subscriptions/{sub_id}")   # None: gone

    reconciler = reconcile.register(box, "billing", fetch_subscription, apply=update_mine)

    @box.handler("billing", "subscription.updated")
    async def on_update(ctx):                      # no version in the payload
        await reconcile.request(ctx, ctx.payload["id"])   # in the handler's transaction

    # later, from a schedule or `relaybox reconcile --source billing --requested`
    await reconciler.run(requested=True)

**Coordinating the read-and-write cycle per resource: a fetch ticket, not a lock.**
Each reconciliation takes a ticket first, in its own short transaction (a per-resource
counter, ``issued + 1``), then calls the provider with no transaction open, then
writes the answer with the ticket as its version: the compare-and-set keeps a write
only if no later ticket has already written. A read that started later therefore
always beats one that started earlier, whichever returns last. A per-resource lock
would do the same by holding a lock (a transaction or a lease with expiry and
fencing) across a remote call of unbounded length; no remote call runs inside a
transaction, and on SQLite such a lock would stop every other writer. A
ticket costs nothing when a reconciler dies mid-fetch (the ticket is just never used)
and never makes one reconciler wait for another's network call. The price: when two
reads overlap, the later ticket's answer is kept even if the other read reached the
provider later; any change after that read arrives as a new event and a new ticket.

The write phase (read stored state, compare, write, ``apply``) runs in one short
transaction that locks the resource's ticket row, so the divergence count is exact.
A divergence (stored state ≠ provider state, including "never stored") is counted on
``relaybox_reconcile_divergences{source}``, logged as ``reconcile_divergence`` with
the resource key, and repaired by that same write; ``apply(conn, resource_id, state)``
updates the application's own tables in the same transaction.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox import tracing
from relaybox.inbound.projections import canonical_state, counter, integer_order, stored, write

if TYPE_CHECKING:
    from relaybox.inbound.worker import Context
    from relaybox.runtime import Runtime

__all__ = [
    "Apply",
    "Fetch",
    "Reconciler",
    "Report",
    "Result",
    "reconciler_for",
    "register",
    "request",
]

log = structlog.get_logger("relaybox.reconcile")

Fetch = Callable[[str], Awaitable[Any]]
"""``fetch(resource_id)`` → the provider's current state (JSON-serialisable; ``None``
when the provider has no such resource). Raise to report a failed read."""

Apply = Callable[[AsyncConnection, str, Any], Awaitable[None]]
"""``apply(conn, resource_id, state)``: repair the application's own tables, in the
transaction that writes the reconciled state. Called only when the state changed."""

ListResources = Callable[[], Awaitable[Iterable[str]]]


@dataclass(frozen=True)
class Result:
    """What one reconciliation did. ``outcome``: ``in_sync`` (stored = provider),
    ``repaired`` (a divergence, written), ``superseded`` (a later ticket wrote first:
    this older read was dropped), ``failed`` (the fetch or the write raised)."""

    resource_id: str
    resource_key: str
    outcome: str
    ticket: int | None = None
    error: str | None = None


@dataclass
class Report:
    results: list[Result] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out = {"in_sync": 0, "repaired": 0, "superseded": 0, "failed": 0}
        for r in self.results:
            out[r.outcome] += 1
        return out

    @property
    def failed(self) -> list[Result]:
        return [r for r in self.results if r.outcome == "failed"]

    def as_dict(self) -> dict[str, Any]:
        return {
            "checked": len(self.results),
            **self.counts(),
            "divergences": [r.resource_key for r in self.results if r.outcome == "repaired"],
            "failures": {r.resource_key: r.error for r in self.failed},
        }


class Reconciler:
    """Reconciles the resources of one source. Resource keys are ``{source}:{id}``
    unless ``key`` says otherwise; keep them apart from keys that handlers project
    with provider versions (a resource has one kind of version or the other)."""

    def __init__(
        self,
        box: Runtime,
        source: str,
        fetch: Fetch,
        *,
        apply: Apply | None = None,
        list_resources: ListResources | None = None,
        key: Callable[[str], str] | None = None,
        concurrency: int = 4,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.box = box
        self.source = source
        self.fetch = fetch
        self.apply = apply
        self.list_resources = list_resources
        self.key = key or (lambda resource_id: f"{source}:{resource_id}")
        self.concurrency = concurrency

    async def reconcile(self, resource_id: str) -> Result:
        """Ticket, fetch, compare-and-set write. Never raises: a failure is a result.
        Traced as ``relaybox.inbound.reconcile`` with its outcome."""
        with tracing.span(
            "relaybox.reconcile", attributes={"relaybox.source": self.source}
        ) as span:
            result = await self._reconcile(resource_id)
            if span.is_recording():
                span.set_attribute("relaybox.reconcile.outcome", result.outcome)
            return result

    async def _reconcile(self, resource_id: str) -> Result:
        box, store = self.box, self.box.store
        resource_key = self.key(resource_id)
        outcomes = counter(box, "reconcile_outcomes")
        ticket: int | None = None
        try:
            taken = await store.history.reconcile_ticket_take(self.source, resource_id)
            ticket, requested_seen = taken.ticket, taken.requested_seen
            state = await self.fetch(resource_id)
            state_json = canonical_state(state)
            async with store.transaction() as conn:
                await store.history.reconcile_lock(conn, self.source, resource_id)
                before = await stored(box, conn, resource_key)
                if before is not None and before.origin != "reconcile":
                    raise RuntimeError(
                        f"{resource_key!r} is projected with provider versions: "
                        "reconcile a different key"
                    )
                # Written even when in sync: the ticket must land, or an older read
                # returning later would compare against an older ticket and win.
                written = await write(
                    box,
                    conn,
                    resource_key=resource_key,
                    origin="reconcile",
                    version=str(ticket),
                    version_key=integer_order(str(ticket)),
                    state_json=state_json,
                    source=self.source,
                    inbox_id=None,
                )
                before_json = None if before is None else canonical_state(before.state)
                diverged = written and before_json != state_json
                if diverged and self.apply is not None:
                    await self.apply(conn, resource_id, state)
                await store.history.reconcile_done(
                    conn,
                    self.source,
                    resource_id,
                    requested_seen=requested_seen,
                    now=box.clock.now(),
                    diverged=diverged,
                )
        except Exception as exc:
            outcomes.labels(self.source, "failed").inc()
            error = f"{type(exc).__name__}: {str(exc)[:300]}"
            log.error(
                "reconcile_failed",
                source=self.source,
                resource_key=resource_key,
                ticket=ticket,
                error=error,
            )
            return Result(resource_id, resource_key, "failed", ticket, error)
        if not written:
            outcome = "superseded"
            log.info(
                "reconcile_superseded",
                source=self.source,
                resource_key=resource_key,
                ticket=ticket,
                current_ticket=None if before is None else before.version,
            )
        elif diverged:
            outcome = "repaired"
            counter(box, "reconcile_divergences").labels(self.source).inc()
            log.warning(
                "reconcile_divergence",
                source=self.source,
                resource_key=resource_key,
                stored_version=None if before is None else before.version,
                stored="absent" if before is None else "different",
                ticket=ticket,
            )
        else:
            outcome = "in_sync"
        outcomes.labels(self.source, outcome).inc()
        return Result(resource_id, resource_key, outcome, ticket)

    async def known(self, *, requested: bool = False, limit: int = 100_000) -> list[str]:
        """Resource ids reconciled or requested before (``requested``: only those with
        a request not yet served)."""
        return await self.box.store.history.reconcile_ids(
            self.source, requested=requested, limit=limit
        )

    async def run(
        self,
        resource_ids: Iterable[str] | None = None,
        *,
        every: bool = False,
        requested: bool = False,
        on_result: Callable[[Result], None] | None = None,
    ) -> Report:
        """Reconcile the given ids, or every resource (``every``: the
        ``list_resources`` function if any, else every resource reconciled before), or
        those requested by handlers. At most ``concurrency`` fetches at once."""
        ids: list[str] = list(resource_ids or ())
        if every:
            if self.list_resources is not None:
                ids += list(await self.list_resources())
            else:
                ids += await self.known()
        if requested:
            ids += await self.known(requested=True)
        ids = list(dict.fromkeys(ids))
        gate = asyncio.Semaphore(self.concurrency)
        report = Report()

        async def one(resource_id: str) -> None:
            async with gate:
                result = await self.reconcile(resource_id)
            report.results.append(result)
            if on_result is not None:
                on_result(result)

        await asyncio.gather(*(one(i) for i in ids))
        position = {resource_id: i for i, resource_id in enumerate(ids)}
        report.results.sort(key=lambda r: position[r.resource_id])
        return report


_reconcilers: weakref.WeakKeyDictionary[Runtime, dict[str, Reconciler]] = (
    weakref.WeakKeyDictionary()
)


def register(box: Runtime, source: str, fetch: Fetch, **options: Any) -> Reconciler:
    """Declare how to fetch ``source``'s resources; ``relaybox reconcile --source``
    finds it on the box named by ``--app``. ``options``: see :class:`Reconciler`."""
    reconciler = Reconciler(box, source, fetch, **options)
    _reconcilers.setdefault(box, {})[source] = reconciler
    return reconciler


def reconciler_for(box: Runtime, source: str) -> Reconciler | None:
    return _reconcilers.get(box, {}).get(source)


async def request(ctx: Context, resource_id: str, *, source: str | None = None) -> None:
    """Ask for ``resource_id`` to be reconciled, in the handler's transaction: no
    remote call there. Served by :meth:`Reconciler.run` with ``requested=True``;
    a request made while a fetch is in flight stays pending for the next run."""
    await ctx.box.store.history.reconcile_request(ctx.conn, source or ctx.event.source, resource_id)
