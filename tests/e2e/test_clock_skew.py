"""Hosts whose clocks disagree, on PostgreSQL: a ``relaybox`` process started with its
host clock 60 s ahead (``tests/support/skewclock``: its ``time.time`` really reads
60 s off) next to processes with a right clock.

When holds and leases came from each process's own clock, the skewed process saw
the others' holds and leases as expired: it took an inbox row another worker held,
and sent again a webhook another dispatcher was still sending. Now every process
takes the database's clock (:class:`relaybox.clock.DatabaseClock`); and past
``clock_max_skew`` a host takes no work at all (log line, metric, doctor finding).
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from examples.credits import app as credits

from relaybox import Relaybox
from relaybox.config import Settings
from tests.conftest import KEYED
from tests.support.faultapp import invoice_paid, post_asgi
from tests.support.outbound_app import endpoint, local, outbox_rows, publish_one
from tests.support.procs import Procs, relaybox_command, skewed, wait_until
from tests.support.receivers import HttpReceiver, Reply

pytestmark = pytest.mark.slow

AHEAD = 60.0


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    yield p
    p.cleanup()


@pytest.fixture
async def pg_box(pg_url: str) -> AsyncIterator[Relaybox]:
    """The test's own box on the right clock (the default: the database's)."""
    b = Relaybox(settings=Settings(database_url=pg_url, outbound=KEYED))
    yield b
    await b.close()


def corrected(env: dict[str, str] | None = None) -> dict[str, str]:
    """A process 60 s ahead allowed to run (``clock_max_skew`` above its skew): only the
    database's clock keeps it from taking what others hold."""
    return skewed(AHEAD, {"RELAYBOX_CLOCK_MAX_SKEW": "120", **(env or {})})


async def test_a_dispatcher_60_s_ahead_does_not_resend_a_webhook_another_is_sending(
    pg_box: Relaybox, pg_url: str, procs: Procs, tmp_path: Path
) -> None:
    # The holder's attempt may take 40 s, its lease 50 s: both within the 60 s, and the
    # attempt outlasts the skewed process's start and its probe delivery (up to 30 s)
    # on a slow machine (with 15 s the attempt timed out there: a retry, not a send).
    local(pg_box, timeout=40.0, max_timeout=40.0, lease_ttl=50.0)
    config = tmp_path / "skewed.toml"
    config.write_text("clock_max_skew = 120\n")  # the app's box takes no RELAYBOX_* itself
    async with (
        HttpReceiver([Reply(hang=True), Reply(200)]) as hooks,
        HttpReceiver(Reply(200)) as probe,
    ):
        await endpoint(pg_box, hooks.url, event_types=["slow.thing"], timeout=40.0)
        await endpoint(pg_box, probe.url, event_types=["probe.thing"])
        await publish_one(pg_box, "slow.thing")
        # A dispatcher on a right clock leases the row (10 s) and hangs in the request.
        holder = pg_box.dispatcher()
        holding = asyncio.create_task(holder.run_once())
        try:
            await hooks.wait_for(1, within=20)

            skewed_proc = procs.start(
                "dispatch+60s",
                [
                    *("dispatch", "--app", "tests.support.outbound_app:box"),
                    *("--config", str(config), "--database-url", pg_url),
                ],
                skewed(AHEAD),
            )
            # Published after the skewed dispatcher started: only it can deliver this one
            # (the holder leases once), so its delivery proves it has leased since.
            await publish_one(pg_box, "probe.thing")
            try:
                await probe.wait_for(1, within=30)
            except TimeoutError:
                detail = procs.tails()
                raise AssertionError(f"the skewed dispatcher never delivered\n{detail}") from None
            assert skewed_proc.alive(), skewed_proc.tail()
            assert len(hooks.requests) == 1, "the webhook another dispatcher holds went out twice"

            hooks.release()
            assert await asyncio.wait_for(holding, 20) == 1
        finally:
            # On a failure too: the holder's attempt ends and its connection goes back
            # (a task left holding it would keep the box's close waiting forever).
            hooks.release()
            if not holding.done():
                holding.cancel()
            await asyncio.gather(holding, return_exceptions=True)
            await holder.close()

    # Each dispatcher records a plain success with its next lease statement: the
    # skewed one, still running, records the probe's within its poll, not at once.
    async def both_sent() -> list[tuple[str, int]] | None:
        found = sorted((r["status"], r["attempts"]) for r in await outbox_rows(pg_box))
        return found if found == [("sent", 1), ("sent", 1)] else None

    await wait_until(both_sent, within=20, what="both recorded as sent once", procs=procs)
    assert len(hooks.requests) == 1


async def _credits_db(url: str) -> Relaybox:
    box = credits.configure(Relaybox(settings=Settings(database_url=url)))
    await credits.setup(box)
    return box


async def _inbox(box: Relaybox, event_id: str) -> dict[str, object]:
    [row] = await box.store.fetch_all(
        f"SELECT status, attempts FROM relaybox_inbox WHERE event_id = '{event_id}'"
    )
    return row


async def test_a_worker_60_s_ahead_does_not_take_a_row_another_worker_holds(
    pg_url: str, procs: Procs
) -> None:
    box = await _credits_db(pg_url)
    try:
        status, _ = await post_asgi(box, invoice_paid("evt_held", "in_held"))
        assert status == 200
        # A worker on a right clock claims it: held for 30 s of the database's clock.
        [db] = await box.store.fetch_all("SELECT extract(epoch FROM clock_timestamp()) AS now")
        claim = await box.store.inbox.claim(
            now=float(db["now"]), limit=10, max_attempts=10, hold=30.0
        )
        assert len(claim.ids) == 1

        proc = procs.worker(pg_url, env=corrected(), name="worker+60s")
        # Accepted after the skewed worker started: its processing proves it claims.
        status, _ = await post_asgi(box, invoice_paid("evt_next", "in_next"))
        assert status == 200

        async def next_done() -> bool:
            return (await _inbox(box, "evt_next"))["status"] == "done"

        await wait_until(next_done, within=30, what="the skewed worker's claim", procs=procs)
        assert proc.alive(), proc.tail()
        held = await _inbox(box, "evt_held")
        assert held == {"status": "pending", "attempts": 0}, "a held row was taken"
    finally:
        await box.close()


async def test_a_host_past_clock_max_skew_takes_no_work_and_says_so(
    pg_url: str, procs: Procs
) -> None:
    """Default ``clock_max_skew`` (5 s): the skewed host still accepts deliveries (its
    times are the database's) but its worker takes none; its metric and log line say
    why, and ``relaybox doctor`` there fails with exit code 6. A host on a right clock
    processes what the skewed one accepted."""
    box = await _credits_db(pg_url)
    try:
        served = await procs.serve(pg_url, env=skewed(AHEAD), name="serve+60s")

        async def refusing() -> bool:
            return "clock_skew_exceeded" in served.output()

        await wait_until(refusing, within=30, what="the skew log line", procs=procs)
        async with aiohttp.ClientSession() as http:
            body = json.dumps(invoice_paid("evt_skewed", "in_skewed")).encode()
            headers = box.sources["stripe"].sign(
                body, event_id="evt_skewed", event_type="invoice.paid", now=box.clock.now()
            )
            headers["content-type"] = "application/json"
            async with http.post(served.url + "/webhooks/stripe", data=body, headers=headers) as r:
                assert r.status == 200, await r.text()
            async with http.get(served.url + "/metrics") as r:
                metrics = await r.text()
        offset = re.search(r"^relaybox_clock_offset_seconds ([-0-9.e+]+)$", metrics, re.M)
        assert offset is not None, metrics
        assert -AHEAD - 1 < float(offset.group(1)) < -AHEAD + 1
        assert re.search(r"^relaybox_clock_skew_exceeded 1\.0$", metrics, re.M)
        row = await _inbox(box, "evt_skewed")
        assert row == {"status": "pending", "attempts": 0}, "the refusing host took work"

        doctor = await asyncio.to_thread(
            subprocess.run,
            [*relaybox_command(), "doctor", "--json", "--database-url", pg_url],
            env={**procs.base_env, **skewed(AHEAD)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert doctor.returncode == 6, doctor.stdout + doctor.stderr
        [clock] = [c for c in json.loads(doctor.stdout)["checks"] if c["check"] == "clock"]
        assert clock["status"] == "fail" and "clock_max_skew" in clock["detail"], clock

        procs.worker(pg_url, name="worker")  # a host on a right clock takes it

        async def done() -> bool:
            return (await _inbox(box, "evt_skewed"))["status"] == "done"

        await wait_until(done, within=30, what="the right host's worker", procs=procs)
    finally:
        await box.close()
