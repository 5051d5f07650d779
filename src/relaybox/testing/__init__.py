"""A test kit for handlers: signed deliveries for every provider, a box on SQLite with a
frozen clock, the worker and dispatcher a step at a time, and assertions on what was
stored.

Installed as a pytest plugin (entry point ``pytest11``), it gives every test the
fixtures ``signed_delivery``, ``relaybox_clock`` and ``relaybox_harness``::

    @pytest.mark.asyncio
    async def test_grant(relaybox_harness):
        kit = await relaybox_harness(myapp.box)   # its @box.on_ready tables made
        await kit.send("stripe", event_type="invoice.paid", payload=invoice_event)
        assert await kit.run_worker() == 1
        await kit.assert_business_key("stripe:acct_1:in_1:initial-credit-grant")
        await kit.assert_outbox("email", count=1)

The harness borrows the application's own box (``myapp.box``: its sources and
handlers) and points it at a fresh SQLite file with a frozen clock until the test
ends; or it takes a ``configure(box)`` function that registers them on a new box.

Deliveries go through the box's real receiver (signature, tenant mapping, the inbox's
unique key) in process, without a socket; nothing runs in the background.
"""

from __future__ import annotations

from relaybox.testing.deliveries import TEST_SECRETS, Delivery, signed_delivery, test_source
from relaybox.testing.harness import TEST_START, Harness, Response, make_harness

__all__ = [
    "TEST_SECRETS",
    "TEST_START",
    "Delivery",
    "Harness",
    "Response",
    "make_harness",
    "signed_delivery",
    "test_source",
]
