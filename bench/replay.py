"""Replay missing against everyone else's latency: what one tenant's replay-missing
requests cost ``relaybox serve``'s shared event loop.

On each backend (PostgreSQL: a fresh database; SQLite: a file), ``relaybox serve``
(every role, so the dispatcher shares the loop that answers requests; on core 0) and,
on core 1 (:func:`bench.common.pinned`), this process:

1. publishes ``--messages`` (1,003) messages of about 117 KiB each (an order with 1,210
   line items: JSON a filter has to parse whole) for the replaying tenant, which has
   no endpoint yet, so none gets a delivery;
2. creates 4 endpoints for that tenant with a payload filter (``{"data.v": 1}``: no
   message matches, so every message is read and parsed, and nothing is queued);
3. for each row, ``/healthz`` is probed every 50 ms and another tenant publishes 4
   times a second, open loop (each request its own task at its planned time): ``idle``
   for 3 s, then ``one replay`` (``POST /api/v1/endpoints/{id}/replay-missing
   {"since": 0}`` on one endpoint) and ``four at once`` (one on each endpoint at the
   same moment), each until every replay has finished, plus half a second.

A replay has finished when its ``POST`` answered (a replay that runs in the request)
or, when it answers 202 with a job, once ``GET`` on the job's ``url`` says ``done``
(polled every 100 ms). Rows: the ``POST``'s answer time (max of the four), the time
until every replay finished, ``/healthz`` p50 and max, the other tenant's publish p50
and max, in ms; failed probes (a 5xx, or no answer) are counted in the note, and a
replay that failed (its status) is named there.

    python -m bench.replay                      # both backends
    python -m bench.replay --messages 200       # a smoke run

Code to compare runs the same way from its own source tree:
``PYTHONPATH=/path/to/other/src python -m bench.replay`` (the server it starts
inherits the path).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.common import ROOT, free_port, fresh_pg_database, pinned, table
from bench.filters import api_key, pct, relaybox_cli, timed

PROBE_EVERY = 0.05  # seconds between /healthz probes
NEIGHBOUR_EVERY = 0.25  # seconds between the other tenant's publishes
ENDPOINTS = 4
FILTER = {"data.v": 1}


def order(n: int) -> dict[str, Any]:
    """An order of about 117 KiB of JSON: 1,210 line items."""
    items = [
        {"sku": f"SKU-{n:05d}-{i:04d}", "name": "Ceramic mug, blue", "qty": i % 7 + 1,
         "price": 12.5 + i % 13, "tags": ["kitchen", "gift"]}
        for i in range(1210)
    ]  # fmt: skip
    return {"v": 0, "order": f"ord_{n}", "customer": {"id": f"cus_{n}", "country": "PT"},
            "items": items}  # fmt: skip


async def seed(url: str, key: str, messages: int) -> int:
    """Publish ``messages`` orders for the tenant ``replayer``; the body's size."""
    from relaybox import Relaybox
    from relaybox.config import Settings
    from relaybox.config.outbound import OutboundSettings

    box = Relaybox(settings=Settings(database_url=url, outbound=OutboundSettings(secrets_key=key)))
    try:
        for start in range(0, messages, 50):
            async with box.store.transaction() as conn:
                for n in range(start, min(messages, start + 50)):
                    await box.publish(conn, "r.order", order(n), tenant="replayer")
    finally:
        await box.close()
    return len(json.dumps(order(0), separators=(",", ":")))


async def replay(
    http: aiohttp.ClientSession, base: str, auth: dict[str, str], endpoint_id: str
) -> tuple[float, float, str]:
    """(ms until the POST answered, ms until the replay finished, what failed: "" when
    nothing did)."""
    started = time.perf_counter()
    url = f"{base}/api/v1/endpoints/{endpoint_id}/replay-missing"
    try:
        async with http.post(url, json={"since": 0}, headers=auth) as r:
            answered = (time.perf_counter() - started) * 1000
            if r.status != 202:
                return answered, answered, f"replay {r.status}"
            body = await r.json()
        if "url" in body:  # a job: poll it until it ends
            while body.get("status") not in ("done", "failed"):
                await asyncio.sleep(0.1)
                async with http.get(body["url"], headers=auth) as r:
                    body = await r.json()
            if body["status"] != "done":
                return answered, answered, f"job {body['status']}: {body['error']}"
    except aiohttp.ClientError as exc:
        elapsed = (time.perf_counter() - started) * 1000
        return elapsed, elapsed, f"replay {type(exc).__name__}"
    return answered, (time.perf_counter() - started) * 1000, ""


async def probes(
    http: aiohttp.ClientSession, base: str, neighbour: dict[str, str], stop: asyncio.Event
) -> tuple[list[float], list[float]]:
    """Probe ``/healthz`` and publish as the other tenant, open loop, until ``stop``."""
    health: list[asyncio.Future[float]] = []
    theirs: list[asyncio.Future[float]] = []
    message = {"event_type": "n.x", "data": {"v": 1}}
    start = time.perf_counter()
    n = 0
    while not stop.is_set():
        at = start + n * PROBE_EVERY
        await asyncio.sleep(max(0.0, at - time.perf_counter()))
        health.append(asyncio.ensure_future(timed(http, "GET", base + "/healthz")))
        if n % round(NEIGHBOUR_EVERY / PROBE_EVERY) == 0:
            publish = timed(
                http, "POST", base + "/api/v1/messages", json=message, headers=neighbour
            )
            theirs.append(asyncio.ensure_future(publish))
        n += 1
    return [await f for f in health], [await f for f in theirs]


async def row(
    http: aiohttp.ClientSession,
    base: str,
    keys: dict[str, str],
    endpoint_ids: list[str],
    *,
    idle: float = 3.0,
) -> dict[str, Any]:
    stop = asyncio.Event()
    neighbour = {"Authorization": f"Bearer {keys['neighbour']}"}
    probing = asyncio.ensure_future(probes(http, base, neighbour, stop))
    await asyncio.sleep(0.5)
    auth = {"Authorization": f"Bearer {keys['replayer']}"}
    if endpoint_ids:
        done = await asyncio.gather(*(replay(http, base, auth, e) for e in endpoint_ids))
    else:
        await asyncio.sleep(idle)
        done = []
    await asyncio.sleep(0.5)
    stop.set()
    health, theirs = await probing
    failed = sum(1 for t in (*health, *theirs) if t < 0)
    health, theirs = [abs(t) for t in health], [abs(t) for t in theirs]
    return {
        "post_max": max((a for a, _, _ in done), default=float("nan")),
        "finished": max((f for _, f, _ in done), default=float("nan")),
        "replays_failed": sorted(why for _, _, why in done if why),
        "healthz_p50": pct(health, 0.5),
        "healthz_max": max(health),
        "other_p50": pct(theirs, 0.5),
        "other_max": max(theirs),
        "failed": failed,
    }


async def session(backend: str, messages: int, label: str) -> list[list[Any]]:
    from relaybox.outbound.vault import new_key

    scratch = Path(tempfile.mkdtemp(prefix="bench-replay-"))
    url = fresh_pg_database("replay") if backend == "postgres" else (
        f"sqlite:///{scratch / 'relaybox.db'}")  # fmt: skip
    secrets_key = new_key()
    env = {"RELAYBOX_OUTBOUND__SECRETS_KEY": secrets_key, "RELAYBOX_LOG_LEVEL": "warning"}
    relaybox_cli(["migrate", "--database-url", url], env)
    keys = {t: api_key(url, t, env) for t in ("replayer", "neighbour")}
    started = time.perf_counter()
    size = await seed(url, secrets_key, messages)
    print(f"  replay {backend}: {messages} messages of {size / 1024:.0f} KiB published in "
          f"{time.perf_counter() - started:.1f} s", flush=True)  # fmt: skip
    port = free_port()
    proc = subprocess.Popen(
        ["taskset", "-c", "0", sys.executable, "-m", "relaybox", "serve", "--database-url",
         url, "--host", "127.0.0.1", "--port", str(port), "--no-migrate"],
        cwd=ROOT, env={**os.environ, **env},
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    rows: list[list[Any]] = []
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=200)) as http:
            deadline = time.monotonic() + 60
            while True:
                try:
                    async with http.get(base + "/healthz") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("replay bench: relaybox serve did not start")
                await asyncio.sleep(0.2)
            auth = {"Authorization": f"Bearer {keys['replayer']}"}
            ids = []
            for i in range(ENDPOINTS):
                spec = {"url": f"https://hooks.example.com/r/{i}", "event_types": ["r.*"],
                        "filter": FILTER}  # fmt: skip
                async with http.post(base + "/api/v1/endpoints", json=spec, headers=auth) as r:
                    if r.status != 201:
                        raise RuntimeError(f"endpoint {i}: {r.status} {await r.text()}")
                    ids.append((await r.json())["id"])
            for name, chosen in (("idle", []), ("one replay", ids[:1]), ("four at once", ids)):
                with pinned(1):
                    got = await row(http, base, keys, chosen)
                print(f"  replay {backend:8} {label:6} {name:12} {got}", flush=True)
                notes = [f"{got['failed']} probes failed (5xx or none)"] if got["failed"] else []
                notes += [f"{why}" for why in got["replays_failed"]]
                note = "; ".join(notes)
                rows.append([backend, label, name, got["post_max"], got["finished"],
                             got["healthz_p50"], got["healthz_max"], got["other_p50"],
                             got["other_max"], note])  # fmt: skip
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return rows


def main(*, messages: int = 1003, label: str = "", backends: tuple[str, ...] = ()) -> str:
    import relaybox

    label = label or Path(relaybox.__file__).resolve().parents[2].name
    rows: list[list[Any]] = []
    for backend in backends or ("postgres", "sqlite"):
        rows += asyncio.run(session(backend, messages, label))
    return table(
        f"replay: {messages} messages of ~117 KiB, endpoints with a payload filter none "
        "matches; ms",
        ["backend", "code", "row", "POST answered (max)", "all finished", "healthz p50",
         "max", "other tenant's publish p50", "max", "note"],
        rows,
    )  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.replay")
    parser.add_argument("--messages", type=int, default=1003)
    parser.add_argument("--label", default="", help="the code's name in the rows")
    parser.add_argument("--backend", action="append", choices=("postgres", "sqlite"))
    args = parser.parse_args()
    print(main(messages=args.messages, label=args.label, backends=tuple(args.backend or ())))
