"""The application every host of the multi-host tests runs (``relaybox serve|worker|
dispatch --app tests.e2e.multihost.hostapp:box``).

A Stripe source; ``invoice.paid`` grants once per invoice (its business key), writes
one row to ``mh_effects`` (no UNIQUE on purpose: a second effect would show as a
second row) naming the host that ran it, and adds an outbox row for the ``sink``
channel, which POSTs it to ``MH_SINK_URL`` (a receiver on the database's host) with
its key. Settings come from ``RELAYBOX_*`` (the test sets small holds and leases).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from typing import Any

import aiohttp
from sqlalchemy import text

from relaybox import Context, Relaybox, Secret, sources
from relaybox.config import load_settings
from relaybox.outbound import Outbound, configure
from relaybox.outbound.channels.base import Channel, Delivery, Result

__all__ = ["EFFECTS_DDL", "SECRET", "SinkChannel", "box"]

SECRET = "whsec_multihost_test"
HOST = os.environ.get("MH_HOST", socket.gethostname())

EFFECTS_DDL = (
    "CREATE TABLE IF NOT EXISTS mh_effects"
    " (invoice TEXT NOT NULL, event_id TEXT NOT NULL, host TEXT NOT NULL)"
)


class SinkChannel(Channel):
    """One POST of the row's payload to ``MH_SINK_URL``, the row's key in
    ``idempotency-key``: 2xx sent, anything else retried."""

    uncertain = "resend"
    max_in_flight = 8

    def __init__(self) -> None:
        super().__init__()
        self._http: aiohttp.ClientSession | None = None

    async def deliver(self, delivery: Delivery) -> Result:
        if self._http is None:
            self._http = aiohttp.ClientSession()
        url = os.environ["MH_SINK_URL"]
        headers = {"idempotency-key": delivery.key, "x-host": HOST}
        try:
            async with asyncio.timeout(max(delivery.deadline, 0.1)):
                body = json.dumps(delivery.payload)
                async with self._http.post(url, data=body, headers=headers) as r:
                    await r.read()
                    if 200 <= r.status < 300:
                        return Result("sent", status_code=r.status)
                    return Result("retry", status_code=r.status, error=f"HTTP {r.status}")
        except TimeoutError:
            return Result("retry", error="timeout", timed_out=True)
        except (aiohttp.ClientError, OSError) as exc:
            return Result("retry", error=str(exc)[:200])

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None


def _invoice(ctx: Context) -> str:
    return str(ctx.payload["data"]["object"]["id"])


box = Relaybox(settings=load_settings())
box.source("stripe", sources.stripe(secrets=[Secret(SECRET)]))
_out: Outbound = configure(
    box,
    secrets_key=os.environ.get("RELAYBOX_TEST_SECRETS_KEY"),
    lease_ttl=float(os.environ.get("MH_LEASE_TTL", "8")),
    min_timeout=0.5,
    timeout=2.0,
    max_timeout=2.0,
    poll_interval=0.1,
    jitter=0.0,
    schedule=[0.2, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
    # endpoints reach the test's receiver through a forwarder on each host's loopback
    allow_insecure_loopback=True,
    allow_networks=["127.0.0.0/8"],
    tenant_share=1.0,
)
_out.channel("sink", SinkChannel())


@box.handler("stripe", "invoice.paid", business_key=lambda ctx: f"grant:{_invoice(ctx)}")
async def grant(ctx: Context) -> None:
    await asyncio.sleep(0.005)  # work in flight when a host dies
    if await ctx.once():
        invoice: Any = _invoice(ctx)
        await ctx.conn.execute(
            text("INSERT INTO mh_effects (invoice, event_id, host) VALUES (:i, :e, :h)"),
            {"i": invoice, "e": ctx.event.event_id, "h": HOST},
        )
        await ctx.outbox.add("sink", f"grant:{invoice}", {"invoice": invoice, "host": HOST})
