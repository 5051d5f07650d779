"""The dispatch benchmark's application: plain HTTP to the loopback sink allowed
(development flag + allow-list), a 5 s attempt timeout, one tenant on every slot."""

from __future__ import annotations

from relaybox import Relaybox
from relaybox.outbound import configure

box = Relaybox()
configure(
    box,
    allow_insecure_loopback=True,
    allow_networks=["127.0.0.0/8"],
    timeout=5.0,
    concurrency=100,
    # Its one tenant ("bench") may use every slot, as its 20 endpoints x 5 need.
    tenant_share=1.0,
)
