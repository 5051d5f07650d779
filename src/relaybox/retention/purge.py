"""Retention: what relaybox forgets, when, and what it never forgets.

relaybox retains only what is necessary: a payload is needed while its event
can still run (pending), while an operator may still act on it (an undiscarded dead
letter, the original of an open quarantine entry), and for a while after it finished
(``retention.payload_max_age``, for replays and investigations). After that the purge
drops the **payload and headers** and keeps the rest:

* the event key and fingerprint, so a resend of a purged event is still answered as a
  duplicate (or quarantined), never processed again;
* status, outcome, attempts and errors, so the history stays readable;
* business keys (``relaybox_business_keys``: digests): kept for good unless a keys
  window (``retention.keys_max_age``, per source too) says otherwise. The readable
  row of a business key (``relaybox_operations``: the key, its fingerprint, the
  event) goes with its event's payload; the digest keeps deciding.

The keys windows also decide which keys tables have an index by day: only those whose
keys expire (:func:`expire_keys`, :mod:`relaybox.store.keys_index`).

The subject index (``relaybox_subjects``, :mod:`relaybox.erasure`) goes with what it
finds: each purge batch deletes the index rows of the rows it purged once nothing
found through them holds anything an erasure empties (an error text keeps them), and
so does the maintenance job after it drops inbox partitions.

A purged event cannot be replayed; :func:`relaybox.inbound.replay.replay` reports it apart and
the admin API answers 409 ``payload_purged`` naming the purge date.

The sending side has its own age (``retention.outbox_payload_max_age``):

* a delivery (``relaybox_outbox``) that finished — ``sent``, or ``dead`` — that long ago
  loses its payload (JSON ``null``, what webhook rows carry anyway) and the response
  bytes its attempts stored; status, attempts, errors and keys stay. Pending rows
  (leased or not) and ``held`` rows (waiting for a person) are never purged;
* a message (``relaybox_messages``) published that long ago loses its body once every
  delivery of it is purged (or it had none): the body is what a retry signs.

A purged delivery is never sent again: redeliver and recover skip it, and the admin
API answers 409 ``payload_purged`` for a purged message.

A tenant or a source may have ages of its own (:mod:`relaybox.retention.policy`: the
configuration's ``[retention.tenants.ID]`` and ``[retention.sources.NAME]``, and each
tenant's policy set through the admin API): every row is purged at its own age, in
passes whose number the distinct ages set, not the number of tenants.

The scheduled job (:class:`Maintenance`) also drops the rows of portal tokens ended
early (logouts, opened single-use links) once those tokens have expired anyway, and
replay-missing jobs that ended ``retention.outbox_payload_max_age`` ago, and
resumes the erasures (:mod:`relaybox.erasure`) still waiting for rows that were
pending. It
runs in the ``maintenance`` role (or ``relaybox maintenance``). With several
processes on one PostgreSQL, one runs it at a time: a session-level advisory lock
(``pg_try_advisory_lock``) on a connection of its own, released when the run ends or
when that connection dies with its process. SQLite has one process per database
file, and purging is idempotent anyway.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import structlog

from relaybox.clock import every
from relaybox.erasure import resume_waiting
from relaybox.retention.policy import (
    PurgePass,
    RetentionPolicies,
    ScanMarks,
    keys_plan,
    load_policies,
    plan,
)
from relaybox.store.history import PurgeTable
from relaybox.store.partitions import MaintainResult

if TYPE_CHECKING:
    from relaybox.runtime import Runtime
    from relaybox.store import Store

__all__ = [
    "Maintenance",
    "PurgeResult",
    "backfill_keys",
    "count_candidates",
    "cutoffs",
    "expire_keys",
    "maintain_partitions",
    "maintenance_lock",
    "purge",
]

TABLES: tuple[PurgeTable, ...] = ("inbox", "quarantine", "outbox", "messages")
"""What a purge empties, in its order: a message's body goes once its deliveries'
payloads went."""

log = structlog.get_logger("relaybox.retention")


@dataclass(frozen=True)
class PurgeResult:
    """What one purge did (or, with ``dry_run``, would do). ``cutoff`` and
    ``outbox_cutoff`` are the global ones; ``passes``: how many passes the purge
    made over the tables (four without ages per tenant or source)."""

    cutoff: float
    inbox: int
    quarantine: int
    dry_run: bool = False
    outbox_cutoff: float | None = None
    outbox: int = 0
    messages: int = 0
    passes: int = 4
    keys: int = 0
    """Keys forgotten by the keys windows (``retention.keys_max_age``, a source's or a
    tenant's; none by default). A dry run forgets none and reports 0."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def _policies(box: Runtime, older_than: float | None) -> RetentionPolicies:
    settings = box.settings.retention
    if older_than is not None:
        if older_than < 0:
            raise ValueError("older_than must not be negative")
        return RetentionPolicies(older_than, older_than)
    return await load_policies(box.store, settings)


async def count_candidates(
    box: Runtime, *, older_than: float | None = None
) -> dict[PurgeTable, int]:
    """What a purge now would drop, per table (``inbox``, ``quarantine``, ``outbox``,
    ``messages``): each row counted once, at its own age (or ``older_than`` for all).
    One grouped count per table and distinct age."""
    return await _count(box, await _policies(box, older_than))


async def _count(box: Runtime, policies: RetentionPolicies) -> dict[PurgeTable, int]:
    now = box.clock.now()
    store = box.store
    totals: dict[PurgeTable, int] = dict.fromkeys(TABLES, 0)
    for table in TABLES:
        if not policies.scoped:
            totals[table] = await store.history.retention_count(
                table, now - policies.ages(table).pop()
            )
            continue
        for age in sorted(policies.ages(table)):
            groups = await store.retention.count_groups(table, now - age)
            totals[table] += sum(
                n
                for (tenant, source), n in groups.items()
                if policies.age_of(table, tenant, source) == age
            )
    return totals


def cutoffs(box: Runtime, older_than: float | None = None) -> tuple[float, float]:
    """(inbox and quarantine, outbox and messages) global cutoffs of a purge now: each
    side's setting, or ``older_than`` for both. Tenants and sources with ages of their
    own have cutoffs of their own (:func:`relaybox.retention.policy.plan`)."""
    settings = box.settings.retention
    if older_than is not None and older_than < 0:
        raise ValueError("older_than must not be negative")
    now = box.clock.now()
    if older_than is not None:
        return now - older_than, now - older_than
    return now - settings.payload_max_age, now - settings.outbox_payload_max_age


async def _run_pass(
    store: Store,
    step: PurgePass,
    policies: RetentionPolicies,
    *,
    now: float,
    size: int,
    progress: Callable[[int], None] | None,
    marks: ScanMarks | None = None,
) -> int:
    """Run one pass to its end; how many rows it purged."""
    total = 0

    def tick(n: int) -> None:
        nonlocal total
        total += n
        if n and progress is not None:
            progress(n)

    table = step.table
    if step.kind == "all":
        while purged := await store.history.retention_purge_batch(
            table, cutoff=step.cutoff, now=now, limit=size
        ):
            tick(purged)
    elif step.kind == "tenants":
        while purged := await store.retention.purge_tenants(
            table, step.tenants, cutoff=step.cutoff, now=now, limit=size
        ):
            tick(purged)
    else:
        digest = policies.digest()
        start = None if marks is None else marks.start(table, step.source, digest)
        first_id: int | str = "" if table == "messages" else 0
        after: tuple[float, int | str] | None = None if start is None else (start, first_id)
        upto = step.cutoff
        while True:
            found = await store.retention.scan(
                table, cutoff=step.cutoff, after=after, limit=size, source=step.source
            )
            if not found:
                break
            # Each row at its own age: one whose tenant or source keeps it longer is
            # left (the cursor moves past it; its own pass purges it); a shorter
            # one's is past already.
            due = [c for c in found if c.at < now - policies.age_of(table, c.tenant, c.source)]
            purged = await store.retention.purge_ids(
                table, [c.id for c in due], cutoff=step.cutoff, now=now
            )
            if purged < len(due):  # one was held (or changed): the next scan rereads it
                upto = min(upto, due[0].at)
            tick(purged)
            if len(found) < size:
                break
            after = (found[-1].at, found[-1].id)
        if marks is not None:
            marks.done(table, step.source, digest, upto)
    return total


async def purge(
    box: Runtime,
    *,
    older_than: float | None = None,
    batch: int | None = None,
    dry_run: bool = False,
    progress: Callable[[int], None] | None = None,
    marks: ScanMarks | None = None,
) -> PurgeResult:
    """Drop payloads of rows that finished long enough ago: each row at its own age
    (its tenant's, its source's, else ``retention.payload_max_age`` for events and
    quarantine entries and ``retention.outbox_payload_max_age`` for deliveries and
    messages), or ``older_than`` seconds for all. ``batch`` rows per transaction so a
    large purge never holds locks for long; ``progress`` is called with the number of
    rows each batch purged. Interrupted, the next purge goes on where it stopped (a
    purged row is no candidate any more). ``marks``: where the previous purge of this
    process ended its scans (:class:`~relaybox.retention.policy.ScanMarks`; the
    maintenance loop keeps one)."""
    cutoff, outbox_cutoff = cutoffs(box, older_than)
    size = batch or box.settings.retention.batch
    policies = await _policies(box, older_than)
    if dry_run:
        counted = await _count(box, policies)
        return PurgeResult(
            cutoff,
            counted["inbox"],
            counted["quarantine"],
            True,
            outbox_cutoff,
            outbox=counted["outbox"],
            messages=counted["messages"],
            passes=len(plan(policies, box.clock.now())),
        )
    now = box.clock.now()
    # Partitioned tables (PostgreSQL) are not purged row by row: their partitions are
    # dropped whole (maintain_partitions).
    partitioned = {
        _PARTITIONED[t] for t in await box.store.partitions.tables() if t in _PARTITIONED
    }
    steps = [s for s in plan(policies, now) if s.table not in partitioned]
    totals: dict[PurgeTable, int] = dict.fromkeys(TABLES, 0)
    for step in steps:
        totals[step.table] += await _run_pass(
            box.store, step, policies, now=now, size=size, progress=progress, marks=marks
        )
    windows = policies if older_than is None else await _policies(box, None)
    expired = await expire_keys(box, windows, now=now, batch=size)
    result = PurgeResult(
        cutoff,
        totals["inbox"],
        totals["quarantine"],
        outbox_cutoff=outbox_cutoff,
        outbox=totals["outbox"],
        messages=totals["messages"],
        passes=len(steps),
        keys=expired,
    )
    box.metrics.observe_purge("inbox", result.inbox)
    box.metrics.observe_purge("quarantine", result.quarantine)
    box.metrics.observe_purge("outbox", result.outbox)
    box.metrics.observe_purge("messages", result.messages)
    log.info("purge", **result.as_dict())
    return result


async def expire_keys(box: Runtime, policies: RetentionPolicies, *, now: float, batch: int) -> int:
    """Forget the keys past their window (:func:`relaybox.retention.policy.keys_plan`:
    none unless a keys window is set), ``batch`` keys a transaction; how many.

    First each keys table's index by day is kept in step with the windows
    (:meth:`KeysStore.keep_day_indexes`): built where a window applies to the table
    (its expiry reads it), dropped where none does (keys kept for good need no index
    by day). A table whose index is not there after that (its build failed or timed
    out, or another process is building it) has no expiry this pass: it is never
    scanned without its index."""
    steps = keys_plan(policies, now)
    indexed = await box.store.keys.keep_day_indexes({step.kind for step in steps})
    # (SQLite keeps no outbox keys apart: no table, nothing to expire, nothing to skip.)
    waiting = sorted({step.kind for step in steps if not indexed.get(step.kind, True)})
    if waiting:
        log.warning("keys_expiry_skipped", kinds=waiting, reason="no index by day yet")
    total = 0
    for step in steps:
        if step.kind in waiting:
            continue
        total += await box.store.keys.expire(
            step.kind, step.before_day, scope=step.scope, keep=step.keep, limit=batch
        )
    if total:
        log.info("keys_expired", keys=total)
    return total


_PARTITIONED: dict[str, PurgeTable] = {
    "relaybox_inbox": "inbox",
    "relaybox_quarantine": "quarantine",
    "relaybox_outbox": "outbox",
    "relaybox_messages": "messages",
}
_SENDING = ("relaybox_outbox", "relaybox_outbox_attempts", "relaybox_messages")


async def maintain_partitions(
    box: Runtime, *, before_drop: Callable[[str, str], Any] | None = None
) -> MaintainResult:
    """PostgreSQL's time partitions (:mod:`relaybox.store.partitions`): partitions made
    ``retention.partitions_ahead`` periods ahead, and each partition dropped whole once
    nothing in it must stay (pending events, undiscarded dead letters, originals of open
    quarantine entries; deliveries pending, held or leased, messages with a delivery
    still live) and every row in it is past the age of its tenant or source (a
    delivery's and a message's: ``outbox_payload_max_age`` of its tenant); after a
    drop, the subject index's rows of the dropped events and messages go too
    (:meth:`~relaybox.store.erasure.ErasureStore.forget_dropped`,
    :meth:`~relaybox.store.erasure.ErasureStore.forget_dropped_messages`). Nothing happens
    while the tables are not partitioned (and on SQLite)."""
    settings = box.settings.retention
    policies = await load_policies(box.store, settings)

    def ages(table: str, tenant: str | None, source: str | None) -> float:
        if table in _SENDING:
            return policies.outbound_age(tenant)
        return policies.inbound_age(tenant, source)

    def shortest(table: str) -> float:
        return min(policies.ages("outbox" if table in _SENDING else "inbox"))

    period = "day" if settings.partitions == "off" else settings.partitions
    result = await box.store.partitions.maintain(
        period,
        ahead=settings.partitions_ahead,
        drop=(box.clock.now(), ages, shortest),
        before_drop=before_drop,
    )
    if any(name.startswith("relaybox_inbox_p") for name in result.dropped):
        # The subject index's rows of the dropped events (and their quarantine
        # entries), but those a handler's row still needs.
        forgotten = await box.store.erasure.forget_dropped(limit=settings.batch)
        if forgotten:
            log.info("subjects_forgotten", rows=forgotten)
    if any(name.startswith("relaybox_messages_p") for name in result.dropped):
        # The subject index's rows of the dropped messages, but those whose deliveries
        # still hold data.
        forgotten = await box.store.erasure.forget_dropped_messages(limit=settings.batch)
        if forgotten:
            log.info("subjects_forgotten", rows=forgotten)
    return result


async def backfill_keys(
    box: Runtime,
    *,
    batch: int | None = None,
    max_batches: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Copy the keys of rows stored before migrations 0027 (events, messages) and 0031
    (business keys) into the keys tables
    (:meth:`KeysStore.backfill`), ``batch`` rows a transaction (default
    ``retention.batch``), each kind until it has finished or ``max_batches`` batches
    ran (the maintenance job runs at most a few a pass; ``relaybox migrate`` runs them
    all). Resumable: the position is kept in the database. Returns the rows read. Until
    it has finished the accept copies an old row's key itself when one comes again."""
    size = batch or box.settings.retention.batch
    total = 0
    for kind in ("event", "message", "operation", "outbox"):
        runs = 0
        while max_batches is None or runs < max_batches:
            state = await box.store.keys.backfill(kind, limit=size)
            runs += 1
            total += state.read
            if progress is not None and state.read:
                progress(state.read)
            if state.finished:
                break
    if total:
        log.info("keys_backfilled", rows=total)
    return total


_BACKFILL_BATCHES_A_PASS = 10
"""Batches of the keys backfill (``retention.batch`` rows each, per kind) one
maintenance pass runs: the rest waits for the next pass, or ``relaybox migrate``."""


def maintenance_lock(store: Store) -> AbstractAsyncContextManager[bool]:
    """Yield whether this process is the maintenance runner now (see
    :meth:`Backend.maintenance_try_lock`: an advisory lock on PostgreSQL, always this
    process's on SQLite)."""
    return store.db.maintenance_try_lock()


class Maintenance:
    """The scheduled maintenance loop: every ``retention.interval`` seconds, if no
    other process holds the maintenance lock, purge. Same shape as the worker:
    ``run()`` until :meth:`stop`, ``run_once()`` for one pass (tests)."""

    def __init__(self, box: Runtime, *, interval: float | None = None) -> None:
        self.box = box
        self.interval = interval or box.settings.retention.interval
        self.marks = ScanMarks()  # where this loop's scans ended (ScanMarks)
        self._stopping = asyncio.Event()

    def stop(self) -> None:
        self._stopping.set()

    async def run_once(self) -> PurgeResult | None:
        """One pass; ``None`` when another process holds the lock (it is purging)."""
        async with maintenance_lock(self.box.store) as mine:
            if not mine:
                log.info("maintenance_skipped", reason="another process holds the lock")
                return None
            result = await purge(self.box, marks=self.marks)
            # Portal sessions logged out of and single-use links opened: each row was
            # written to expire a minute after its token would have anyway.
            tokens = await self.box.store.sessions.portal_tokens_purge(self.box.clock.now())
            if tokens:
                log.info("portal_tokens_purged", rows=tokens)
            # Replay-missing jobs that ended as long ago as a message's body is kept.
            store, settings = self.box.store, self.box.settings.retention
            before = self.box.clock.now() - settings.outbox_payload_max_age
            jobs = 0
            while purged := await store.flow.replay_jobs_purge(before, limit=settings.batch):
                jobs += purged
            if jobs:
                log.info("replay_jobs_purged", rows=jobs)
            # Waiting deliveries of disabled endpoints that disabling left to a
            # dispatcher (in flight then) or never saw (a publish committing meanwhile):
            # dead letters, as the others became (OutboxStore.delivery_sweep_disabled).
            strays = 0
            while True:
                killed = await store.outbox.delivery_sweep_disabled(
                    now=self.box.clock.now(), limit=settings.batch
                )
                strays += killed
                if killed < settings.batch:
                    break
            if strays:
                log.info("disabled_endpoint_deliveries_dead", rows=strays)
            # Erasures waiting for rows that were pending: emptied once they finished.
            await resume_waiting(self.box)
            # Time partitions (PostgreSQL, once converted): made ahead, dropped whole.
            await maintain_partitions(self.box)
            # Keys of rows stored before migration 0027, a few batches a pass.
            await backfill_keys(self.box, max_batches=_BACKFILL_BATCHES_A_PASS)
            return result

    async def run(self) -> None:
        if not self.box.settings.retention.enabled:
            log.info("maintenance_disabled", setting="retention.enabled")
            await self._stopping.wait()
            return
        await every(
            self.interval, self._stopping, self.run_once, logger=log, failed="maintenance_failed"
        )
