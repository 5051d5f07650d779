"""The latency benchmark's application (``relaybox serve`` and ``relaybox dispatch``):
the accept benchmark's signed source ``bench`` with a handler that writes nothing of
its own (the event's completion is its transaction's commit), and the dispatch
benchmark's outbound settings with retries exactly on schedule (no jitter), so that a
retry's lateness is the dispatcher's, not the schedule's spread."""

from __future__ import annotations

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
