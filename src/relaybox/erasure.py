"""Erasing one subject: a data-protection request, carried out in relaybox's tables.

An erasure names a **subject** (a customer id, an e-mail address: whatever a source's
``subject`` path or a publish's ``subject`` names) or a **tenant**, and empties every
payload, header, attempt body, response excerpt and error text relaybox holds of it:

* inbox events a source indexed under the subject at accept (``subject =
  "data.object.customer"`` in ``[sources.NAME]``), the quarantine entries stored
  under their event keys, and the rows their handlers added to the outbox (with what
  the channel's receiver answered);
* messages published with the subject (``box.publish(..., subject=...)``, or the value
  at the event type's subject path), or to the tenant, their deliveries, and what the
  receivers answered to those deliveries;
* the error text of all those rows (``last_error``, each handler and delivery
  attempt's error become ``(erased)``: an exception may quote the payload), and the
  operational events about them (``relaybox.inbox.dead`` and the like quote it);
* the state of each versioned projection (``ctx.project``) an event of the subject
  wrote (stored with that event's subject digest), or an event of the tenant: the
  state becomes ``NULL``, the version stays (an older event is still refused).

What stays: event keys, fingerprints, statuses, outcomes, dead-letter reasons (codes),
attempt counts and business keys. A resend of an erased event is still answered as a
duplicate (and a changed payload under its id still quarantined); a publish repeating
an idempotency key still finds its message. An erased event cannot be replayed, an
erased delivery is never sent again (both are purged rows to every reader, and say
``erased``).

The index (``relaybox_subjects``) holds the SHA-256 of the subject, never the subject,
written in the transaction of the accept or the publish, so an erasure reads the
subject's rows without scanning history. It lives as long as what it finds: the
purge, an erasure and a dropped partition delete the index rows of the rows they
emptied once nothing found through them holds anything to erase
(:func:`relaybox.store.erasure.forget_subjects`). The erasure itself is recorded
(``relaybox_erasures``: who, when, what, how many rows of each kind) with the digest,
not the subject.

Rows that are **pending** (an event not yet handled, a delivery not yet sent) still
need their payload: an erasure leaves them, records how many it waits for, and empties
them once they finish. So do rows a worker or a dispatcher holds right now: an erasure
neither interrupts nor waits for them (PostgreSQL skips their locks), and is
``finished`` only once none of the subject's rows holds anything it empties. The
maintenance job resumes every erasure still waiting on each run (``relaybox
maintenance``), and asking again for the same subject resumes the same erasure:
erasing is idempotent.

Each batch (``erasure.batch`` rows of each kind) is a transaction of its own, so a big
subject never holds locks for long; nothing runs on the serving event loop beyond
awaiting the database (the admin API answers 202 and erases in a task).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from relaybox.errors import InvalidRequest, NotFound
from relaybox.sources.base import MAX_SUBJECT_CHARS, subject_digest, text_problem
from relaybox.store.erasure import Erasure, ErasureScope

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = ["erase", "resume_waiting", "run_erasure", "start_erasure"]

log = structlog.get_logger("relaybox.erasure")

MAX_ACTOR_CHARS = 200
MAX_REASON_CHARS = 1000


def _check(value: str, what: str, limit: int) -> str:
    if not value:
        raise InvalidRequest(f"{what} must not be empty")
    problem = text_problem(value, limit)
    if problem:
        raise InvalidRequest(f"{what} {problem}")
    return value


async def start_erasure(
    box: Runtime,
    *,
    subject: str | None = None,
    tenant: str | None = None,
    actor: str,
    reason: str = "",
) -> tuple[Erasure, bool]:
    """Record an erasure of ``subject`` or of ``tenant`` (exactly one) by ``actor``,
    and return it, with whether it is one recorded before that still waits for rows
    (then it is resumed, not recorded twice). Nothing is erased yet:
    :func:`run_erasure` does it. :class:`InvalidRequest` for a bad argument."""
    if (subject is None) == (tenant is None):
        raise InvalidRequest("name a subject or a tenant (one of them)")
    _check(actor, "actor", MAX_ACTOR_CHARS)
    if reason:
        _check(reason, "reason", MAX_REASON_CHARS)
    scope: ErasureScope
    if subject is not None:
        scope, digest = "subject", subject_digest(_check(subject, "subject", MAX_SUBJECT_CHARS))
    else:
        assert tenant is not None
        scope, digest = "tenant", None
        _check(tenant, "tenant", MAX_SUBJECT_CHARS)
    store = box.store
    erasure_id, resumed = await store.erasure.begin(
        actor=actor,
        reason=reason,
        scope=scope,
        digest=digest,
        tenant=tenant,
        now=box.clock.now(),
    )
    erasure = await store.erasure.get(erasure_id)
    assert erasure is not None  # just recorded (or found open)
    if not resumed:
        log.info("erasure_recorded", erasure_id=erasure_id, scope=scope, actor=actor)
    return erasure, resumed


async def run_erasure(
    box: Runtime,
    erasure_id: int,
    *,
    batch: int | None = None,
    progress: Callable[[dict[str, int]], None] | None = None,
) -> Erasure:
    """Empty the erasure's rows that are not pending, ``batch`` rows of each kind per
    transaction (default ``erasure.batch``), then record how many still wait; return
    the erasure as recorded then. ``progress`` is called with each batch's counts.
    Safe to run twice at once or again later: a row is emptied once."""
    store = box.store
    erasure = await store.erasure.get(erasure_id)
    if erasure is None:
        raise NotFound(f"no erasure {erasure_id}")
    size = batch or box.settings.erasure.batch
    if size < 1:
        raise InvalidRequest("batch must be positive")
    while True:
        counts = await store.erasure.erase_batch(erasure, now=box.clock.now(), limit=size)
        if not any(counts.values()):
            break
        if progress is not None:
            progress(counts)
        await asyncio.sleep(0)  # batches of other work between ours
    waiting = await store.erasure.settle(erasure, now=box.clock.now())
    await store.erasure.flush()
    done = await store.erasure.get(erasure_id)
    assert done is not None
    log.info("erasure_ran", erasure_id=erasure_id, waiting=waiting, **done.rows)
    return done


async def erase(
    box: Runtime,
    *,
    subject: str | None = None,
    tenant: str | None = None,
    actor: str,
    reason: str = "",
    batch: int | None = None,
    progress: Callable[[dict[str, int]], None] | None = None,
) -> Erasure:
    """:func:`start_erasure`, then :func:`run_erasure` in this task: the erasure as
    recorded once every row that is not pending is emptied (``waiting`` counts the
    others; the maintenance job empties them once they finish)."""
    erasure, _ = await start_erasure(
        box, subject=subject, tenant=tenant, actor=actor, reason=reason
    )
    return await run_erasure(box, erasure.id, batch=batch, progress=progress)


async def resume_waiting(box: Runtime, *, limit: int = 100) -> list[Erasure]:
    """Run again every erasure still waiting for rows (oldest first, at most
    ``limit``): the maintenance job's step. Returns them as recorded after."""
    done = []
    for erasure_id in await box.store.erasure.open_ids(limit):
        done.append(await run_erasure(box, erasure_id))
    return done
