"""Slow endpoints: 2,000 endpoints answering after 50-500 ms (one sink process,
``bench/sink.py`` KIND ``record``, that waits per endpoint path), 2,000 deliveries in
flight (``relaybox dispatch --concurrency 2000``, one in flight per endpoint).

Endpoint ``i`` answers after ``d_i`` ms, spread evenly over 50-500, and gets
``round(T / d_i)`` rows, so that every endpoint has ``T`` seconds of work: one in
flight per endpoint then finishes all of them together, and the same rows in one
iterator shared by 2,000 pooled workers (the floor: a bare aiohttp loop on uvloop, one
session, no per-endpoint cap) have the same ideal time, ``T``. Without that shaping
the floor, which ignores the per-endpoint cap, would finish while relaybox still
works through its slowest endpoints' rows one by one: a different job.

Rows: relaybox's rate against the floor's on the same sink (goal >= 0.8x), the
dispatcher's peak RSS (goal < 250 MB), and the same run with every 10th endpoint
hanging until the attempt timeout: the healthy endpoints' time against the run
without hanging ones (goal: they lose < 10 %).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

import aiohttp

from bench.common import ROOT, free_port, fresh_pg_database, table
from bench.dispatch import bodies, cpu_seconds, signed, start_sink

GOAL_RATE = 0.8
GOAL_RSS_MB = 250
GOAL_LOSS = 0.10


def layout(endpoints: int, seconds: float) -> list[tuple[int, int]]:
    """(delay ms, rows) per endpoint: delays evenly over 50-500 ms, rows ~T / delay."""
    out = []
    for i in range(endpoints):
        delay = 50 + round(450 * i / max(endpoints - 1, 1))
        out.append((delay, max(1, round(seconds * 1000 / delay))))
    return out


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def seed(url: str, port: int, plan: list[tuple[int, int]], hanging: bool) -> int:
    """Endpoints and rows; returns the healthy rows."""
    from relaybox.outbound.vault import new_key

    os.environ["RELAYBOX_DATABASE_URL"] = url
    os.environ.setdefault("RELAYBOX_OUTBOUND__SECRETS_KEY", new_key())
    subprocess.run(
        [sys.executable, "-m", "relaybox", "migrate", "--database-url", url],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    from bench.slow_app import box
    from relaybox.outbound.endpoints import EndpointSpec, create_endpoint

    box.settings = box.settings.model_copy(update={"database_url": url})
    healthy = 0
    for i, (delay, rows) in enumerate(plan):
        hang = hanging and i % 10 == 0
        path = f"hang/{i}" if hang else f"slow/{delay}/{i}"
        spec = EndpointSpec(
            url=f"http://127.0.0.1:{port}/{path}",
            event_types=[f"slow.e{i}"],
            max_in_flight=1,
            timeout=5.0,
        )
        await create_endpoint(box, "bench", spec)
        healthy += 0 if hang else rows
    pending = [(i, j) for i, (_, rows) in enumerate(plan) for j in range(rows)]
    for start in range(0, len(pending), 500):
        async with box.store.transaction() as conn:
            for i, j in pending[start : start + 500]:
                await box.publish(conn, f"slow.e{i}", {"n": j}, tenant="bench")
    await box.close()
    return healthy


async def relaybox_run(endpoints: int, seconds: float, hanging: bool) -> dict[str, Any]:
    import asyncpg

    plan = layout(endpoints, seconds)
    port = free_port()
    sink = start_sink(port, "record")
    url = fresh_pg_database(f"slow_{int(hanging)}")
    try:
        healthy = await seed(url, port, plan, hanging)
        # error: the hanging endpoints' timeouts are warnings, one line each
        env = {**os.environ, "RELAYBOX_DATABASE_URL": url, "RELAYBOX_LOG_LEVEL": "error"}
        proc = subprocess.Popen(
            ["taskset", "-c", "0", sys.executable, "-m", "relaybox", "dispatch",
             "--app", "bench.slow_app:box", "--concurrency", str(endpoints)],
            cwd=ROOT, env=env,
        )  # fmt: skip
        conn = await asyncpg.connect(url)
        sent = (
            "SELECT count(*) FROM relaybox_outbox o JOIN relaybox_endpoints e"
            " ON e.id = o.endpoint_id WHERE o.status = 'sent' AND e.url NOT LIKE '%/hang/%'"
        )
        peak_rss = 0.0
        try:
            deadline = time.time() + 600
            cpu0 = None
            while (n := await conn.fetchval(sent)) < healthy:
                if time.time() > deadline or proc.poll() is not None:
                    raise RuntimeError("slow bench: the dispatcher did not deliver everything")
                if cpu0 is None and n:
                    cpu0 = (n, cpu_seconds(proc.pid))
                peak_rss = max(peak_rss, rss_mb(proc.pid))
                await asyncio.sleep(0.2)
            peak_rss = max(peak_rss, rss_mb(proc.pid))
            cpu = (cpu_seconds(proc.pid) - cpu0[1]) / max(n - cpu0[0], 1) if cpu0 else 0.0
            span = await conn.fetchval(
                "SELECT max(sent_at) - min(sent_at) FROM relaybox_outbox o"
                " JOIN relaybox_endpoints e ON e.id = o.endpoint_id"
                " WHERE o.status = 'sent' AND e.url NOT LIKE '%/hang/%'"
            )
        finally:
            await conn.close()
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    finally:
        sink.kill()  # hanging handlers would hold a graceful stop
        sink.wait(10)
    return {
        "rate": healthy / span,
        "span": span,
        "rss": peak_rss,
        "note": f"{healthy:,} delivered to healthy endpoints, {cpu * 1e6:.0f} µs CPU/delivery,"
        f" dispatcher RSS peak {peak_rss:.0f} MB",
    }


async def aiohttp_run(endpoints: int, seconds: float) -> dict[str, Any]:
    """The floor: ``endpoints`` workers sharing one iterator of every row (round robin
    over the endpoints), one aiohttp session, on uvloop, each request signed as
    relaybox signs its webhooks (:func:`bench.dispatch.signed`)."""
    plan = layout(endpoints, seconds)
    port = free_port()
    sink = start_sink(port, "record")
    try:
        urls = [
            f"http://127.0.0.1:{port}/slow/{delay}/{i}"
            for j in range(max(rows for _, rows in plan))
            for i, (delay, rows) in enumerate(plan)
            if j < rows
        ]
        payloads = bodies(len(urls))
        work = enumerate(zip(urls, payloads, strict=True))
        connector = aiohttp.TCPConnector(limit=endpoints)
        async with aiohttp.ClientSession(connector=connector) as http:

            async def worker() -> None:
                for j, (target, body) in work:
                    async with http.post(target, data=body, headers=signed(j, body)) as r:
                        await r.read()
                        if r.status != 200:
                            raise RuntimeError(f"sink answered {r.status}")

            started, cpu = time.perf_counter(), time.process_time()
            await asyncio.gather(*(worker() for _ in range(endpoints)))
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    finally:
        sink.kill()
        sink.wait(10)
    return {
        "rate": len(urls) / elapsed,
        "span": elapsed,
        "note": f"{len(urls):,} requests, {endpoints:,} pooled workers,"
        f" {cpu / len(urls) * 1e6:.0f} µs CPU/request",
    }


def run_child(which: str, *args: Any) -> dict[str, Any]:
    """Each measurement in its own process on core 0 (the sink has core 1), on uvloop."""
    out = subprocess.run(
        ["taskset", "-c", "0", sys.executable, "-c",
         "import json, sys, uvloop; from bench import slow; "
         f"print('RESULT', json.dumps(uvloop.run(slow.{which}(*json.loads(sys.argv[1])))))",
         json.dumps(list(args))],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    if out.returncode != 0 or "RESULT " not in out.stdout:
        raise RuntimeError(f"slow runner {which} failed ({out.returncode}): traceback above")
    result: dict[str, Any] = json.loads(out.stdout.rsplit("RESULT ", 1)[1])
    return result


def main(*, quick: bool = False) -> str:
    from bench.common import children_create_databases

    children_create_databases()
    endpoints = int(os.environ.get("BENCH_SLOW_ENDPOINTS", "0")) or (200 if quick else 2_000)
    seconds = 1.0 if quick else 2.0
    floor = run_child("aiohttp_run", endpoints, seconds)
    print(f"  slow pooled aiohttp loop        {floor['rate']:8.0f}/s  {floor['note']}", flush=True)
    mine = run_child("relaybox_run", endpoints, seconds, False)
    print(f"  slow relaybox dispatch          {mine['rate']:8.0f}/s  {mine['note']}", flush=True)
    hung = run_child("relaybox_run", endpoints, seconds, True)
    print(f"  slow relaybox, 10 % hanging     {hung['rate']:8.0f}/s  {hung['note']}", flush=True)
    ratio = mine["rate"] / floor["rate"]
    kept = mine["span"] / hung["span"]  # healthy endpoints' time without / with hanging ones
    rows = [
        ["pooled aiohttp loop", floor["rate"], "1.00", "", floor["note"]],
        ["relaybox dispatch", mine["rate"], f"{ratio:.2f}",
         f"{ratio:.2f} x pooled loop >= {GOAL_RATE:g}: {'met' if ratio >= GOAL_RATE else 'MISSED'};"
         f" RSS {mine['rss']:.0f} MB < {GOAL_RSS_MB}:"
         f" {'met' if mine['rss'] < GOAL_RSS_MB else 'MISSED'}",
         mine["note"]],
        ["relaybox, every 10th endpoint hanging", hung["rate"],
         f"{hung['rate'] / floor['rate']:.2f}",
         f"healthy lose {1 - kept:.1%} < {GOAL_LOSS:.0%}:"
         f" {'met' if 1 - kept < GOAL_LOSS else 'MISSED'}",
         hung["note"] + f"; the healthy endpoints took {hung['span']:.2f} s,"
         f" {mine['span']:.2f} s with none hanging"],
    ]  # fmt: skip
    return table(
        f"slow: {endpoints:,} endpoints answering after 50-500 ms, {endpoints:,} in flight"
        f" (one per endpoint), ~{seconds:g} s of work per endpoint; hanging: 5 s attempt timeout",
        ["sender", "deliveries/s", "x pooled loop", "goal", "note"],
        rows,
    )
