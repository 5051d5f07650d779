"""One tenant's payload filters against everyone else's latency: what a tenant's
filters cost the shared event loop of ``relaybox serve``.

On each backend (PostgreSQL: a fresh database; SQLite: a file), ``relaybox serve``
(every role, the demo app, on core 0) and, on core 1 (:func:`bench.common.pinned`),
this process:

1. the attacking tenant creates its 100 endpoints (the ``max_endpoints`` quota) on
   ``f.*`` through the tenant API;
2. for each of two filters, set on all 100 endpoints with ``PATCH``: a small one
   (``{"data.v": 0}``: the control) and the largest legal one (``{"data.v": {"$in":
   [0, 0, …]}}``, 2,030 zeros: 4,080 bytes, under ``filter_max_bytes``), the tenant
   publishes ``{"v": 1}`` as ``f.x`` about 9 times a second (far under its rate limit;
   no filter matches, so nothing is delivered) for ``--seconds`` (10) while
   ``/healthz`` is probed every 100 ms and another tenant publishes twice a second.

All three are open loop: each request is its own task at its planned time, so a slow
answer does not slow the load down. Rows: ``/healthz`` p50, p99 and max, the other
tenant's publish p50 and max, the attacker's publish p50, in ms (a failed request, a
5xx or no answer, counts with the time it took, and the note counts them). Where a
filter takes more than the settings allow, step 2 is refused (422 ``invalid_filter``)
from that endpoint on, the others keeping the small filter, and the note says so:
that is the most a tenant can do then.

    python -m bench filters                  # both backends, 10 s per phase
    python -m bench filters --seconds 20
"""

from __future__ import annotations

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

ENDPOINTS = 100
ATTACK_RATE = 9.0  # publishes per second by the attacking tenant
PROBE_EVERY = 0.1  # seconds between /healthz probes
NEIGHBOUR_EVERY = 0.5  # seconds between the other tenant's publishes
BIG = {"data.v": {"$in": [0] * 2030}}
SMALL = {"data.v": 0}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def relaybox_cli(args: list[str], env: dict[str, str]) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "relaybox", *args],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **env},
    )
    return out.stdout


def api_key(url: str, tenant: str, env: dict[str, str]) -> str:
    answer = json.loads(relaybox_cli(["api-keys", "create", "--database-url", url,
                                      "--tenant", tenant], env))  # fmt: skip
    return str(answer["key"])


async def timed(http: aiohttp.ClientSession, method: str, url: str, **kw: Any) -> float:
    """Milliseconds until the whole answer arrived; negative when the answer was not a
    2xx (or there was none): the request failed after that long."""
    started = time.perf_counter()
    ok = False
    try:
        async with http.request(method, url, **kw) as r:
            await r.read()
            ok = r.status < 300
    except aiohttp.ClientError:
        pass
    elapsed = (time.perf_counter() - started) * 1000
    return elapsed if ok else -elapsed


async def paced(every: float, seconds: float, make: Any, into: list[float]) -> None:
    """Start ``make()`` every ``every`` s for ``seconds`` (open loop); wait for all."""
    tasks = []
    start = time.perf_counter()
    n = 0
    while (planned := start + n * every) < start + seconds:
        await asyncio.sleep(max(0.0, planned - time.perf_counter()))
        tasks.append(asyncio.ensure_future(make()))
        n += 1
    for t in tasks:
        into.append(await t)


async def phase(
    http: aiohttp.ClientSession, base: str, keys: dict[str, str], seconds: float
) -> dict[str, float]:
    attacker = {"Authorization": f"Bearer {keys['attacker']}"}
    neighbour = {"Authorization": f"Bearer {keys['neighbour']}"}
    message = {"event_type": "f.x", "data": {"v": 1}}
    health: list[float] = []
    theirs: list[float] = []
    mine: list[float] = []
    await asyncio.gather(
        paced(1 / ATTACK_RATE, seconds,
              lambda: timed(http, "POST", base + "/api/v1/messages", json=message,
                            headers=attacker), mine),
        paced(PROBE_EVERY, seconds, lambda: timed(http, "GET", base + "/healthz"), health),
        paced(NEIGHBOUR_EVERY, seconds,
              lambda: timed(http, "POST", base + "/api/v1/messages",
                            json={"event_type": "n.x", "data": {"v": 1}}, headers=neighbour),
              theirs),
    )  # fmt: skip
    failed = sum(1 for t in (*health, *theirs, *mine) if t < 0)
    health, theirs, mine = ([abs(t) for t in ts] for ts in (health, theirs, mine))
    return {
        "healthz_p50": pct(health, 0.5),
        "healthz_p99": pct(health, 0.99),
        "healthz_max": max(health),
        "other_p50": pct(theirs, 0.5),
        "other_max": max(theirs),
        "attacker_p50": pct(mine, 0.5),
        "publishes": len(mine),
        "failed": failed,
    }


async def session(backend: str, seconds: float) -> list[list[Any]]:
    from relaybox.outbound.vault import new_key

    scratch = Path(tempfile.mkdtemp(prefix="bench-filters-"))
    if backend == "postgres":
        url = fresh_pg_database("filters")
    else:
        url = f"sqlite:///{scratch / 'relaybox.db'}"
    env = {"RELAYBOX_OUTBOUND__SECRETS_KEY": new_key(), "RELAYBOX_LOG_LEVEL": "warning"}
    relaybox_cli(["migrate", "--database-url", url], env)
    keys = {t: api_key(url, t, env) for t in ("attacker", "neighbour")}
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
                    raise RuntimeError("filters bench: relaybox serve did not start")
                await asyncio.sleep(0.2)
            auth = {"Authorization": f"Bearer {keys['attacker']}"}
            ids = []
            for i in range(ENDPOINTS):
                spec = {"url": f"https://hooks.example.com/f/{i}", "event_types": ["f.*"]}
                async with http.post(base + "/api/v1/endpoints", json=spec, headers=auth) as r:
                    if r.status != 201:
                        raise RuntimeError(f"endpoint {i}: {r.status} {await r.text()}")
                    ids.append((await r.json())["id"])
            for name, flt in (("small filter", SMALL), ("4,080-byte $in filter", BIG)):
                refused, saved = None, 0
                for eid in ids:
                    async with http.patch(base + f"/api/v1/endpoints/{eid}",
                                          json={"filter": flt}, headers=auth) as r:  # fmt: skip
                        if r.status == 422:
                            refused = (await r.json())["message"]
                            break
                        if r.status != 200:
                            raise RuntimeError(f"PATCH {eid}: {r.status} {await r.text()}")
                        saved += 1
                size = len(json.dumps(flt, separators=(",", ":")))
                note = f"{size:,} bytes on {ENDPOINTS} endpoints"
                if refused is not None:
                    # The filters already saved stay; the rest keep the previous one.
                    note = (
                        f"{size:,} bytes on {saved} endpoints, refused on the next (422: {refused})"
                    )
                with pinned(1):
                    got = await phase(http, base, keys, seconds)
                if got["failed"]:
                    note += f"; {got['failed']} requests failed (5xx or no answer)"
                print(f"  filters {backend:8} {name:24} {got}", flush=True)
                rows.append([backend, name, got["healthz_p50"], got["healthz_p99"],
                             got["healthz_max"], got["other_p50"], got["other_max"],
                             got["attacker_p50"], note])  # fmt: skip
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return rows


def main(*, quick: bool = False, seconds: float = 20.0) -> str:
    seconds = 3.0 if quick else seconds
    rows: list[list[Any]] = []
    for backend in ("postgres", "sqlite"):
        rows += asyncio.run(session(backend, seconds))
    return table(
        f"filters: one tenant's {ENDPOINTS} endpoints with a payload filter each, publishing"
        f" {ATTACK_RATE:g}/s (no filter matches), {seconds:g} s per row; ms",
        ["backend", "filters", "healthz p50", "p99", "max", "other tenant's publish p50",
         "max", "attacker's publish p50", "note"],
        rows,
    )  # fmt: skip


if __name__ == "__main__":
    print(main(seconds=float(sys.argv[1]) if len(sys.argv) > 1 else 20.0))
