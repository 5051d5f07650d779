"""Latency where users feel it, at half of the measured peak (not at full load, where
every queue is full and latency only says how long the queues are):

- **accept → handler committed** (PostgreSQL): signed POSTs to ``relaybox serve
  --roles receiver,worker`` (``bench/latency_app.py``: a handler that writes nothing
  of its own); per event from its ``received_at`` to the moment its handler's
  transaction committed (the COMMIT returned: the app's ``after_commit`` hook notes
  it, ``BENCH_COMMITS``). The peak is a burst
  of signed POSTs from 64 pooled senders, first receipt to last completion. Then the
  same with the worker apart: ``relaybox serve --roles receiver`` on core 0 and
  ``relaybox worker`` on core 1 (each its own event loop), with its own peak. In both,
  ``relaybox serve`` runs on core 0 and this process, the sender, on core 1
  (:func:`bench.common.pinned`), as ``wrk`` in ``bench accept``.
- **publish → delivered** (PostgreSQL): ``box.publish`` in this process, one
  transaction each, to 20 endpoints of a local sink (``bench/sink.py``, KIND
  ``record``, its own core) that notes when each ``webhook-id`` arrived; a
  ``relaybox dispatch`` process (its own core) sends. From the message's
  ``created_at`` (its commit included) to its arrival. The path's peak: 16 tasks
  publishing flat out (closed loop) while the dispatcher sends, first commit to last
  arrival; on two cores it is the publisher's (one Python process), far below the
  dispatcher's own, measured first as a backlog of rows published before it starts
  (first to last arrival). Paced at half the path's peak, then at half the
  dispatcher's (which the publisher cannot reach: the row shows the publisher at its
  limit).
- **a retry scheduled 200 ms out** (PostgreSQL): an endpoint answering 500 once per
  message, schedule ``[0.2]``, no jitter: first arrival to second.
- **SQLite, publish from another process → delivered**: the same, on a SQLite file,
  the dispatcher in its own process (the commit watch wakes it), 20 publishes a
  second; and the dispatcher's CPU while idle (what the watch costs).

Both PostgreSQL paths run paced a second time at 200 a second (``LOW_RATE``): what the
path itself takes when the load does not fill the two cores (no goal; context for the
half-peak rows). ``BENCH_PUBLISH_RATE`` sets the first publish rate instead of half the
path's peak.

Paced runs are open loop: arrivals at exponential intervals around the target rate,
each its own task, so a slow answer does not slow the load down.
"""

from __future__ import annotations

import asyncio
import base64
import gc
import hashlib
import hmac
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Any

import aiohttp

from bench.apps import SECRET
from bench.common import ROOT, free_port, fresh_pg_database, fsync_probe, pinned, table
from bench.dispatch import cpu_seconds, start_sink

ENDPOINTS = 20
GOALS = {
    "accept": (5.0, 50.0),  # p50, p99 ms
    "publish": (10.0, 100.0),
    "sqlite": (None, 100.0),
}
RETRY = 0.2
RETRY_SLACK = 0.05
LOW_RATE = 200.0
"""The second paced rate of both PostgreSQL paths: what the path itself takes when the
two cores are not shared with a load near the machine's limit (no goal; context)."""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def relaybox(args: list[str], env: dict[str, str], cpu: int = 0) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["taskset", "-c", str(cpu), sys.executable, "-m", "relaybox", *args],
        cwd=ROOT,
        env={**os.environ, "RELAYBOX_LOG_LEVEL": "warning", **env},
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def migrate(url: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "relaybox", "migrate", "--database-url", url],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )


def arrivals(port: int) -> dict[str, list[float]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/times", timeout=30) as r:
        found: dict[str, list[float]] = json.loads(r.read())
    return found


async def until(check: Callable[[], Awaitable[bool]], within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"latency bench: {what} not within {within:g} s")
        await asyncio.sleep(0.2)


async def delivered(
    port: int, ids: Collection[str], within: float, what: str
) -> dict[str, list[float]]:
    """Wait until each of ``ids`` arrived at the sink; the arrivals then. One look at a
    time (the sink answers each with every arrival so far)."""
    seen: dict[str, list[float]] = {}

    async def check() -> bool:
        nonlocal seen
        seen = arrivals(port)
        return all(i in seen for i in ids)

    await until(check, within, what)
    return seen


async def paced(rate: float, seconds: float, one: Callable[[int], Awaitable[None]]) -> float:
    """``one(n)`` at exponential intervals around ``rate`` a second for ``seconds``,
    each its own task (open loop); returns the rate reached (started / span).

    This process's cyclic garbage collector is off meanwhile: its full collections
    took 90-130 ms here, and the arrivals due during one went out together when it
    ended (~140 requests at once at 1,100/s), a burst that is no part of the load; the
    slowest 1 % of a one-process run were those bursts' events."""
    rng = random.Random(7)
    tasks: list[asyncio.Task[None]] = []
    gc.collect()
    gc.disable()
    try:
        started = time.perf_counter()
        at = 0.0
        while at < seconds:
            delay = started + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(len(tasks))))
            at += rng.expovariate(rate)
        await asyncio.gather(*tasks)
        return len(tasks) / max(time.perf_counter() - started, 1e-9)
    finally:
        gc.enable()


# -- publish -> delivered, retries (one dispatcher process) -----------------------------


async def _endpoints(box: Any, port: int) -> None:
    from relaybox.outbound.endpoints import EndpointSpec, create_endpoint

    for i in range(ENDPOINTS):
        spec = EndpointSpec(
            url=f"http://127.0.0.1:{port}/ok/{i}", event_types=[f"bench.e{i}"], max_in_flight=5
        )
        await create_endpoint(box, "bench", spec)
    flaky = EndpointSpec(
        url=f"http://127.0.0.1:{port}/flaky/0", event_types=["bench.flaky"], schedule=[RETRY]
    )
    await create_endpoint(box, "bench", flaky)


async def _publish(box: Any, event_type: str, n: int) -> tuple[str, float]:
    """Publish in a transaction of its own; the message's id and when ``publish`` was
    called (its ``created_at``, inside the transaction: the latency counts the commit,
    and not the publisher's own queueing for a connection). At most ``PUBLISHERS`` at
    once: the store's pool holds 20 connections and gives up on a wait of 5 s, and an
    open loop on a loaded machine would otherwise queue past that."""
    async with _publishers():
        async with box.store.transaction() as conn:
            message = await box.publish(conn, event_type, {"n": n}, tenant="bench")
    return message.id, float(message.created_at)


PUBLISHERS = 16
_gates: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}


def _publishers() -> asyncio.Semaphore:
    """The running loop's gate of ``PUBLISHERS`` places."""
    loop = asyncio.get_running_loop()
    gate = _gates.get(loop)
    if gate is None:
        gate = _gates[loop] = asyncio.Semaphore(PUBLISHERS)
    return gate


async def dispatch_session(url: str, *, quick: bool, sqlite: bool) -> list[list[Any]]:
    """Rows of the table measured with one ``relaybox dispatch`` process on ``url``."""
    from relaybox.outbound.vault import new_key

    # PostgreSQL stores endpoint secrets sealed with a configured key: this process
    # and the `relaybox dispatch` it starts (its environment is copied) share one,
    # read when the application is imported.
    os.environ.setdefault("RELAYBOX_OUTBOUND__SECRETS_KEY", new_key())
    from bench.latency_app import box

    migrate(url)
    port = free_port()
    sink = start_sink(port, "record")
    box.settings = box.settings.model_copy(update={"database_url": url})
    rows: list[list[Any]] = []
    db = "sqlite" if sqlite else "postgres"
    proc = None
    try:
        await _endpoints(box, port)
        peak = float("nan")
        if not sqlite:
            backlog = 500 if quick else 10_000
            ids = []
            for start in range(0, backlog, 250):
                async with box.store.transaction() as conn:
                    for n in range(start, min(backlog, start + 250)):
                        m = await box.publish(
                            conn, f"bench.e{n % ENDPOINTS}", {"n": n}, tenant="bench"
                        )
                        ids.append(m.id)
        # The retry phase's 500s are each logged as a warning, by design: errors only.
        env = {"RELAYBOX_DATABASE_URL": url, "RELAYBOX_LOG_LEVEL": "error"}
        proc = relaybox(
            ["dispatch", "--app", "bench.latency_app:box", "--concurrency", "100"], env, cpu=0
        )
        if not sqlite:
            seen = await delivered(port, ids, 300, "the backlog delivered")
            firsts = [seen[i][0] for i in ids]
            peak = len(ids) / (max(firsts) - min(firsts))
        else:  # the dispatcher is up and idle once a first message went through
            warm, _ = await _publish(box, "bench.e0", -1)

            async def warmed() -> bool:
                return warm in arrivals(port)

            await until(warmed, 120, "the first message delivered")
            await asyncio.sleep(0.5)
            cpu0, t0 = cpu_seconds(proc.pid), time.perf_counter()
            await asyncio.sleep(1.0 if quick else 5.0)
            idle = (cpu_seconds(proc.pid) - cpu0) / (time.perf_counter() - t0)
        path_peak = float("nan")
        if not sqlite:
            # The path's own peak: PUBLISHERS publishing flat out, one transaction each,
            # while the dispatcher sends; first commit to last arrival.
            flat: dict[str, float] = {}
            stop_at = time.perf_counter() + (1.5 if quick else 5.0)

            async def publisher() -> None:
                n = 0
                while time.perf_counter() < stop_at:
                    mid, at = await _publish(box, f"bench.e{n % ENDPOINTS}", n)
                    flat[mid] = at
                    n += 1

            await asyncio.gather(*(publisher() for _ in range(PUBLISHERS)))

            seen = await delivered(port, flat, 120, "the flat-out publishes delivered")
            last = max(seen[m][0] for m in flat)
            path_peak = len(flat) / (last - min(flat.values()))
        # Publishes paced at half the path's peak (SQLite: 20 a second), commit to arrival.
        rate = 20.0 if sqlite else float(os.environ.get("BENCH_PUBLISH_RATE") or path_peak / 2)

        async def phase(rate: float) -> tuple[float, list[float]]:
            committed: dict[str, float] = {}

            async def publish_one(n: int) -> None:
                mid, at = await _publish(box, f"bench.e{n % ENDPOINTS}", n)
                committed[mid] = at

            reached = await paced(rate, 1.5 if quick else 10.0, publish_one)

            seen = await delivered(port, committed, 120, "the paced publishes delivered")
            return reached, [(seen[m][0] - at) * 1000 for m, at in committed.items()]

        reached, waits = await phase(rate)
        p50, p99 = pct(waits, 0.5), pct(waits, 0.99)
        if sqlite:
            goal = GOALS["sqlite"][1]
            rows.append(
                ["publish (another process) -> delivered", db, reached, "-", p50, p99,
                 verdict_ms(p99, goal, "p99"),
                 f"{len(waits)} publishes; the dispatcher idle: {idle:.2%} of a core"]
            )  # fmt: skip
        else:
            g50, g99 = GOALS["publish"]
            rows.append(
                ["publish -> delivered", db, reached, f"{reached / path_peak:.2f}", p50, p99,
                 both(p50, g50, p99, g99),
                 f"{len(waits)} publishes; the path's peak {path_peak:,.0f}/s"
                 f" ({PUBLISHERS} publishing flat out; the dispatcher alone {peak:,.0f}/s,"
                 f" a backlog of {len(ids):,})"]
            )  # fmt: skip
            top, top_waits = await phase(peak / 2)
            rows.append(
                ["publish -> delivered, the publisher at its limit", db, top,
                 f"{top / path_peak:.2f}", pct(top_waits, 0.5), pct(top_waits, 0.99), "-",
                 f"{len(top_waits)} publishes paced at half the dispatcher's peak"]
            )  # fmt: skip
            low, low_waits = await phase(LOW_RATE)
            rows.append(
                ["publish -> delivered, 200/s", db, low, f"{low / path_peak:.2f}",
                 pct(low_waits, 0.5), pct(low_waits, 0.99), "-", f"{len(low_waits)} publishes"]
            )  # fmt: skip
            # A retry 200 ms out: first arrival (answered 500) to the second.
            flaky: list[str] = []

            async def publish_flaky(n: int) -> None:
                mid, _ = await _publish(box, "bench.flaky", n)
                flaky.append(mid)

            async def retried() -> bool:
                seen = arrivals(port)
                return all(len(seen.get(m, ())) >= 2 for m in flaky)

            # A retry is scheduled when its failed attempt's record commits: a flush
            # the disk holds back holds the retry back too (the note gives the disk's
            # slowest fdatasync meanwhile, from a probe beside PostgreSQL's files).
            with fsync_probe(Path(tempfile.gettempdir())) as disk:
                await paced(10.0, 1.0 if quick else 5.0, publish_flaky)
                await until(retried, 120, "the retries delivered")
            seen = arrivals(port)
            gaps = [(seen[m][1] - seen[m][0]) * 1000 for m in flaky]
            low, high = (RETRY - RETRY_SLACK) * 1000, (RETRY + RETRY_SLACK) * 1000
            ok = min(gaps) >= low and pct(gaps, 0.99) <= high
            late = sum(gap > high for gap in gaps)
            rows.append(
                ["retry scheduled 200 ms out: sent after", db, "-", "-", pct(gaps, 0.5),
                 pct(gaps, 0.99),
                 f"{min(gaps):.0f}..p99 {pct(gaps, 0.99):.0f} ms within 200 ± 50:"
                 f" {'met' if ok else 'MISSED'}",
                 f"{len(gaps)} retries, {late} later than {high:.0f} ms; max {max(gaps):.0f}"
                 f" ms; the disk's fdatasync max {disk.get('max', float('nan')):.0f} ms"]
            )  # fmt: skip
    finally:
        if proc is not None:
            stop(proc)
        await box.close()
        sink.kill()
        sink.wait(10)
    return rows


def verdict_ms(value: float, goal: float, what: str) -> str:
    return f"{what} {value:.1f} ms <= {goal:g}: {'met' if value <= goal else 'MISSED'}"


def both(p50: float, g50: float, p99: float, g99: float) -> str:
    ok = p50 <= g50 and p99 <= g99
    return f"p50 <= {g50:g}, p99 <= {g99:g} ms: {'met' if ok else 'MISSED'}"


# -- accept -> handler committed ----------------------------------------------------------


def signed(event_id: str) -> tuple[bytes, dict[str, str]]:
    key = base64.b64decode(SECRET.removeprefix("whsec_"))
    ts = str(int(time.time()))
    body = json.dumps({"id": event_id, "type": "invoice.paid", "invoice": event_id}).encode()
    mac = hmac.new(key, f"{event_id}.{ts}.".encode() + body, hashlib.sha256).digest()
    return body, {
        "webhook-id": event_id,
        "webhook-timestamp": ts,
        "webhook-signature": "v1," + base64.b64encode(mac).decode(),
        "content-type": "application/json",
    }


async def accept_session(url: str, *, quick: bool, split: bool = False) -> list[list[Any]]:
    """``relaybox serve`` with the receiver and the worker in one process on core 0;
    ``split``: the receiver alone there and ``relaybox worker`` on core 1."""
    import asyncpg

    migrate(url)
    port = free_port()
    env = {"RELAYBOX_DATABASE_URL": url}
    roles = "receiver" if split else "receiver,worker"
    args = ["serve", "--app", "bench.latency_app:box", "--roles", roles]
    notes = Path(tempfile.mkdtemp(prefix="bench-commits-"))
    proc = relaybox(
        [*args, "--host", "127.0.0.1", "--port", str(port), "--no-migrate"],
        {**env, "BENCH_COMMITS": str(notes / "serve")},
    )
    worker = (
        relaybox(
            ["worker", "--app", "bench.latency_app:box"],
            {**env, "BENCH_COMMITS": str(notes / "worker")},
            cpu=1,
        )
        if split
        else None
    )
    base = f"http://127.0.0.1:{port}"
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg", "postgresql"))
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as http:
            deadline = time.monotonic() + 120
            while True:
                try:
                    async with http.get(base + "/healthz") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("latency bench: relaybox serve did not start")
                await asyncio.sleep(0.1)

            async def post(event_id: str) -> None:
                body, headers = signed(event_id)
                async with http.post(base + "/webhooks/bench", data=body, headers=headers) as r:
                    if r.status != 200:
                        raise RuntimeError(f"latency bench: {r.status} {await r.text()}")

            async def done(prefix: str, n: int) -> bool:
                count = await conn.fetchval(
                    "SELECT count(*) FROM relaybox_inbox WHERE status = 'done'"
                    " AND event_id LIKE $1",
                    prefix + "%",
                )
                return bool(count >= n)

            # The peak: a burst from 64 pooled senders, first receipt to last completion.
            burst = 300 if quick else 5_000
            work = iter(range(burst))

            async def sender() -> None:
                for n in work:
                    await post(f"b_{n}")

            await asyncio.gather(*(sender() for _ in range(64)))
            await until(lambda: done("b_", burst), 300, "the burst processed")
            span = await conn.fetchval(
                "SELECT max(done_at) - min(received_at) FROM relaybox_inbox"
                " WHERE event_id LIKE 'b_%'"
            )
            peak = burst / span

            async def phase(rate: float, prefix: str) -> tuple[float, dict[int, float]]:
                """The rate reached, and each event's received_at by inbox id."""
                reached = await paced(rate, 1.5 if quick else 10.0, lambda n: post(f"{prefix}{n}"))
                sent = await conn.fetchval(
                    "SELECT count(*) FROM relaybox_inbox WHERE event_id LIKE $1", prefix + "%"
                )
                await until(lambda: done(prefix, sent), 120, "the paced events processed")
                found = await conn.fetch(
                    "SELECT id, received_at FROM relaybox_inbox WHERE event_id LIKE $1",
                    prefix + "%",
                )
                return reached, {r[0]: r[1] for r in found}

            reached, received = await phase(peak / 2, "p_")
            low, low_received = await phase(LOW_RATE, "q_")
    finally:
        await conn.close()
        stop(proc)
        if worker is not None:
            stop(worker)
        committed = _commits(notes)  # read and removed however the session ended
    waits = _waits(received, committed)
    low_waits = _waits(low_received, committed)
    g50, g99 = GOALS["accept"]
    p50, p99 = pct(waits, 0.5), pct(waits, 0.99)
    note = f"{len(waits)} events; peak {peak:,.0f}/s (a burst of {burst:,}, 64 senders)"
    path = "accept -> handler committed" + (", worker apart" if split else "")
    return [
        [path, "postgres", reached, f"{reached / peak:.2f}", p50, p99,
         both(p50, g50, p99, g99), note],
        [f"{path}, 200/s", "postgres", low, f"{low / peak:.2f}",
         pct(low_waits, 0.5), pct(low_waits, 0.99), "-", f"{len(low_waits)} events"],
    ]  # fmt: skip


def _commits(notes: Path) -> dict[int, float]:
    """When each event's transaction committed, by inbox id, from the files the
    processes of the session wrote as they exited (``bench/latency_app.py``)."""
    committed: dict[int, float] = {}
    for path in notes.iterdir():
        for line in path.read_text().splitlines():
            inbox_id, at = line.split()
            committed[int(inbox_id)] = float(at)
        path.unlink()
    notes.rmdir()
    return committed


def _waits(received: dict[int, float], committed: dict[int, float]) -> list[float]:
    """received_at -> COMMIT in ms, of every event; one whose commit was not noted fails
    the run (a process that did not exit cleanly wrote nothing)."""
    missing = [i for i in received if i not in committed]
    if missing:
        raise RuntimeError(
            f"latency bench: no commit noted for {len(missing)} of {len(received)} events"
        )
    return [(committed[i] - at) * 1000 for i, at in received.items()]


def main(*, quick: bool = False) -> str:
    from relaybox.log import configure_logging

    configure_logging("warning")  # not a line per endpoint this process creates
    rows: list[list[Any]] = []

    async def go() -> None:
        # The sender (this process) off core 0, where the receiver runs.
        with pinned(1):
            rows.extend(await accept_session(fresh_pg_database("latency_accept"), quick=quick))
            url = fresh_pg_database("latency_accept_apart")
            rows.extend(await accept_session(url, quick=quick, split=True))
        url = fresh_pg_database("latency_dispatch")
        rows.extend(await dispatch_session(url, quick=quick, sqlite=False))
        with tempfile.TemporaryDirectory(prefix="bench-latency-") as tmp:
            sqlite_url = f"sqlite:///{Path(tmp) / 'latency.db'}"
            rows.extend(await dispatch_session(sqlite_url, quick=quick, sqlite=True))

    import uvloop

    uvloop.run(go())
    for row in rows:
        print(f"  latency {row[0]:40} {row[1]:8} p50 {row[4]:.1f} ms  p99 {row[5]:.1f} ms",
              flush=True)  # fmt: skip
    return table(
        "latency: at half of the measured peak (SQLite: 20 publishes a second from another"
        " process); open-loop arrivals",
        ["path", "db", "rate/s", "x peak", "p50 ms", "p99 ms", "goal", "note"],
        rows,
    )
