"""The latency benchmark's application (``relaybox serve`` and ``relaybox dispatch``):
the accept benchmark's signed source ``bench`` with a handler that writes nothing of
its own (the event's completion is its transaction's commit), and the dispatch
benchmark's outbound settings with retries exactly on schedule (no jitter), so that a
retry's lateness is the dispatcher's, not the schedule's spread.

With ``BENCH_COMMITS`` set (the accept session), the process notes when each event's
transaction committed: the worker's ``after_commit`` hook runs right after its COMMIT
returned (``box.clock.now()``, the clock ``received_at`` is read from), and the
process writes ``<inbox id> <time>`` lines to that file as it exits. The row's
``done_at`` is no substitute: it is stamped inside the transaction, before the COMMIT
(0.8-1.7 ms before it returned in this bench, 2026-12-06)."""

from __future__ import annotations

import atexit
import os
from pathlib import Path

from bench.apps import SECRET
from relaybox import Context, Relaybox, Secret, sources
from relaybox.outbound import configure

box = Relaybox()
box.source("bench", sources.standard(secrets=[Secret(SECRET)]))


@box.handler("bench", "invoice.paid")
async def paid(ctx: Context) -> None:
    """Nothing but the commit that marks the event done."""


configure(
    box,
    allow_insecure_loopback=True,
    allow_networks=["127.0.0.0/8"],
    timeout=5.0,
    concurrency=100,
    tenant_share=1.0,
    jitter=0.0,
)

_COMMITS = os.environ.get("BENCH_COMMITS")
_committed: list[tuple[int, float]] = []


async def _note_commit(ids: list[int]) -> None:
    now = box.clock.now()
    _committed.extend((inbox_id, now) for inbox_id in ids)


def _write_commits() -> None:
    assert _COMMITS is not None
    Path(_COMMITS).write_text("".join(f"{i} {t!r}\n" for i, t in _committed))


if _COMMITS:
    box.hooks.after_commit.append(_note_commit)
    atexit.register(_write_commits)
