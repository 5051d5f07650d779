"""The app the tracing test runs as real processes
(``relaybox serve --app tests.support.traceapp:box``): a Standard Webhooks source
``orders`` whose ``order.paid`` handler publishes ``order.confirmed`` to tenant
``t1``'s endpoints, and logs a line while it runs.

``TRACE_HANDLER`` (read per call):

``hang``  an attempt after the first waits for its process to be SIGKILLed;
(unset)   the handler publishes.

Whatever it says, the first attempt fails (a retry), so that a trace shows one.
"""

from __future__ import annotations

import asyncio
import os

import structlog

from relaybox import Context, Relaybox, sources
from relaybox.config import load_settings
from tests.support.outbound_app import local

__all__ = ["SECRET", "box"]

SECRET = "whsec_dHJhY2luZy10ZXN0LXNlY3JldC0zMi1ieXRlcyE="

log = structlog.get_logger("traceapp")

box = Relaybox(settings=load_settings())  # RELAYBOX_*: the fault tests' short budgets
local(box, schedule=[0.3, 0.3, 0.3], poll_interval=0.05)
box.source("orders", sources.standard(secrets=[SECRET]))


@box.handler("orders", "order.paid")
async def confirm(ctx: Context) -> None:
    log.info("order_paid_handling", attempt=ctx.event.attempts)
    if ctx.event.attempts == 1:
        raise RuntimeError("the first attempt fails")
    if os.environ.get("TRACE_HANDLER") == "hang":
        await asyncio.sleep(3600)  # until the test SIGKILLs this process
    await box.publish(
        ctx.conn, "order.confirmed", {"order": ctx.payload["data"]["order"]}, tenant="t1"
    )
