"""What the simulation found, as regular tests named after the seed that found them.

Each reproduces the failure without the simulator, deterministically (a frozen clock,
the dispatcher's own steps). While the bug stands the test is ``xfail(strict=True)``:
it must fail, and the day it passes the mark has to go.
"""

from __future__ import annotations

import pytest

from relaybox import FrozenClock, Relaybox
from relaybox.outbound import disable_endpoint
from tests.support.outbound_app import LOCAL, endpoint, local, outbox_rows, publish_one
from tests.support.receivers import HttpReceiver, Reply


@pytest.mark.xfail(
    strict=True,
    reason="a delivery in flight when its endpoint is disabled stays pending forever",
)
async def test_seed3_a_delivery_in_flight_when_its_endpoint_is_disabled_is_not_stranded(
    box: Relaybox, clock: FrozenClock
) -> None:
    """Found by ``python -m tests.sim --seed 3 --steps 150 --backend postgres``
    (``delivered_or_dead`` and ``lease_fenced``: two webhook rows pending, their leases
    expired minutes before, on an endpoint a 410 had disabled).

    Diagnosis: disabling an endpoint (``disable_in``: a 410, ``disable_after``, or by
    hand) turns its waiting deliveries into dead letters (``endpoint_disabled``), but
    ``delivery_kill_endpoint`` leaves rows under a live lease "to their dispatcher".
    The dispatcher's lease statement only leases rows of *enabled* endpoints, so such
    a row is never leased again: if its dispatcher dies (the lease expires) or records
    a retry (a 5xx, a timeout), it stays ``pending`` for good, neither delivered nor a
    dead letter, although docs/sending.md says the waiting deliveries of a disabled
    endpoint become dead letters. Switching the endpoint back on releases them.
    """
    local(box)
    async with HttpReceiver(Reply(200)) as receiver:
        endpoint_id, _ = await endpoint(box, receiver.url)
        await publish_one(box)
        first = box.dispatcher()
        assert len(await first._lease(1)) == 1  # in flight... and its dispatcher dies
        await first.close()
        assert await disable_endpoint(box, endpoint_id, tenant="t1", reason="by hand")
        clock.advance(LOCAL["lease_ttl"] + 1)  # the dead dispatcher's lease ran out
        second = box.dispatcher()
        try:
            await second.run_once()
        finally:
            await second.close()
    [row] = await outbox_rows(box)
    assert (row["status"], row["dead_reason"]) == ("dead", "endpoint_disabled")
