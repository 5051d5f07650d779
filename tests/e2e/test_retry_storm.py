"""1,000 endpoints failing at once: their retries spread over the jitter's window
instead of coming back together, and the healthy endpoints keep their rate meanwhile.

A real dispatcher (PostgreSQL, the default concurrency, tenant share and jitter) sends
to a real local HTTP server: 1,000 endpoints of ten tenants answer 500, five of another
tenant answer 200 to a steady stream of messages published all along.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from relaybox import Relaybox, SystemClock
from relaybox.config import Settings
from relaybox.outbound import define_event_type
from tests.conftest import KEYED
from tests.support.outbound_app import endpoint, local, publish_one

pytestmark = pytest.mark.slow

TENANTS = 10
PER_TENANT = 100  # the default max_endpoints
DELAY = 6.0  # the first retry's delay
JITTER = 0.2  # the default: ±20 %
HEALTHY = 5
HEALTHY_RATE = 10.0  # messages a second to the healthy tenant (5 deliveries each)


class Server:
    """Answers 500 under /fail/, 200 under /ok/; records each request's path and time."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, float]] = []
        self.ids: list[str] = []  # webhook-id of each request, in the same order
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append((request.path, time.monotonic()))
        self.ids.append(request.headers.get("webhook-id", ""))
        return web.Response(status=500 if request.path.startswith("/fail/") else 200)

    async def __aenter__(self) -> Server:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0, backlog=2048)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *_: object) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture
async def box(pg_url: str) -> AsyncIterator[Relaybox]:
    b = Relaybox(settings=Settings(database_url=pg_url, outbound=KEYED), clock=SystemClock())
    # The defaults but for the first retry's delay (5 s by default) and what loopback
    # receivers need; concurrency 64, tenant_share 0.25, jitter 0.2.
    local(b, schedule=[DELAY, 3600.0], jitter=JITTER, tenant_share=0.25, poll_interval=0.1)
    await define_event_type(b, "order.failing")
    await define_event_type(b, "order.ok")
    yield b
    await b.close()


async def first_schedules(box: Relaybox) -> dict[int, float]:
    """Per failing delivery whose first attempt is recorded and second not yet leased:
    the delay its retry was scheduled at, from the end of that attempt (the
    dispatcher's own schedule, whatever lag it then has in sending it)."""
    rows = await box.store.fetch_all(
        "SELECT o.id, o.next_attempt_at - (a.started_at + a.duration) AS delay"
        " FROM relaybox_outbox o JOIN relaybox_outbox_attempts a"
        " ON a.outbox_id = o.id AND a.attempt = 1"
        " WHERE o.attempts = 1 AND o.status = 'pending' AND left(o.tenant, 3) = 'bad'"
    )
    return {r["id"]: float(r["delay"]) for r in rows}


def histogram(values: list[float], low: float, high: float, bins: int) -> list[int]:
    width = (high - low) / bins
    counts = [0] * bins
    for v in values:
        counts[min(bins - 1, max(0, int((v - low) / width)))] += 1
    return counts


async def test_a_thousand_failing_endpoints_retry_spread_and_the_healthy_keep_their_rate(
    box: Relaybox,
) -> None:
    """Measured on the 2-core test machine shared with other work (PostgreSQL 15, first
    retry 6 s ± 20 %: a window of 4.8-7.2 s), as the test prints them.

    Quiet machine (three runs, load ~2): each endpoint's second request came 4.83-7.37
    s after its first, per 0.3 s from 4.8 s ``[110, 127, 121, 127, 121, 124, 146,
    118]``, ``[117, 120, 122, 124, 132, 119, 129, 124]``, ``[100, 135, 123, 118, 123,
    126, 126, 121]`` (even: 125 each), 6-28 of 1,000 later than 7.2 s by the
    dispatcher's lag. At the receiver, per 0.5 s, the first attempts ``[453, 256,
    291]`` came back as ``[52, 128, 203, 193, 204, 142, 70, 8]``. The healthy tenant (10
    messages/s to 5 endpoints): 50.1-50.4 deliveries/s through the storm, publish to
    arrival p50 / p99 9-17 / 38-108 ms before it and 13-20 / 43-133 ms while the
    retries ran, but up to 1.0-1.7 s for a message published during the 1,000 first
    attempts.

    Loaded machine (two runs, load average 17-18 on 2 cores): the dispatcher's schedule
    stays exact, min 4.801-4.807 max 7.199 s, per 0.3 s ``[139, 108, 122, 128, 145,
    116, 128, 114]`` and ``[132, 134, 134, 129, 118, 108, 117, 128]``; the 1,000 first
    attempts take 12 s (64 a lease), so the retries arrive late (median 8.3-11.3 s
    after the failure) and as fast as the dispatcher gets CPU. The healthy tenant keeps
    its rate (45.1 of 45.6/s and 49.7 of 50.1/s published) but not its latency: p50 9-16
    s for a message published during the first attempts, 1.6-7.3 s during the
    retries, because leases take due rows in order (the tenant share caps a tenant's
    slots, not that order)."""
    async with Server() as server:
        for t in range(TENANTS):
            for i in range(PER_TENANT):
                await endpoint(
                    box,
                    server.url(f"/fail/{t}/{i}"),
                    tenant=f"bad{t}",
                    event_types=["order.failing"],
                )
        for i in range(HEALTHY):
            await endpoint(box, server.url(f"/ok/{i}"), tenant="good", event_types=["order.ok"])

        published: dict[str, float] = {}  # healthy message id -> when published
        scheduled: dict[int, float] = {}  # failing delivery -> its retry's delay
        stop_healthy = asyncio.Event()

        async def healthy_stream() -> None:
            n = 0
            start = time.monotonic()
            while not stop_healthy.is_set():
                message = await publish_one(box, "order.ok", {"n": n}, tenant="good")
                published[message.id] = time.monotonic()
                n += 1
                await asyncio.sleep(max(0.0, start + n / HEALTHY_RATE - time.monotonic()))

        dispatcher = box.dispatcher()
        running = asyncio.create_task(dispatcher.run())
        stream = asyncio.create_task(healthy_stream())
        try:
            await asyncio.sleep(2.0)  # the healthy rate alone
            storm_at = time.monotonic()
            for t in range(TENANTS):
                await publish_one(box, "order.failing", {"t": t}, tenant=f"bad{t}")
            deadline = storm_at + DELAY * (1 + JITTER) + 60
            while time.monotonic() < deadline:
                scheduled.update(await first_schedules(box))
                firsts = Counter(p for p, _ in server.seen if p.startswith("/fail/"))
                if len(firsts) == TENANTS * PER_TENANT and min(firsts.values()) >= 2:
                    break
                await asyncio.sleep(0.2)
            ended_at = time.monotonic()
            stop_healthy.set()
            await stream
            for _ in range(100):  # the last healthy deliveries
                delivered = Counter(i for i in server.ids if i in published)
                if len(delivered) == len(published) and min(delivered.values()) >= HEALTHY:
                    break
                await asyncio.sleep(0.1)
        finally:
            dispatcher.stop()
            await asyncio.wait_for(running, 30)
            await dispatcher.close()

    arrivals: dict[str, list[float]] = defaultdict(list)
    for path, at in server.seen:
        arrivals[path].append(at)
    failing = {p: ts for p, ts in arrivals.items() if p.startswith("/fail/")}
    assert len(failing) == TENANTS * PER_TENANT
    assert all(len(ts) >= 2 for ts in failing.values()), "a failing endpoint was not retried"

    # 1. The dispatcher scheduled each retry DELAY ± JITTER after the failure, evenly
    # over that window (a clumped jitter, or none, would put most in one or two bins).
    low, high = DELAY * (1 - JITTER), DELAY * (1 + JITTER)
    planned = sorted(scheduled.values())
    bins = histogram(planned, low, high, 8)
    print(
        f"\nscheduled retry delays: {len(planned)}, min {planned[0]:.3f} max {planned[-1]:.3f}"
        f" s; per 0.3 s from {low:g} s: {bins}"
    )
    assert len(planned) == TENANTS * PER_TENANT
    assert low - 0.01 <= planned[0] and planned[-1] <= high + 0.01
    share = len(planned) / 8
    assert all(0.55 * share <= n <= 1.45 * share for n in bins), bins
    assert statistics.pstdev(planned) > 0.8 * (high - low) / (12**0.5)  # uniform's: 0.69 s

    # 2. At the receiver: each retry came no sooner than planned, and after the lag of
    # a busy dispatcher (a poll, a lease behind the others due then).
    actual = sorted(ts[1] - ts[0] for ts in failing.values())
    assert actual[0] >= low - 0.05, actual[0]
    later = histogram([d for d in actual if d < high], low, high, 8)
    print(
        f"arrived retry delays: min {actual[0]:.2f} median {statistics.median(actual):.2f}"
        f" max {actual[-1]:.2f} s; per 0.3 s from {low:g} s: {later},"
        f" later than {high:g} s: {sum(d >= high for d in actual)}"
    )
    firsts = sorted(ts[0] for ts in failing.values())
    retries = sorted(ts[1] for ts in failing.values())
    per_half = [
        [n for _, n in sorted(Counter(int((t - ts[0]) / 0.5) for t in ts).items())]
        for ts in (firsts, retries)
    ]
    print(f"first attempts per 0.5 s: {per_half[0]}; retries per 0.5 s: {per_half[1]}")

    # 3. The healthy tenant kept its rate: every message delivered to all five of its
    # endpoints, at the rate they were published, before, during and after the storm.
    healthy = [(p, at) for p, at in server.seen if p.startswith("/ok/")]
    by_endpoint = Counter(p for p, _ in healthy)
    assert len(by_endpoint) == HEALTHY
    assert min(by_endpoint.values()) >= len(published), by_endpoint
    sent_during = sum(storm_at <= at <= ended_at for at in published.values())
    during = [at for _, at in healthy if storm_at <= at <= ended_at]
    seconds = ended_at - storm_at
    rate, offered = len(during) / seconds, sent_during * HEALTHY / seconds
    print(f"healthy deliveries during the storm: {rate:.1f}/s (published: {offered:.1f}/s)")
    assert rate >= 0.85 * offered
    # Latency, shown, not held: a healthy message published while the 1,000 first
    # attempts (or their retries) are due waits behind them: leases take due rows in
    # order, and the tenant share caps a tenant's slots, not that order.
    burst_end = firsts[-1]
    latency: dict[str, list[float]] = {"before": [], "burst": [], "retries": []}
    for (path, at), message_id in zip(server.seen, server.ids, strict=True):
        if path.startswith("/ok/") and message_id in published:
            sent = published[message_id]
            phase = "before" if sent < storm_at else "burst" if sent < burst_end else "retries"
            latency[phase].append(at - sent)
    for phase, values in latency.items():
        values.sort()
        print(
            f"healthy publish-to-arrival, {phase}: p50 {statistics.median(values) * 1000:.0f}"
            f" p99 {values[int(0.99 * (len(values) - 1))] * 1000:.0f}"
            f" max {values[-1] * 1000:.0f} ms ({len(values)})"
        )
