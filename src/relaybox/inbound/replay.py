"""Replay: send finished inbox rows (done, dead, ignored) through the worker again.

A replayed event runs the same handler with the same business keys, so it can never
grant twice: ``ctx.once()`` finds the operation already recorded. The row goes back
to ``pending`` with a fresh attempt budget; each replay is recorded (who, when, why,
the previous status). A row whose payload was purged by retention cannot be replayed
and is reported as such.

A dead letter an operator discarded (``relaybox dead discard``) is out of the queue
for good: a selection by source, time range or status leaves it out (and says so)
unless it asks with ``include_discarded``; replaying it by its id is asking.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from relaybox import tracing
from relaybox.store.history import ReplayCandidate, ReplayFilter

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = [
    "ReplayResult",
    "Selection",
    "replay",
    "select",
]

log = structlog.get_logger("relaybox.replay")


@dataclass(frozen=True)
class Selection(ReplayFilter):
    """Which rows to replay (the store's filter, and whether discarded dead letters
    are in); unset fields do not filter. At least one must be set."""

    include_discarded: bool | None = None  # default: only when named by id

    def __post_init__(self) -> None:
        if (
            self.ids is None
            and self.source is None
            and self.statuses is None
            and self.since is None
        ):
            raise ValueError("a replay needs ids, a source, a status or a time range")
        bad = set(self.statuses or ()) - {"done", "dead", "ignored"}
        if bad:
            raise ValueError(f"cannot replay status {sorted(bad)}: use done, dead or ignored")

    @property
    def takes_discarded(self) -> bool:
        """Whether discarded dead letters are replayed: when asked, or named by id."""
        if self.include_discarded is not None:
            return self.include_discarded
        return self.ids is not None


@dataclass
class ReplayResult:
    replayed: list[int] = field(default_factory=list)
    purged: list[int] = field(default_factory=list)  # payload gone: cannot replay
    skipped: list[int] = field(default_factory=list)  # changed status meanwhile
    discarded: list[int] = field(default_factory=list)  # discarded: left out, not asked

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


Candidate = ReplayCandidate
"""A row a selection matches, as it is now."""


async def select(box: Runtime, selection: Selection) -> list[Candidate]:
    """The rows ``selection`` matches now, changing nothing (``relaybox replay
    --dry-run``, and the CLI's progress over long ranges)."""
    store = box.store
    async with store.transaction() as conn:
        return await store.history.replay_select(conn, selection)


async def replay(box: Runtime, selection: Selection, *, actor: str, reason: str) -> ReplayResult:
    """Put the selected rows back to pending, in one transaction, and record why.
    Traced as ``relaybox.inbound.replay`` (the counts; not the actor's words)."""
    with tracing.span("relaybox.replay") as span:
        result = await _replay(box, selection, actor=actor, reason=reason)
        if span.is_recording():
            span.set_attributes(
                {
                    "relaybox.replay.replayed": len(result.replayed),
                    "relaybox.replay.purged": len(result.purged),
                    "relaybox.replay.skipped": len(result.skipped),
                    "relaybox.replay.discarded": len(result.discarded),
                }
            )
        return result


async def _replay(box: Runtime, selection: Selection, *, actor: str, reason: str) -> ReplayResult:
    if not actor or not reason:
        raise ValueError("a replay needs an actor and a reason")
    store = box.store
    result = ReplayResult()
    now = box.clock.now()
    async with store.transaction() as conn:
        for candidate in await store.history.replay_select(conn, selection):
            if candidate.purged:
                result.purged.append(candidate.inbox_id)
                continue
            if candidate.discarded and not selection.takes_discarded:
                result.discarded.append(candidate.inbox_id)
                continue
            # Judged again: a projection may now accept or refuse it anew.
            if not await store.history.replay_mark(
                conn, candidate.inbox_id, status=candidate.status, now=now
            ):
                result.skipped.append(candidate.inbox_id)
                continue
            await store.history.replay_record(conn, candidate, actor=actor, reason=reason, now=now)
            result.replayed.append(candidate.inbox_id)
        if result.replayed:
            await store.db.notify(conn, "inbox")
    log.info(
        "replay",
        actor=actor,
        reason=reason,
        replayed=len(result.replayed),
        purged=result.purged,
        skipped=result.skipped,
        discarded=len(result.discarded),
    )
    return result
