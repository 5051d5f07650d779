"""Hardening of the sending side, on SQLite and PostgreSQL: one tenant's hanging
endpoint does not delay another tenant (per-tenant caps, slots handed out round robin,
lanes' caps bounded by the dispatcher's concurrency), endpoint quotas, /metrics that
does not grow with endpoints, and destinations refused at delivery time dead at once
(``blocked``). Where it can, against a real ``relaybox serve`` over HTTP."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import re
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner

from relaybox import Relaybox
from relaybox.cli import main
from relaybox.config.outbound import OutboundSettings, tenant_cap
from relaybox.outbound import create_api_key
from relaybox.outbound.ssrf import Guard, UnsafeDestination, forbidden_reason
from tests.conftest import SECRETS_KEY
from tests.support.outbound_app import endpoint, local, outbox_rows, publish_one
from tests.support.procs import ProcessExited, Procs, free_port, wait_http
from tests.support.receivers import HttpReceiver, Reply

# Plain HTTP to receivers on 127.0.0.1 (tests/support/outbound_app.py says why); every
# other outbound setting is its default unless a test says: 64 slots, a tenant's share
# a quarter of them.
LOOPBACK = {"allow_insecure_loopback": True, "allow_networks": ["127.0.0.0/8"]}


class Tenant:
    """A tenant's client of /api/v1: JSON in, (status, JSON) out."""

    def __init__(self, http: aiohttp.ClientSession, base: str, key: str) -> None:
        self.http, self.base, self.key = http, base + "/api/v1", key

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        auth = {"Authorization": f"Bearer {self.key}"}
        async with self.http.request(method, self.base + path, json=body, headers=auth) as r:
            return r.status, (await r.json() if r.status != 204 else None)

    async def endpoint(self, url: str, **fields: Any) -> str:
        status, body = await self.call("POST", "/endpoints", {"url": url, **fields})
        assert status == 201, body
        return str(body["id"])

    async def publish(self, n: int, event_type: str = "order.created") -> list[str]:
        """``n`` messages, ten requests at a time; their ids."""
        gate = asyncio.Semaphore(10)

        async def one(i: int) -> str:
            async with gate:
                status, body = await self.call(
                    "POST", "/messages", {"event_type": event_type, "data": {"n": i}}
                )
            assert status == 202, body
            return str(body["id"])

        return list(await asyncio.gather(*(one(i) for i in range(n))))


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    yield p
    p.cleanup()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def serve(procs: Procs, database_url: str, **outbound: Any) -> str:
    """``relaybox serve`` with the tenant API and the dispatcher, its ``[outbound]``
    settings in a TOML file (``--config``); its base URL."""
    # The suite's sealing key (PostgreSQL needs one), and a publish rate that the
    # 300-message bursts here do not reach: these tests are about the dispatcher.
    settings = {
        **LOOPBACK,
        "secrets_key": SECRETS_KEY,
        "publish_rate": 10_000.0,
        "publish_burst": 10_000,
        **outbound,
    }
    config = procs.workdir / f"relaybox-{len(procs.started)}.toml"
    config.write_text(
        "[outbound]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items())
    )
    for _ in range(3):
        port = free_port()
        proc = procs.start(
            "serve",
            ["serve", "--config", str(config), "--database-url", database_url, "--no-migrate",
             "--roles", "api,dispatcher", "--host", "127.0.0.1", "--port", str(port)],
        )  # fmt: skip
        try:
            await wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc)
            return f"http://127.0.0.1:{port}"
        except ProcessExited:
            if "address already in use" not in proc.tail(200).lower():
                raise
    raise RuntimeError("could not start relaybox serve on a free port")


async def tenant(box: Relaybox, http: aiohttp.ClientSession, base: str, name: str) -> Tenant:
    _, key = await create_api_key(box, name, "tests")
    return Tenant(http, base, key)


# -- one tenant cannot stall another ----------------------------------------------------


async def test_a_tenant_whose_endpoint_hangs_does_not_delay_another_tenant(
    box: Relaybox, database_url: str, procs: Procs, http: aiohttp.ClientSession
) -> None:
    """Tenant A's endpoint never answers (timeout 30 s, the highest ``max_in_flight``
    allowed: the dispatcher's 64 slots) and A publishes 300 messages; tenant B's 5
    messages to a healthy endpoint arrive within 2 s. Without per-tenant caps A held
    every slot (and, on PostgreSQL, 256 rows leased ahead that each freed slot took
    next): B waited for A's timeouts, 30 s at least."""
    async with HttpReceiver(Reply(hang=True)) as stuck, HttpReceiver() as healthy:
        base = await serve(procs, database_url)
        a = await tenant(box, http, base, "tenant-a")
        b = await tenant(box, http, base, "tenant-b")
        await a.endpoint(stuck.url, timeout=30, max_in_flight=64)
        await b.endpoint(healthy.url)
        await a.publish(300)
        # A's attempts hang: the dispatcher is as busy with A as A may make it.
        await stuck.wait_for(16, within=20)
        await asyncio.sleep(0.3)  # A's further leases and hand-outs, if any, happen
        started = time.monotonic()
        await b.publish(5)
        await healthy.wait_for(5, within=2.0)
        assert time.monotonic() - started < 2.0
        assert len(healthy.requests) == 5
        # A had a quarter of the 64 slots (tenant_share 0.25), never more.
        assert stuck.peak_in_flight <= 16


@pytest.mark.parametrize("database_url", ["postgres"], indirect=True)
async def test_a_freed_slot_goes_to_the_next_lane_not_its_own(box: Relaybox) -> None:
    """One tenant, two lanes. Lane X (slow) holds every slot and rows leased ahead
    (PostgreSQL: SQLite leases no more than its free slots); rows of lane Y leased
    meanwhile get the next slots that free, in turn with X's, not after X's backlog (a
    freed slot had taken its own lane's next row first: Y waited for all of X's 40
    rows, ~10 s)."""
    local(box, lease_ahead=4)
    async with HttpReceiver(Reply(delay=1.0)) as slow, HttpReceiver() as fast:
        x, _ = await endpoint(box, slow.url, max_in_flight=4)
        y, _ = await endpoint(box, fast.url, max_in_flight=4)
        for _ in range(40):
            await publish_one(box, endpoint_ids=[x])
        dispatcher = box.dispatcher(concurrency=4)
        running = asyncio.create_task(dispatcher.run())
        try:
            await slow.wait_for(4, within=10)
            started = time.monotonic()
            for _ in range(4):
                await publish_one(box, endpoint_ids=[y])
            await fast.wait_for(4, within=5)
            elapsed = time.monotonic() - started
            # Y's rows are leased as X's attempts end (X's rows leased ahead fill the
            # dispatcher's lease limit), and each freed slot goes to Y and X in turn:
            # Y is through within three of X's one-second waves.
            assert elapsed < 5.0, f"lane Y waited {elapsed:.2f} s"
        finally:
            dispatcher.stop()
            await asyncio.wait_for(running, 15)


async def test_a_stored_cap_above_the_concurrency_is_clamped_at_lease(box: Relaybox) -> None:
    """A lane stored with a cap above the dispatcher's concurrency (before the API
    bounded it, or a channel configured so) takes at most the concurrency of rows."""
    local(box)
    lane, _ = await endpoint(box, "http://127.0.0.1:9/hook", max_in_flight=4)
    await box.store.fetch_all(
        f"UPDATE relaybox_lanes SET max_in_flight = 500 WHERE lane = '{lane}' RETURNING lane"
    )
    for _ in range(30):
        await publish_one(box)
    dispatcher = box.dispatcher(concurrency=8)
    try:
        assert len(await dispatcher._lease(100)) == 8
        assert await dispatcher._lease(100) == []  # the lane is at its (clamped) cap
    finally:
        await dispatcher.close()


async def test_one_lease_shares_rows_between_tenants(box: Relaybox) -> None:
    """The lease itself never lets one tenant's lanes take every row: with the default
    share (a quarter of 8 slots: 2 per tenant), tenant A's three lanes get 2 rows and
    tenant B's lane its rows too, though A's lanes come first."""
    local(box, tenant_share=0.25)
    a_lanes = [
        (await endpoint(box, f"http://127.0.0.1:9/a{i}", tenant="a", max_in_flight=4))[0]
        for i in range(3)
    ]
    b_lane, _ = await endpoint(box, "http://127.0.0.1:9/b", tenant="b", max_in_flight=4)
    for _ in range(4):
        await publish_one(box, tenant="a")
    for _ in range(4):
        await publish_one(box, tenant="b")
    dispatcher = box.dispatcher(concurrency=8)
    try:
        found = await dispatcher._lease(8)
    finally:
        await dispatcher.close()
    taken: dict[str, int] = {}
    for d in found:
        assert d.endpoint is not None
        taken[d.endpoint.tenant] = taken.get(d.endpoint.tenant, 0) + 1
    assert taken == {"a": 2, "b": 2}
    assert {d.lane for d in found if d.tenant == "b"} == {b_lane}
    assert {d.lane for d in found if d.tenant == "a"} <= set(a_lanes)


# -- caps and quotas over the API and the CLI -------------------------------------------


async def test_endpoint_caps_and_quota_over_the_api(
    box: Relaybox, database_url: str, procs: Procs, http: aiohttp.ClientSession
) -> None:
    """``max_in_flight`` above the dispatcher's concurrency is refused (422) at create
    and update: it could never run, and one endpoint would ask for every slot (a cap
    stored before is clamped at lease time instead). A tenant's endpoints are bounded
    (``max_endpoints``, 409 past it); another tenant is not affected."""
    base = await serve(
        procs,
        database_url,
        concurrency=32,
        max_endpoints=3,
    )
    a = await tenant(box, http, base, "tenant-a")
    b = await tenant(box, http, base, "tenant-b")
    status, body = await a.call(
        "POST", "/endpoints", {"url": "https://hooks.example.com/x", "max_in_flight": 33}
    )
    assert status == 422 and body["error"] == "invalid_endpoint", body
    assert "max_in_flight must be at most 32" in body["message"]
    first = await a.endpoint("https://hooks.example.com/1", max_in_flight=32)
    status, body = await a.call("PATCH", f"/endpoints/{first}", {"max_in_flight": 33})
    assert status == 422 and "at most 32" in body["message"], body
    status, body = await a.call("GET", f"/endpoints/{first}")
    assert body["max_in_flight"] == 32
    # [::1] is loopback (it had been called "IPv4-compatible").
    status, body = await a.call("POST", "/endpoints", {"url": "https://[::1]/hook"})
    assert status == 422 and "loopback" in body["message"], body

    await a.endpoint("https://hooks.example.com/2")
    third = await a.endpoint("https://hooks.example.com/3")
    status, body = await a.call("POST", "/endpoints", {"url": "https://hooks.example.com/4"})
    assert status == 409 and body["error"] == "endpoint_quota_exceeded", body
    assert "already has 3 endpoints" in body["message"] and "(3)" in body["message"]
    await b.endpoint("https://hooks.example.com/b")  # quotas are per tenant
    status, _ = await a.call("DELETE", f"/endpoints/{third}")
    assert status == 204
    await a.endpoint("https://hooks.example.com/4")  # room again
    status, body = await a.call("GET", "/endpoints")
    assert len(body["data"]) == 3


def test_endpoint_caps_and_quota_over_the_cli(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in list(os.environ):
        if key.startswith("RELAYBOX_") and not key.startswith("RELAYBOX_TEST_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("RELAYBOX_OUTBOUND__MAX_ENDPOINTS", "1")
    monkeypatch.setenv("RELAYBOX_OUTBOUND__SECRETS_KEY", SECRETS_KEY)
    runner = CliRunner()

    def create(*args: str) -> Any:
        return runner.invoke(
            main,
            ["endpoints", "create", "--tenant", "t1", *args, "--database-url", database_url],
            prog_name="relaybox",
        )

    refused = create("--url", "https://hooks.example.com/x", "--max-in-flight", "65")
    assert refused.exit_code == 2, refused.output
    assert "max_in_flight must be at most 64" in refused.output
    made = create("--url", "https://hooks.example.com/x", "--max-in-flight", "64")
    assert made.exit_code == 0, made.output
    assert json.loads(made.stdout)["max_in_flight"] == 64
    over = create("--url", "https://hooks.example.com/y")
    assert over.exit_code == 2 and "already has 1 endpoints" in over.output, over.output


def test_a_tenants_cap_is_a_share_of_the_concurrency() -> None:
    default = OutboundSettings()
    assert tenant_cap(default.concurrency, default.tenant_share) == 16
    assert tenant_cap(2, 0.25) == 1


# -- metrics -------------------------------------------------------------------------------


def _delivery_series(text: str) -> list[str]:
    return sorted(
        line.split(" ")[0]
        for line in text.splitlines()
        if line.startswith("relaybox_delivery_") and not line.startswith("#")
    )


async def test_metrics_do_not_grow_with_endpoints(
    box: Relaybox, database_url: str, procs: Procs, http: aiohttp.ClientSession
) -> None:
    """Delivery metrics are labelled by channel: 40 endpoints created, delivered to and
    deleted leave /metrics with the series one endpoint made (one series per endpoint
    id had grown it to 3.7 MB for 2,000 endpoints, and never shrank)."""
    async with HttpReceiver() as receiver:
        base = await serve(procs, database_url)
        a = await tenant(box, http, base, "tenant-a")
        first = await a.endpoint(receiver.url, event_types=["first.*"])
        await a.publish(1, "first.one")
        await receiver.wait_for(1, within=10)

        async def metrics() -> str:
            # An attempt is counted once recorded, after its answer: poll until it is.
            counted = re.compile(
                r'^relaybox_delivery_results_total\{channel="webhook",status_class="2xx"\} (\S+)$',
                re.MULTILINE,
            )
            for _ in range(100):
                async with http.get(base + "/metrics") as r:
                    text = await r.text()
                found = counted.search(text)
                if found and float(found.group(1)) >= len(receiver.requests):
                    return text
                await asyncio.sleep(0.1)
            raise AssertionError("the deliveries were not counted")

        before = await metrics()
        ids = [await a.endpoint(f"{receiver.url}/{i}", event_types=["many.*"]) for i in range(40)]
        await a.publish(2, "many.two")
        await receiver.wait_for(81, within=30)
        after = await metrics()
        assert _delivery_series(after) == _delivery_series(before)
        for endpoint_id in [first, *ids]:
            assert endpoint_id not in after
        assert len(after) < len(before) + 1024  # values change, the series do not
        for endpoint_id in ids:
            status, _ = await a.call("DELETE", f"/endpoints/{endpoint_id}")
            assert status == 204
        assert _delivery_series(await metrics()) == _delivery_series(before)


# -- destinations refused at delivery time ------------------------------------------------


async def test_a_destination_refused_at_delivery_is_dead_blocked_after_one_attempt(
    box: Relaybox, database_url: str, procs: Procs, http: aiohttp.ClientSession
) -> None:
    """``localhost`` passes the check at creation (a name, not an address) and
    resolves to loopback at delivery, which the guard refuses (no allow-list here):
    dead at once as ``blocked``, one attempt, nothing sent (it had been retried
    through the whole schedule, 27 hours)."""
    async with HttpReceiver() as receiver:
        base = await serve(
            procs,
            database_url,
            allow_networks=[],
            poll_interval=0.1,
        )
        a = await tenant(box, http, base, "tenant-a")
        await a.endpoint(f"http://localhost:{receiver.port}/hook")
        [message_id] = await a.publish(1)
        delivery: dict[str, Any] = {}
        for _ in range(100):
            _, body = await a.call("GET", f"/messages/{message_id}")
            [delivery] = body["deliveries"]
            if delivery["status"] != "pending":
                break
            await asyncio.sleep(0.1)
        assert delivery["status"] == "dead" and delivery["dead_reason"] == "blocked", delivery
        assert delivery["attempts"] == 1
        assert "SSRF" in delivery["last_error"] and "loopback" in delivery["last_error"]
        _, body = await a.call("GET", f"/messages/{message_id}/attempts")
        assert [x["outcome"] for x in body["data"]] == ["blocked"]
        assert receiver.requests == []


async def test_an_invalid_url_at_delivery_is_dead_blocked(box: Relaybox) -> None:
    """A URL the guard cannot read (stored before the checks, or edited in the
    database) fails the same way every time: dead at once, ``blocked``."""
    local(box)
    lane, _ = await endpoint(box, "http://127.0.0.1:9/hook")
    await box.store.fetch_all(
        f"UPDATE relaybox_endpoints SET url = 'http://[::1' WHERE id = '{lane}' RETURNING id"
    )
    await publish_one(box)
    dispatcher = box.dispatcher()
    try:
        assert await dispatcher.run_once() == 1
    finally:
        await dispatcher.close()
    [row] = await outbox_rows(box)
    assert (row["status"], row["dead_reason"], row["attempts"]) == ("dead", "blocked", 1)


def test_ipv6_loopback_is_named_loopback() -> None:
    assert forbidden_reason(ipaddress.ip_address("::1")) == "a loopback address"
    assert forbidden_reason(ipaddress.ip_address("::")) == "the unspecified address"
    assert forbidden_reason(ipaddress.ip_address("::7f00:1")) == "an IPv4-compatible IPv6 address"
    with pytest.raises(UnsafeDestination, match="loopback"):
        Guard().check_static("https://[::1]/hook")
