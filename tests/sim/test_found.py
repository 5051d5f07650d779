"""What the simulation found, as regular tests named after the seed that found them.

Each reproduces the failure without the simulator, deterministically (a frozen clock,
the dispatcher's own steps). While the bug stands the test is ``xfail(strict=True)``:
it must fail, and the day it passes the mark has to go.
"""

from __future__ import annotations

import asyncio

from relaybox import FrozenClock, Relaybox
from relaybox.config import Settings
from relaybox.outbound import disable_endpoint
from relaybox.retention import Maintenance
from tests.conftest import KEYED
from tests.support.outbound_app import LOCAL, endpoint, local, outbox_rows, publish_one
from tests.support.receivers import HttpReceiver, Reply


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

    Fixed: maintenance makes such strays dead letters (``endpoint_disabled``) once no
    live lease holds them (``OutboxStore.delivery_sweep_disabled``).
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
            await second.run_once()  # leases only rows of enabled endpoints
        finally:
            await second.close()
        await Maintenance(box).run_once()  # the sweep of disabled endpoints' strays
    [row] = await outbox_rows(box)
    assert (row["status"], row["dead_reason"]) == ("dead", "endpoint_disabled")


async def test_seed3_a_delivery_published_while_its_endpoint_is_disabled_is_not_stranded(
    pg_url: str, clock: FrozenClock
) -> None:
    """Found by the same seed in a replay (``--seed 3 --steps 150 --backend postgres
    --replay 3``): nine rows of an ordered endpoint pending for good, none of them
    leased, all created before the 410 that disabled it, and one created after.

    Diagnosis (PostgreSQL): ``publish`` reads the endpoint as enabled in its own
    transaction and inserts the outbox row; ``disable_in`` kills the rows it can see.
    A publishing transaction that commits after the disabling one began (a worker's
    group of handlers, slow under load) leaves a pending row that the disabling
    transaction never saw and that no lease will ever take (only rows of enabled
    endpoints are leased). SQLite's single writer orders the two transactions, so it
    cannot happen there.

    Fixed by the same sweep: the row is pending, of a disabled endpoint, unleased.
    """
    box = Relaybox(settings=Settings(database_url=pg_url, outbound=KEYED), clock=clock)
    try:
        local(box)
        async with HttpReceiver(Reply(200)) as receiver:
            endpoint_id, _ = await endpoint(box, receiver.url)
            async with box.store.transaction() as conn:
                await box.publish(conn, "pet.adopted", {"petId": "p1"}, tenant="t1")
                # Another connection disables the endpoint, and commits, meanwhile.
                disabled = disable_endpoint(box, endpoint_id, tenant="t1", reason="by hand")
                assert await asyncio.wait_for(disabled, 10)
            dispatcher = box.dispatcher()
            try:
                await dispatcher.run_once()
            finally:
                await dispatcher.close()
            await Maintenance(box).run_once()  # the sweep of disabled endpoints' strays
        [row] = await outbox_rows(box)
        assert (row["status"], row["dead_reason"]) == ("dead", "endpoint_disabled")
    finally:
        await box.close()
