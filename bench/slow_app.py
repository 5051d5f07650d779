"""The slow-endpoints benchmark's application: plain HTTP to the loopback sink
allowed, a 5 s attempt timeout, up to 2,000 attempts in flight, one tenant on every
slot."""

from __future__ import annotations

from relaybox import Relaybox
from relaybox.outbound import configure

box = Relaybox()
configure(
    box,
    allow_insecure_loopback=True,
    allow_networks=["127.0.0.0/8"],
    timeout=5.0,
    concurrency=2000,
    tenant_share=1.0,
    # Its one tenant ("bench") has an endpoint per slot.
    max_endpoints=2000,
)
