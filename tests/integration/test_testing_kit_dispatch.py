"""relaybox.testing's dispatcher helpers: ``drain_dispatcher`` steps at the frozen
clock (a failed attempt's retry waits for ``advance``) and ``deliveries`` reads the
deliveries of one published message, against a real HTTP receiver on 127.0.0.1."""

from __future__ import annotations

from typing import Any

from relaybox import Relaybox
from relaybox.testing import Harness
from tests.support.outbound_app import endpoint, local, publish_one
from tests.support.receivers import HttpReceiver, Reply


async def test_drain_dispatcher_waits_for_the_clock_and_deliveries_read_a_message(
    relaybox_harness: Any,
) -> None:
    async with HttpReceiver([Reply(500), Reply(200)]) as receiver:

        async def setup(box: Relaybox) -> None:
            await endpoint(box, receiver.url)

        kit: Harness = await relaybox_harness(lambda box: local(box, schedule=[30.0]), setup=setup)
        message = await publish_one(kit.box)
        other = await publish_one(kit.box, tenant="t2")  # no endpoint: no delivery

        assert await kit.drain_dispatcher() == 1  # the 500: a retry in 30 s
        [failed] = await kit.deliveries(message_id=message.id)
        assert (failed["status"], failed["last_status"]) == ("pending", 500)
        assert await kit.drain_dispatcher() == 0  # not due at the frozen clock
        assert len(receiver.requests) == 1

        kit.advance(30.0)
        assert await kit.drain_dispatcher() == 1
        [sent] = await kit.deliveries(message_id=message.id, status="sent")
        assert (sent["tenant"], sent["last_status"]) == ("t1", 200)
        assert await kit.deliveries(message_id=other.id) == []
        assert await kit.deliveries(tenant="t2") == []
        assert [r.webhook_id for r in receiver.requests] == [message.id, message.id]
