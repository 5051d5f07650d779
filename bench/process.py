"""Process: N pending events whose handler does the credits example (business key,
balance increment, outbox row, done), against procrastinate (no-op jobs, concurrency
10), hookrelay's worker (no-op handler) and the floor: the same SQL in a tight asyncpg
loop on uvloop, 16 events a transaction as relaybox groups them, at 1/4/16
connections. relaybox's rows also say the worker processes' CPU per event (psutil),
steadier than rates on a shared VM."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from typing import Any

import asyncpg
import psutil
import uvloop

from bench.common import ROOT, fresh_pg_database, merged, table, verdict
from bench.dispatch import cpu_seconds

WORKSPACES = 100


async def seed_relaybox(url: str, n: int) -> None:
    """``n`` pending inbox rows (distinct invoices) and the app's balance table."""
    subprocess.run(
        [sys.executable, "-m", "relaybox", "migrate", "--database-url", url],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "CREATE TABLE bench_balances (workspace TEXT PRIMARY KEY, credits BIGINT NOT NULL)"
        )
        await conn.executemany(
            "INSERT INTO bench_balances VALUES ($1, 0)", [(f"ws{i}",) for i in range(WORKSPACES)]
        )
        now = time.time()
        for start in range(0, n, 5000):
            ids = list(range(start, min(n, start + 5000)))
            bodies = [
                json.dumps({"invoice": f"in_{i}", "workspace": f"ws{i % WORKSPACES}"}).encode()
                for i in ids
            ]
            await conn.execute(
                "INSERT INTO relaybox_inbox (source, account, event_id, event_type, fingerprint,"
                " payload, status, next_attempt_at, received_at, updated_at)"
                " SELECT 'bench', 'acct', e, 'invoice.paid', '\\x00', p, 'pending', $3, $3, $3"
                " FROM unnest($1::text[], $2::bytea[]) AS u(e, p)",
                [f"evt_{i}" for i in ids],
                bodies,
                now,
            )
        await conn.execute("ANALYZE")
    finally:
        await conn.close()


async def relaybox_run(n: int, processes: int, app: str = "box") -> dict[str, Any]:
    """``processes`` workers of ``bench.process_app``'s ``app``."""
    url = fresh_pg_database(f"process_rb_{processes}_{app}")
    await seed_relaybox(url, n)
    env = {**os.environ, "RELAYBOX_DATABASE_URL": url, "RELAYBOX_LOG_LEVEL": "warning"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "relaybox", "worker", "--app", f"bench.process_app:{app}"],
            cwd=ROOT,
            env=env,
        )
        for _ in range(processes)
    ]
    workers = [psutil.Process(p.pid) for p in procs]
    # (rows left pending, workers' CPU seconds, their PostgreSQL backends' CPU seconds)
    samples: list[tuple[int, float, float]] = []
    conn = await asyncpg.connect(url)
    try:
        deadline = time.time() + 600
        while pending := await conn.fetchval(
            "SELECT count(*) FROM relaybox_inbox WHERE status = 'pending'"
        ):
            if time.time() > deadline or any(p.poll() is not None for p in procs):
                raise RuntimeError("relaybox workers did not drain the inbox")
            samples.append(
                (pending, sum(sum(w.cpu_times()[:2]) for w in workers), await backends_cpu(conn))
            )
            await asyncio.sleep(0.2)
        span = await conn.fetchval(
            "SELECT max(done_at) - min(done_at) FROM relaybox_inbox WHERE status = 'done'"
        )
        done = await conn.fetchval("SELECT count(*) FROM relaybox_inbox WHERE status = 'done'")
        credits = await conn.fetchval("SELECT sum(credits) FROM bench_balances")
        outbox = await conn.fetchval("SELECT count(*) FROM relaybox_outbox")
    finally:
        await conn.close()
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
    assert done == n and credits == 100 * n and outbox == n, (done, credits, outbox)
    return {
        "rate": n / span,
        "note": f"{done} done, credits exact, {outbox} outbox rows, {cpu_per_event(samples, n)}",
    }


async def backends_cpu(conn: asyncpg.Connection) -> float:
    """CPU seconds so far of the PostgreSQL backends connected to ``conn``'s database
    (the monitor's own excepted): the database's share of the work, on this machine."""
    total = 0.0
    for (pid,) in await conn.fetch(
        "SELECT pid FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    ):
        with contextlib.suppress(OSError):
            total += cpu_seconds(pid)
    return total


def cpu_per_event(samples: list[tuple[int, float, float]], n: int) -> str:
    """The workers' CPU per event between 10 % and 90 % done (start-up and the tail
    left out), and their PostgreSQL backends': on a shared VM steadier figures than the
    rate."""
    try:
        lo = next(s for s in samples if s[0] <= 0.9 * n)
        hi = next(s for s in samples if s[0] <= 0.1 * n)
    except StopIteration:
        return "CPU n/a"
    if hi[0] >= lo[0]:
        return "CPU n/a"
    events = lo[0] - hi[0]
    worker = (hi[1] - lo[1]) / events * 1e6
    database = (hi[2] - lo[2]) / events * 1e6
    return f"{worker:.0f} us CPU/event (+ PostgreSQL {database:.0f} us)"


GROUP = 16
"""Events per transaction: relaybox's default on PostgreSQL (``worker.group``)."""

RAW_STEPS = (
    """SELECT id, payload FROM relaybox_inbox WHERE status = 'pending' AND next_attempt_at <= $1
       ORDER BY next_attempt_at LIMIT $2 FOR NO KEY UPDATE SKIP LOCKED""",
    """INSERT INTO relaybox_operations (business_key, fingerprint, inbox_id, source, created_at)
       VALUES ($1, 'credits=100', $2, 'bench', $3) ON CONFLICT DO NOTHING RETURNING 1""",
    "UPDATE bench_balances SET credits = credits + 100 WHERE workspace = $1",
    """INSERT INTO relaybox_outbox (channel, key, payload, inbox_id, next_attempt_at,
       created_at, updated_at) VALUES ('email', $1, $2, $3, $4, $4, $4)
       ON CONFLICT DO NOTHING""",
    """UPDATE relaybox_inbox SET status = 'done', done_at = $2, updated_at = $2
       WHERE id = ANY($1::bigint[])""",
)


async def raw_run(n: int, connections: int) -> dict[str, Any]:
    """The floor: the same statements, prepared, on asyncpg, with relaybox's grouping
    (up to ``GROUP`` events claimed and committed in one transaction, their completion
    in one statement), ``connections`` loops at once; run on uvloop as the worker is."""
    url = fresh_pg_database(f"process_raw_{connections}")
    await seed_relaybox(url, n)

    async def loop(conn: asyncpg.Connection) -> int:
        claim, op, grant, outbox, done = [await conn.prepare(s) for s in RAW_STEPS]
        count = 0
        while True:
            now = time.time()
            async with conn.transaction():
                rows = await claim.fetch(now, GROUP)
                if not rows:
                    return count
                # In the balances' order: transactions at once then lock the rows
                # they share in the same order, so they wait for each other but never
                # deadlock (no retries to pay).
                events = sorted(
                    ((json.loads(row["payload"]), row["id"]) for row in rows),
                    key=lambda event: event[0]["workspace"],
                )
                for body, inbox_id in events:
                    key = f"bench:acct:{body['invoice']}:initial-credit-grant"
                    if await op.fetchval(key, inbox_id, now):
                        await grant.fetch(body["workspace"])
                        await outbox.fetch(key + ":confirmation", json.dumps(body), inbox_id, now)
                await done.fetch([row["id"] for row in rows], now)
            count += len(rows)

    conns = [await asyncpg.connect(url) for _ in range(connections)]
    monitor = await asyncpg.connect(url)
    me = psutil.Process()
    cpu0, pg0 = sum(me.cpu_times()[:2]), await backends_cpu(monitor)
    started = time.perf_counter()
    counts = await asyncio.gather(*(loop(c) for c in conns))
    elapsed = time.perf_counter() - started
    cpu = (sum(me.cpu_times()[:2]) - cpu0) / n * 1e6
    database = (await backends_cpu(monitor) - pg0) / n * 1e6
    credits = await monitor.fetchval("SELECT sum(credits) FROM bench_balances")
    for c in (*conns, monitor):
        await c.close()
    assert sum(counts) == n and credits == 100 * n, (sum(counts), credits)
    note = (
        f"{connections} connection(s), {GROUP} events a transaction, uvloop,"
        f" {cpu:.0f} us CPU/event (+ PostgreSQL {database:.0f} us)"
    )
    return {"rate": n / elapsed, "note": note}


async def procrastinate_run(n: int) -> dict[str, Any]:
    import procrastinate

    url = fresh_pg_database("process_procrastinate")
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="noop")
    async def noop(i: int) -> None:
        return None

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        for start in range(0, n, 5000):
            await noop.batch_defer_async(*({"i": i} for i in range(start, min(n, start + 5000))))
        started = time.perf_counter()
        await app.run_worker_async(concurrency=10, wait=False, install_signal_handlers=False)
        elapsed = time.perf_counter() - started
    return {"rate": n / elapsed, "note": "no-op jobs, concurrency 10"}


async def hookrelay_run(n: int) -> dict[str, Any]:
    from hookrelay.backends.postgres import PostgresBackend
    from hookrelay.worker import Worker
    from sqlalchemy.ext.asyncio import create_async_engine

    url = fresh_pg_database("process_hookrelay")
    engine = create_async_engine(
        url.replace("postgresql://", "postgresql+asyncpg://"), pool_size=12
    )
    backend = PostgresBackend(engine)
    await backend.init_schema()
    conn = await asyncpg.connect(url)
    await conn.execute(
        "INSERT INTO hookrelay_events (id, source, payload, headers, status, attempts,"
        " max_attempts, next_retry_at, created_at, updated_at)"
        " SELECT 'e' || g, 'bench', '{}'::jsonb, '{}'::jsonb, 'pending', 0, 5, now(), now(), now()"
        " FROM generate_series(1, $1) g",
        n,
    )
    await conn.close()

    async def handler(event: Any) -> None:
        return None

    worker = Worker(backend, handler, batch_size=100, concurrency=10, poll_interval=0.01)
    started = time.perf_counter()
    while await worker.run_once():
        pass
    elapsed = time.perf_counter() - started
    await engine.dispose()
    return {"rate": n / elapsed, "note": "no-op handler, batch 100, concurrency 10"}


RAW_CONNECTIONS = (1, 4, 16)
GOAL_RAW = 0.8
"""relaybox's best rate, at least this share of the grouped raw loop's best."""
DRIVER = "relaybox, handler on ctx.driver"
"""The same handler with its statement on asyncpg (``ctx.driver``), as the floor's."""
GOAL_PROCRASTINATE = 7.0
"""relaybox's best rate, at least this many times procrastinate's."""


def main(*, quick: bool = False) -> str:
    n = 2_000 if quick else int(os.environ.get("BENCH_PROCESS_EVENTS", "50000"))
    rounds = 1 if quick else 2  # relaybox (1 process) and procrastinate alternate; medians
    runs: dict[str, list[dict[str, Any]]] = {}

    def record(name: str, r: dict[str, Any]) -> None:
        runs.setdefault(name, []).append(r)
        print(f"  process {name:34} {r['rate']:8.0f} events/s  {r['note']}", flush=True)

    for _ in range(rounds):
        record("relaybox, 1 worker process", asyncio.run(relaybox_run(n, 1)))
        record(DRIVER, asyncio.run(relaybox_run(n, 1, "driver_box")))
        record("procrastinate", asyncio.run(procrastinate_run(n)))
    for c in RAW_CONNECTIONS:
        record(f"raw SQL grouped, {c} conn", uvloop.run(raw_run(n, c)))
    record("relaybox, 2 worker processes", asyncio.run(relaybox_run(n, 2)))
    record("hookrelay worker", asyncio.run(hookrelay_run(n)))
    order = [
        "relaybox, 1 worker process",
        DRIVER,
        *(f"raw SQL grouped, {c} conn" for c in RAW_CONNECTIONS),
        "relaybox, 2 worker processes",
        "procrastinate",
        "hookrelay worker",
    ]
    results = {name: merged(runs[name]) for name in order}
    best = max(
        results["relaybox, 1 worker process"]["rate"],
        results["relaybox, 2 worker processes"]["rate"],
    )
    raw_name = max(
        (f"raw SQL grouped, {c} conn" for c in RAW_CONNECTIONS),
        key=lambda name: results[name]["rate"],
    )
    raw_best = results[raw_name]["rate"]
    goals = {
        raw_name: verdict(best / raw_best, GOAL_RAW, "relaybox / this (its best count)"),
        # Like for like: the handler's statement on asyncpg, as the floor runs it.
        DRIVER: verdict(results[DRIVER]["rate"] / raw_best, GOAL_RAW, "this / the raw loop's best"),
        "procrastinate": verdict(
            best / results["procrastinate"]["rate"], GOAL_PROCRASTINATE, "relaybox / this"
        ),
    }
    rows = [
        [name, r["rate"], f"{best / r['rate']:.2f}", goals.get(name, ""), r["note"]]
        for name, r in results.items()
    ]
    return table(
        f"process: {n:,} pending events, credits handler (relaybox, raw) / no-op (peers); "
        f"relaybox (1 process) and procrastinate: {rounds} alternating round(s), medians",
        ["runner", "events/s", "best relaybox x", "goal", "note"],
        rows,
    )
