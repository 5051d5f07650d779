"""Dispatch: N outbox rows (20 endpoints, 5 in flight each = 100 in flight) delivered
by ``relaybox dispatch`` to a local sink answering 200 (uvicorn, its own process and
core), against a pooled bare aiohttp loop (100 workers taking the same bodies from
one iterator, on uvloop, each request signed with the Standard Webhooks headers
relaybox sends), the same loop unsigned, and httpx; then the same with 1 of the 20
endpoints hanging; then both senders again against an aiohttp sink, which needs
twice the CPU per request (bench/sink.py)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import subprocess
import sys
import time
from typing import Any

import aiohttp
import asyncpg

from bench.common import (
    ROOT,
    children_create_databases,
    free_port,
    fresh_pg_database,
    merged,
    table,
    verdict,
)
from relaybox.outbound.signing import sign

ENDPOINTS = 20
IN_FLIGHT = 5
N = int(os.environ.get("BENCH_DISPATCH_N", "0"))  # rows (default 20,000; 2,000 with --quick)
GOAL = 0.8
"""relaybox's delivery rate, at least this share of the pooled bare loop's."""
ONLY = os.environ.get("BENCH_DISPATCH_ONLY", "")  # e.g. "aiohttp,relaybox": a subset of runs


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_sink(port: int, kind: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        ["taskset", "-c", "1", sys.executable, "-m", "bench.sink", str(port), kind], cwd=ROOT
    )
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            import urllib.request

            urllib.request.urlopen(
                urllib.request.Request(f"http://127.0.0.1:{port}/ok/x", data=b"{}"), timeout=1
            )
            return proc
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("sink did not start")


async def seed(url: str, port: int, n: int, hanging: bool) -> None:
    from relaybox.outbound.vault import new_key

    os.environ["RELAYBOX_DATABASE_URL"] = url
    # PostgreSQL stores endpoint secrets sealed with a configured key: this process
    # and the `relaybox dispatch` it starts (its environment is copied) share one.
    os.environ.setdefault("RELAYBOX_OUTBOUND__SECRETS_KEY", new_key())
    subprocess.run(
        [sys.executable, "-m", "relaybox", "migrate", "--database-url", url],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    from bench.dispatch_app import box
    from relaybox.outbound.endpoints import EndpointSpec, create_endpoint

    box.settings = box.settings.model_copy(update={"database_url": url})
    for i in range(ENDPOINTS):
        path = "hang" if hanging and i == 0 else "ok"
        await create_endpoint(
            box,
            "bench",
            EndpointSpec(
                url=f"http://127.0.0.1:{port}/{path}/{i}",
                event_types=[f"bench.e{i}"],
                max_in_flight=IN_FLIGHT,
                timeout=5.0,
            ),
        )
    per = n // ENDPOINTS
    for start in range(0, per, 250):
        async with box.store.transaction() as conn:
            for j in range(start, min(per, start + 250)):
                for i in range(ENDPOINTS):
                    await box.publish(conn, f"bench.e{i}", {"n": j, "endpoint": i}, tenant="bench")
    await box.close()


def sink_note(cpu: float, wall: float, requests: int) -> str:
    """The sink's CPU per request and how busy its core was: a sink near 100 % limits
    the sender measured."""
    if wall <= 0 or requests <= 0:
        return ""
    return f", sink {cpu / requests * 1e6:.0f} µs/request, its core {cpu / wall:.0%} busy"


async def relaybox_run(
    n: int, sink_kind: str, hanging: bool = False, otel: dict[str, str] | None = None
) -> dict[str, Any]:
    """``otel``: the dispatcher's ``OTEL_*`` environment (bench/otel.py), if traced."""
    port = free_port()
    sink = start_sink(port, sink_kind)
    url = fresh_pg_database(f"dispatch_{int(hanging)}")
    try:
        await seed(url, port, n, hanging)
        healthy = n - (n // ENDPOINTS if hanging else 0)
        env = {**os.environ, "RELAYBOX_DATABASE_URL": url, "RELAYBOX_LOG_LEVEL": "warning"}
        env.update(otel or {})
        proc = subprocess.Popen(
            [
                "taskset",
                "-c",
                "0",
                sys.executable,
                "-m",
                "relaybox",
                "dispatch",
                "--app",
                "bench.dispatch_app:box",
                "--concurrency",
                "100",
            ],
            cwd=ROOT,
            env=env,
        )
        conn = await asyncpg.connect(url)
        count = "SELECT count(*) FROM relaybox_outbox WHERE status = 'sent'"
        try:
            deadline = time.time() + 600
            # CPU of the dispatcher process (taskset execs it: same pid) from its first
            # delivery seen to its last: startup and imports are not counted.
            # Likewise the PostgreSQL backends serving it (same machine): the database's
            # share of a delivery, which the bare loops do not pay.
            backends = (
                "SELECT pid FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            first: tuple[int, float, dict[int, float]] | None = None
            sink_start = (0.0, 0.0)  # the sink's CPU and the clock at the first delivery
            while (sent := await conn.fetchval(count)) < healthy:
                if time.time() > deadline or proc.poll() is not None:
                    raise RuntimeError("dispatcher did not deliver everything")
                if first is None and sent > 0:
                    pg = {r[0]: cpu_seconds(r[0]) for r in await conn.fetch(backends)}
                    first = (sent, cpu_seconds(proc.pid), pg)
                    sink_start = (cpu_seconds(sink.pid), time.perf_counter())
                await asyncio.sleep(0.05 if first is None else 0.2)
            cpu = cpu_seconds(proc.pid)
            sink_busy = sink_note(
                cpu_seconds(sink.pid) - sink_start[0],
                time.perf_counter() - sink_start[1],
                sent - (first[0] if first else 0),
            )
            pg_cpu = 0.0
            for (pid,) in await conn.fetch(backends):
                with contextlib.suppress(OSError):
                    pg_cpu += cpu_seconds(pid) - (first[2].get(pid, 0.0) if first else 0.0)
            if first is not None and sent > first[0]:
                per = (cpu - first[1]) / (sent - first[0]) * 1e6
                per_pg = pg_cpu / (sent - first[0]) * 1e6
                cpu_note = f", {per:.0f} µs CPU/delivery (+ PostgreSQL {per_pg:.0f} µs){sink_busy}"
            else:
                cpu_note = ""
            span = await conn.fetchval(
                "SELECT max(sent_at) - min(sent_at) FROM relaybox_outbox WHERE status = 'sent'"
            )
        finally:
            await conn.close()
            proc.terminate()
            proc.wait(30)
    finally:
        sink.kill()  # hanging handlers would hold a graceful stop for a minute
        sink.wait(10)
    return {
        "rate": healthy / span,
        "note": f"{healthy} delivered to healthy endpoints{cpu_note}",
        "cpu_us": per if first is not None and sent > first[0] else float("nan"),
    }


def bodies(n: int) -> list[bytes]:
    return [
        json.dumps(
            {
                "id": f"msg_{j}",
                "type": "bench.e",
                "timestamp": "2026-11-30T00:00:00Z",
                "data": {"n": j},
                "apiVersion": "v1",
            }
        ).encode()
        for j in range(n)
    ]


WORKERS = ENDPOINTS * IN_FLIGHT
"""Requests in flight in the bare loops: as many as relaybox's 20 endpoints x 5."""


async def pooled(post: Any, payloads: list[bytes]) -> None:
    """The pooled bare loop: ``WORKERS`` tasks taking the next body from one shared
    iterator until it runs out. No task per request and no semaphore: 100 tasks for
    the whole run, the least a sender with 100 requests in flight can do."""
    work = iter(enumerate(payloads))

    async def worker() -> None:
        for j, body in work:  # one iterator: each body is taken by exactly one worker
            await post(j, body)

    await asyncio.gather(*(worker() for _ in range(WORKERS)))


FLOOR_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def signed(j: int, body: bytes) -> dict[str, str]:
    """The headers a pooled loop sends with body ``j``: what relaybox sends with each
    webhook (``webhook-id`` of a message id's length, ``webhook-timestamp``, the
    Standard Webhooks HMAC signature, made by relaybox's own signing code, and the
    content type). Signing is part of the job, as verifying is part of accept's floor;
    ``signing=False`` runs leave it out (the floor before 2026-12-06)."""
    headers = sign(
        msg_id=f"msg_{j:026d}", timestamp=int(time.time()), body=body, secrets=[FLOOR_SECRET]
    )
    headers["Content-Type"] = "application/json"
    return headers


async def aiohttp_run(n: int, sink_kind: str, signing: bool = True) -> dict[str, Any]:
    port = free_port()
    sink = start_sink(port, sink_kind)
    try:
        payloads = bodies(n)
        connector = aiohttp.TCPConnector(limit=WORKERS)
        plain = {"content-type": "application/json"}
        async with aiohttp.ClientSession(connector=connector) as http:

            async def post(j: int, body: bytes) -> None:
                async with http.post(
                    f"http://127.0.0.1:{port}/ok/{j % ENDPOINTS}",
                    data=body,
                    headers=signed(j, body) if signing else plain,
                ) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"sink answered {r.status}")

            started, cpu = time.perf_counter(), time.process_time()
            sink_cpu = cpu_seconds(sink.pid)
            await pooled(post, payloads)
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
            sink_cpu = cpu_seconds(sink.pid) - sink_cpu
    finally:
        sink.kill()  # hanging handlers would hold a graceful stop for a minute
        sink.wait(10)
    per = cpu / n * 1e6
    note = (
        f"pooled bare aiohttp, {WORKERS} workers, {'signed' if signing else 'unsigned'},"
        f" {per:.0f} µs CPU/request"
        f"{sink_note(sink_cpu, elapsed, n)}"
    )
    return {"rate": n / elapsed, "note": note}


FLOOR_OUTBOX = """
CREATE TABLE floor_outbox (
    id BIGINT PRIMARY KEY, endpoint INT NOT NULL, body BYTEA NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending', sent_at TIMESTAMPTZ
);
CREATE INDEX floor_outbox_pending ON floor_outbox (id) WHERE status = 'pending'
"""
"""The durable loop's outbox: a row per message, pending until its 2xx is recorded."""

_CLAIM = """
UPDATE floor_outbox SET status = 'sending' WHERE id IN (
    SELECT id FROM floor_outbox WHERE status = 'pending' ORDER BY id
    LIMIT $1 FOR UPDATE SKIP LOCKED
) RETURNING id, endpoint, body
"""
_SENT = "UPDATE floor_outbox SET status = 'sent', sent_at = now() WHERE id = ANY($1::bigint[])"


async def durable_run(n: int, sink_kind: str) -> dict[str, Any]:
    """The pooled loop with the least that makes it an outbox: the bodies are rows in
    PostgreSQL, claimed ``2 x WORKERS`` at a time in one statement (``SKIP LOCKED``,
    so senders can run side by side) whenever fewer than ``WORKERS`` wait, and each
    2xx is recorded (one ``UPDATE … = ANY`` for every success finished meanwhile,
    one at a time). No attempt log, no retries, no per-endpoint cap."""
    port = free_port()
    sink = start_sink(port, sink_kind)
    url = fresh_pg_database("dispatch_floor")
    try:
        pool = await asyncpg.create_pool(url, min_size=3, max_size=3)
        async with pool.acquire() as conn:
            await conn.execute(FLOOR_OUTBOX)
            await conn.copy_records_to_table(
                "floor_outbox",
                records=[(j, j % ENDPOINTS, body) for j, body in enumerate(bodies(n))],
                columns=["id", "endpoint", "body"],
            )
        waiting: collections.deque[Any] = collections.deque()
        refilled = asyncio.Event()
        sent: list[int] = []
        tasks: dict[str, asyncio.Task[None] | None] = {"claim": None, "record": None}
        claimed = 0

        async def claim() -> None:
            nonlocal claimed
            try:
                rows = await pool.fetch(_CLAIM, 2 * WORKERS)
                if not rows:  # one sender on a table of its own: never, unless rows went
                    raise RuntimeError(f"the outbox loop claimed nothing after {claimed} of {n}")
                claimed += len(rows)
                waiting.extend(rows)
            finally:
                refilled.set()  # also when the claim failed: the workers raise its error

        async def record() -> None:
            while sent:
                ids = sent[:]
                del sent[:]
                await pool.execute(_SENT, ids)

        def start(name: str, job: Any) -> None:
            task = tasks[name]
            if task is None or task.done():
                tasks[name] = asyncio.create_task(job())

        connector = aiohttp.TCPConnector(limit=WORKERS)
        async with aiohttp.ClientSession(connector=connector) as http:

            async def worker() -> None:
                while True:
                    if len(waiting) < WORKERS and claimed < n:
                        start("claim", claim)
                    if not waiting:
                        if claimed >= n:
                            return
                        refilled.clear()
                        await refilled.wait()
                        if (claiming := tasks["claim"]) is not None and claiming.done():
                            claiming.result()  # a failed claim's error, not a wait forever
                        continue
                    j, endpoint, body = waiting.popleft()
                    async with http.post(
                        f"http://127.0.0.1:{port}/ok/{endpoint}",
                        data=body,
                        headers=signed(j, body),
                    ) as r:
                        await r.read()
                        if r.status != 200:
                            raise RuntimeError(f"sink answered {r.status}")
                    sent.append(j)
                    start("record", record)

            started, cpu = time.perf_counter(), time.process_time()
            sink_cpu = cpu_seconds(sink.pid)
            await asyncio.gather(*(worker() for _ in range(WORKERS)))
            if (task := tasks["record"]) is not None:
                await task  # the last successes, recorded before the clock stops
            await record()
            elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
            sink_cpu = cpu_seconds(sink.pid) - sink_cpu
        recorded = await pool.fetchval("SELECT count(*) FROM floor_outbox WHERE status = 'sent'")
        await pool.close()
        if recorded != n:
            raise RuntimeError(f"the durable loop recorded {recorded} of {n} sends")
    finally:
        sink.kill()
        sink.wait(10)
    note = (
        f"pooled aiohttp loop over a PostgreSQL outbox, {WORKERS} workers, signed,"
        f" {cpu / n * 1e6:.0f} µs CPU/request{sink_note(sink_cpu, elapsed, n)}"
    )
    return {"rate": n / elapsed, "note": note}


async def httpx_run(n: int, sink_kind: str) -> dict[str, Any]:
    import httpx

    port = free_port()
    sink = start_sink(port, sink_kind)
    try:
        payloads = bodies(n)
        limits = httpx.Limits(max_connections=WORKERS, max_keepalive_connections=WORKERS)
        async with httpx.AsyncClient(limits=limits) as http:

            async def post(j: int, body: bytes) -> None:
                r = await http.post(
                    f"http://127.0.0.1:{port}/ok/{j % ENDPOINTS}",
                    content=body,
                    headers=signed(j, body),
                )
                if r.status_code != 200:
                    raise RuntimeError(f"sink answered {r.status_code}")

            started = time.perf_counter()
            await pooled(post, payloads)
            elapsed = time.perf_counter() - started
    finally:
        sink.kill()  # hanging handlers would hold a graceful stop for a minute
        sink.wait(10)
    note = f"pooled bare httpx, {WORKERS} workers, signed ({n} requests)"
    return {"rate": n / elapsed, "note": note}


def run_child(
    which: str,
    n: int,
    options: dict[str, Any],
    loop: str = "asyncio",
    sink: str = "uvicorn",
) -> dict[str, Any]:
    """Each measurement in its own process, pinned to core 0 (the sink has core 1), on
    ``loop``: ``uvloop`` (what ``relaybox dispatch`` runs on) or the plain ``asyncio``;
    ``sink``: the receiver (bench/sink.py); ``options``: the runner's keywords
    (``hanging`` for relaybox, ``signing`` for the pooled aiohttp loop)."""
    children_create_databases()
    out = subprocess.run(
        [
            "taskset",
            "-c",
            "0",
            sys.executable,
            "-c",
            "import asyncio, json, sys, uvloop; from bench import dispatch as d; "
            f"run = {loop}.run; "
            "args, kwargs = json.loads(sys.argv[1]); "
            f"print('RESULT', json.dumps(run(d.{which}(*args, **kwargs))))",
            json.dumps([[n, sink], options]),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,  # stderr passes through: a failing run shows its traceback
        text=True,
    )
    if out.returncode != 0 or "RESULT " not in out.stdout:
        raise RuntimeError(
            f"dispatch runner {which} ({loop} loop, {sink} sink) failed with exit code"
            f" {out.returncode}: its traceback is above\n{out.stdout}"
        )
    return json.loads(out.stdout.rsplit("RESULT ", 1)[1])


def main(*, quick: bool = False) -> str:
    n = N or (2_000 if quick else 20_000)
    # The runners alternate, in reverse order every other round (a drift of the VM
    # during a round then favours none of them); medians. Single runs here swing by
    # ±15 %: with 2 rounds the hanging endpoint's cost read 4 % in one run and 10 % in
    # the next (2026-12-02).
    rounds = 1 if quick else 3
    # (name, child, rows, options, loop, sink); each row's ratio is against the bare
    # loop on uvloop on the same sink.
    signing, unsigned, hanging = {"signing": True}, {"signing": False}, {"hanging": True}
    runners: tuple[tuple[str, str, int, dict[str, Any], str, str], ...] = (
        # The base: the pooled bare loop on uvloop, the loop `relaybox dispatch` runs
        # on, signing each request as relaybox does (a second row shows it on the
        # plain asyncio loop, a third without the signature).
        ("pooled aiohttp loop", "aiohttp_run", n, signing, "uvloop", "uvicorn"),
        ("pooled aiohttp loop, asyncio loop", "aiohttp_run", n, signing, "asyncio", "uvicorn"),
        ("pooled aiohttp loop, unsigned", "aiohttp_run", n, unsigned, "uvloop", "uvicorn"),
        # The same loop sending from a PostgreSQL outbox (claims, successes recorded):
        # the least a durable sender adds to the base.
        ("pooled loop over an outbox", "durable_run", n, {}, "uvloop", "uvicorn"),
        ("relaybox dispatch", "relaybox_run", n, {}, "asyncio", "uvicorn"),  # on uvloop
        ("relaybox, 1 of 20 endpoints hanging", "relaybox_run", n, hanging, "asyncio", "uvicorn"),
        ("pooled httpx loop", "httpx_run", max(500, n // 10), {}, "uvloop", "uvicorn"),
        # The same two senders against aiohttp's web server as the receiver (2.4 times
        # the CPU per request: relaybox loses more there, bench/RUNS.md "The sink").
        ("pooled aiohttp loop, aiohttp sink", "aiohttp_run", n, signing, "uvloop", "aiohttp"),
        ("relaybox dispatch, aiohttp sink", "relaybox_run", n, {}, "asyncio", "aiohttp"),
    )
    runs: dict[str, list[dict[str, Any]]] = {}
    for round_ in range(rounds):
        for name, which, count, options, loop, sink in runners[:: -1 if round_ % 2 else 1]:
            if ONLY and not any(word.strip() and word.strip() in name for word in ONLY.split(",")):
                continue
            if round_ and "httpx" in name:
                continue  # once: it only confirms the collapse
            r = run_child(which, count, options, loop, sink)
            runs.setdefault(name, []).append(r)
            print(f"  dispatch {name:38} {r['rate']:8.0f}/s  {r['note']}", flush=True)
    results = {name: merged(rs) for name, rs in runs.items()}
    nan = {"rate": float("nan")}
    bases = {"uvicorn": "pooled aiohttp loop", "aiohttp": "pooled aiohttp loop, aiohttp sink"}
    against = {name: bases[sink] for name, *_, sink in runners}
    mine = results.get("relaybox dispatch", nan)["rate"]
    durable = results.get("pooled loop over an outbox", nan)["rate"]
    rows = [
        [
            k,
            r["rate"],
            f"{r['rate'] / results.get(against[k], nan)['rate']:.2f}",
            f"{r['rate'] / durable:.2f}" if against[k] == bases["uvicorn"] else "",
            f"{r['rate'] / mine:.2f}",
            verdict(r["rate"] / results.get(against[k], nan)["rate"], GOAL, "x pooled loop")
            if k == "relaybox dispatch"
            else "",
            r["note"],
        ]
        for k, r in results.items()
    ]
    return table(
        f"dispatch: {n:,} deliveries to a local 200 sink (uvicorn; the last two rows aiohttp),"
        f" {ENDPOINTS} endpoints x {IN_FLIGHT} in flight, {rounds} round(s), medians",
        [
            "sender",
            "deliveries/s",
            "x pooled loop (same sink)",
            "x loop over an outbox",
            "x relaybox",
            "goal",
            "note",
        ],
        rows,
    )
