"""Memory and growth: does cost grow with the tables? Accept, process and dispatch rates
with 10k, 100k and 1M (``BENCH_GROWTH_SIZES``: any comma list, e.g. 10000,10000000)
finished rows already in the inbox and as many delivered messages in the outbox
history (a message, its outbox row and one attempt each); the seeded database's size;
the worker's RSS while it works through a backlog of the largest size (at most 1M
rows; flat, not growing with it); EXPLAIN of the claim queries (index scans on the
partial index, no sequential scan).

``BENCH_GROWTH_LAYOUTS=plain,day`` (or ``week``) measures each size in both layouts in
the same run: today's tables, and the same seed converted to time partitions the way
``relaybox migrate --partitions day`` converts a live database (the seeded history
becomes the first partition, no copy). Runs alternate over sizes and layouts.

``BENCH_GROWTH_STEP=seed`` seeds (and converts) the databases and leaves them in place;
``BENCH_GROWTH_STEP=measure`` with the same ``BENCH_RUN_ID`` measures on them and drops
them: a seed of 10,000,000 rows takes tens of minutes of a machine that need not be
quiet, the rounds about fifteen that must be. Unset: both, in one run."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg
import psutil

from bench.accept import ensure_wrk, make_requests, run_wrk
from bench.common import (
    PG_ADMIN,
    ROOT,
    adopt_database,
    db_name,
    free_port,
    fresh_pg_database,
    keep_database,
    median,
    pg_url,
    serve,
    table,
)
from bench.dispatch import start_sink
from bench.process import WORKSPACES

DEFAULT_SIZES = "10000,100000,1000000"
LAYOUTS = ("plain", "day", "week")
"""``plain``: one table each; ``day``/``week``: the history partitioned by that period."""
HISTORY_ENDPOINTS = 20
DISPATCH_ENDPOINTS = 20
DISPATCH_IN_FLIGHT = 5
RSS_BACKLOG = 1_000_000
"""The worker's backlog for the RSS sample: the largest size, at most this many rows."""
DISK_FACTOR = 2.5
"""Free space wanted per byte of a seed: the seed, one copy of it, and WAL and slack."""


def sizes_from_env(quick: bool) -> list[int]:
    if quick:
        return [1_000, 10_000]
    raw = os.environ.get("BENCH_GROWTH_SIZES", DEFAULT_SIZES)
    sizes = sorted({int(part.replace("_", "")) for part in raw.split(",") if part.strip()})
    if not sizes or sizes[0] <= 0:
        raise SystemExit(f"BENCH_GROWTH_SIZES: positive row counts, not {raw!r}")
    return sizes


def layouts_from_env() -> list[str]:
    raw = os.environ.get("BENCH_GROWTH_LAYOUTS", "plain")
    layouts = [part.strip() for part in raw.split(",") if part.strip()]
    if not layouts or any(layout not in LAYOUTS for layout in layouts):
        raise SystemExit(f"BENCH_GROWTH_LAYOUTS: a comma list of {', '.join(LAYOUTS)}, not {raw!r}")
    return layouts


def pg_free_bytes() -> tuple[str, int] | None:
    """PostgreSQL's data directory and the free bytes on its file system, or None when
    it is not on this machine's file system (a server elsewhere: no check)."""
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        row = conn.execute("SHOW data_directory").fetchone()
    path = str(row[0]) if row else ""
    try:
        return path, shutil.disk_usage(path).free
    except OSError:
        return None


def check_disk(
    inbox_row: float,
    history_row: float,
    sizes: list[int],
    pending: int,
    layouts: list[str] | None = None,
) -> None:
    """Stops the run before seeding ``sizes`` when PostgreSQL's disk lacks the room:
    bytes per inbox row and per delivered message (measured at the smallest size,
    indexes included) times the rows, times ``DISK_FACTOR`` and one more seed for each
    layout past the first."""
    found = pg_free_bytes()
    if found is None:
        print("  growth: PostgreSQL's data directory is not on this machine: no disk check")
        return
    path, free = found
    factor = DISK_FACTOR + len(layouts or ["plain"]) - 1
    need = factor * sum(inbox_row * (size + pending) + history_row * size for size in sizes)
    rows = ", ".join(f"{s:,}" for s in sizes)
    measured = f"{inbox_row:,.0f} B per inbox row, {history_row:,.0f} B per delivered message"
    print(
        f"  growth: {measured}; {rows} rows want ~{need / 2**30:,.1f} GiB free on {path},"
        f" {free / 2**30:,.1f} GiB are",
        flush=True,
    )
    if need > free:
        raise SystemExit(
            f"bench growth: not enough disk for {rows} rows: about {need / 2**30:,.1f} GiB"
            f" wanted ({measured}, x {factor}), {free / 2**30:,.1f} GiB free on"
            f" {path}; choose smaller BENCH_GROWTH_SIZES"
        )


async def seed(
    url: str, done: int, pending: int, history: int | None = None
) -> tuple[int, int, int]:
    """``done`` finished rows (history) and ``pending`` due rows, plus the app table;
    ``history`` (default ``done``) delivered messages in the outbox history. Returns
    the database's size, and the bytes of the inbox and of the outbox history tables
    (indexes and TOAST included)."""
    subprocess.run(
        [sys.executable, "-m", "relaybox", "migrate", "--database-url", url],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    history = done if history is None else history
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "CREATE TABLE bench_balances (workspace TEXT PRIMARY KEY, credits BIGINT NOT NULL)"
        )
        await conn.execute(
            "INSERT INTO bench_balances SELECT 'ws' || g, 0 FROM generate_series(0, $1) g",
            WORKSPACES - 1,
        )
        now = time.time()
        for status, count, offset in (("done", done, 0), ("pending", pending, done)):
            for start in range(0, count, 100_000):
                n = min(100_000, count - start)
                await conn.execute(
                    "INSERT INTO relaybox_inbox (source, account, event_id, event_type,"
                    " fingerprint, payload, status, next_attempt_at, received_at, updated_at,"
                    " done_at)"
                    " SELECT 'bench', 'acct', 'evt_' || g, 'invoice.paid', '\\x00',"
                    " convert_to(json_build_object('invoice', 'in_' || g, 'workspace',"
                    " 'ws' || (g % $4))::text, 'UTF8'), $3::text, $5::float8, $5::float8,"
                    " $5::float8, CASE WHEN $3::text = 'done' THEN $5::float8 END"
                    " FROM generate_series($1::bigint, $2::bigint) g",
                    offset + start,
                    offset + start + n - 1,
                    status,
                    WORKSPACES,
                    now,
                )
        for start in range(0, history, 100_000):
            await seed_delivered(conn, start, min(100_000, history - start), now)
        await seed_keys(conn)
        await conn.execute("VACUUM ANALYZE")
        seeded = int(await conn.fetchval("SELECT pg_database_size(current_database())"))
        inbox, outbox = await conn.fetchrow(
            "SELECT pg_total_relation_size('relaybox_inbox'),"
            " pg_total_relation_size('relaybox_outbox')"
            " + pg_total_relation_size('relaybox_messages')"
            " + pg_total_relation_size('relaybox_outbox_attempts')"
        )
    finally:
        await conn.close()
    return seeded, int(inbox), int(outbox)


async def seed_keys(conn: asyncpg.Connection) -> None:
    """The keys the accept and the publish write beside each seeded row (event keys,
    idempotency keys, outbox keys), so that their tables are as large as the history: digests of the
    row's id, in whatever type the schema keeps them."""

    async def digest(table: str, column: str, text: str) -> str:
        kind = await conn.fetchval(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute"
            " WHERE attrelid = $1::regclass AND attname = $2",
            table,
            column,
        )
        return {
            "uuid": f"md5({text})::uuid",
            "bytea": f"decode(md5({text}), 'hex')",
            "bigint": f"('x' || substr(md5({text}), 1, 16))::bit(64)::bigint",
        }[kind]

    event = await digest("relaybox_event_keys", "digest", "'k' || id")
    fingerprint = await digest("relaybox_event_keys", "fingerprint", "'f' || id")
    await conn.execute(
        "INSERT INTO relaybox_event_keys (inbox_id, scope, first_seen, digest, fingerprint)"
        f" SELECT id, 1, floor(received_at / 86400)::integer, {event}, {fingerprint}"
        " FROM relaybox_inbox"
    )
    message = await digest("relaybox_message_keys", "digest", "'k' || id")
    named = "id"  # the message id as text (before migration 0038), else 16 bytes or text
    columns = "message_id"
    if await conn.fetchval(
        "SELECT count(*) FROM pg_attribute WHERE attrelid = 'relaybox_message_keys'::regclass"
        " AND attname = 'message_uuid'"
    ):
        named = "relaybox_message_uuid(id), CASE WHEN relaybox_message_uuid(id) IS NULL THEN id END"
        columns = "message_uuid, message_text"
    await conn.execute(
        f"INSERT INTO relaybox_message_keys (scope, first_seen, digest, {columns})"
        f" SELECT 1, floor(created_at / 86400)::integer, {message}, {named}"
        " FROM relaybox_messages WHERE idempotency_key IS NOT NULL"
    )
    if await conn.fetchval("SELECT to_regclass('relaybox_outbox_keys') IS NOT NULL"):
        # the outbox's keys (migration 0034), as its insert statements write them
        await conn.execute(
            "INSERT INTO relaybox_outbox_keys (digest, first_seen)"
            " SELECT relaybox_outbox_digest(channel, key), floor(created_at / 86400)::integer"
            " FROM relaybox_outbox ON CONFLICT DO NOTHING"
        )


async def seed_delivered(conn: asyncpg.Connection, start: int, n: int, now: float) -> None:
    """``n`` published messages as delivered history: the message (a ~300-byte
    envelope), its outbox row (sent, to one of ``HISTORY_ENDPOINTS`` endpoints) and
    its one successful attempt, with ids shaped like relaybox's."""
    await conn.execute(
        "INSERT INTO relaybox_messages (id, tenant, event_type, idempotency_key, body,"
        " created_at)"
        " SELECT 'msg_' || lpad(to_hex($3::bigint + g), 11, '0')"
        " || substr(md5(g::text), 1, 16), 'bench', 'order.completed', 'o' || g,"
        " json_build_object('id', 'msg_' || g, 'type', 'order.completed', 'timestamp',"
        " '2026-12-04T00:00:00Z', 'data', json_build_object('order', 'ord_' || g,"
        " 'customer', 'cus_' || substr(md5(g::text), 1, 12), 'total',"
        " json_build_object('amount', 12900, 'currency', 'EUR'), 'items',"
        " json_build_array(json_build_object('sku', 'SKU-0001', 'qty', 1))),"
        " 'apiVersion', '2025-01-01')::text, $4::float8"
        " FROM generate_series($1::bigint, $2::bigint) g",
        start,
        start + n - 1,
        int(now * 1000) - 10**9,
        now,
    )
    await conn.execute(
        "WITH o AS ("
        " INSERT INTO relaybox_outbox (channel, key, payload, tenant, status, attempts,"
        " next_attempt_at, created_at, updated_at, sent_at, lane, endpoint_id, message_id,"
        " last_status)"
        " SELECT 'webhook', m.id || ':' || e.ep, 'null', 'bench', 'sent', 1, $2::float8,"
        " $2::float8, $2::float8, $2::float8, e.ep, e.ep, m.id, 200"
        " FROM (SELECT 'msg_' || lpad(to_hex($4::bigint + g), 11, '0')"
        " || substr(md5(g::text), 1, 16) AS id, g FROM generate_series($1::bigint,"
        " $1::bigint + $3::bigint - 1) g) m"
        " CROSS JOIN LATERAL (SELECT 'ep_history' || (m.g % $5) AS ep) e"
        " RETURNING id, sent_at)"
        " INSERT INTO relaybox_outbox_attempts (outbox_id, attempt, lease_token,"
        " dispatcher, started_at, duration, outcome, status_code, response, headers)"
        " SELECT id, 1, 1, 'bench', sent_at, 0.004, 'sent', 200, '', '{}' FROM o",
        start,
        now,
        n,
        int(now * 1000) - 10**9,
        HISTORY_ENDPOINTS,
    )


async def explain(url: str) -> list[str]:
    """EXPLAIN (not executed) of the statements a worker runs per claim and per event,
    exactly as relaybox sends them."""
    from relaybox.store.backend import load_queries

    q = load_queries("postgres")
    conn = await asyncpg.connect(url)
    try:
        plans = []
        now = time.time()
        for name, params in (
            ("inbox_claim", (now, 128, 30.0, 10, 64)),  # the worker's batch, 4 chains free
            ("inbox_lock", ([1, 2, 3],)),
        ):
            rows = await conn.fetch("EXPLAIN " + q[name], *params)
            plans.append(f"{name}: " + " / ".join(r[0].strip() for r in rows))
        # The dispatcher's lease: 100 free slots, nothing to record.
        empty: list[Any] = []
        lease = (now, 100, ["webhook"], "bench", now + 30, *[empty] * 9, ["webhook"], 4)
        rows = await conn.fetch(
            "EXPLAIN " + q["outbox_lease"], *lease, 100, 25, empty, empty, empty
        )
        plans.append("outbox_lease: " + " / ".join(r[0].strip() for r in rows))
        return plans
    finally:
        await conn.close()


async def process_rate(url: str, pending: int) -> float:
    env = {**os.environ, "RELAYBOX_DATABASE_URL": url, "RELAYBOX_LOG_LEVEL": "warning"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "relaybox", "worker", "--app", "bench.process_app:box"],
        cwd=ROOT,
        env=env,
    )
    conn = await asyncpg.connect(url)
    try:
        while await conn.fetchval("SELECT count(*) FROM relaybox_inbox WHERE status = 'pending'"):
            await asyncio.sleep(0.2)
        span = await conn.fetchval(
            "SELECT max(done_at) - min(done_at) FROM relaybox_inbox"
            " WHERE status = 'done' AND event_id LIKE 'evt_%' AND attempts > 0"
        )
    finally:
        await conn.close()
        proc.terminate()
        proc.wait(30)
    return pending / span


async def dispatch_rate(url: str, pending: int) -> float:
    """``pending`` messages to ``DISPATCH_ENDPOINTS`` endpoints (x ``DISPATCH_IN_FLIGHT``)
    on a local sink, delivered by ``relaybox dispatch`` over the seeded history."""
    from relaybox import Relaybox
    from relaybox.outbound import configure
    from relaybox.outbound.endpoints import EndpointSpec, create_endpoint
    from relaybox.outbound.vault import new_key

    # The dispatcher this starts inherits the key that seals the endpoints' secrets.
    os.environ.setdefault("RELAYBOX_OUTBOUND__SECRETS_KEY", new_key())
    port = free_port()
    sink = start_sink(port, "uvicorn")
    try:
        box = Relaybox(url)
        configure(box, allow_insecure_loopback=True, allow_networks=["127.0.0.0/8"])
        try:
            ids = [
                (
                    await create_endpoint(
                        box,
                        "bench",
                        EndpointSpec(
                            url=f"http://127.0.0.1:{port}/ok/{i}",
                            event_types=["order.*"],
                            max_in_flight=DISPATCH_IN_FLIGHT,
                            timeout=5.0,
                        ),
                    )
                )[0].id
                for i in range(DISPATCH_ENDPOINTS)
            ]
        finally:
            await box.close()
        conn = await asyncpg.connect(url)
        try:
            first = await conn.fetchval("SELECT coalesce(max(id), 0) FROM relaybox_outbox")
            now = time.time()
            await conn.execute(
                "WITH m AS (INSERT INTO relaybox_messages (id, tenant, event_type, body,"
                " created_at)"
                " SELECT $4::text || g, 'bench', 'order.completed',"
                " json_build_object('id', $4::text || g, 'type', 'order.completed',"
                " 'data', json_build_object('n', g))::text, $2::float8"
                " FROM generate_series(0, $1::bigint - 1) g RETURNING id)"
                " INSERT INTO relaybox_outbox (channel, key, payload, tenant, status,"
                " next_attempt_at, created_at, updated_at, lane, endpoint_id, message_id)"
                " SELECT 'webhook', m.id || ':' || e.ep, 'null', 'bench', 'pending',"
                " $2::float8, $2::float8, $2::float8, e.ep, e.ep, m.id"
                " FROM m CROSS JOIN LATERAL (SELECT ($3::text[])[1 + abs(hashtext(m.id))"
                " % cardinality($3::text[])] AS ep) e",
                pending,
                now,
                ids,
                f"msg_pending{first}_",  # a copy dispatched to again gets new ids
            )
            await conn.execute("ANALYZE relaybox_outbox")
            env = {**os.environ, "RELAYBOX_DATABASE_URL": url, "RELAYBOX_LOG_LEVEL": "warning"}
            proc = subprocess.Popen(
                [
                    *("taskset", "-c", "0", sys.executable, "-m", "relaybox", "dispatch"),
                    *("--app", "bench.dispatch_app:box", "--concurrency", "100"),
                ],
                cwd=ROOT,
                env=env,
            )
            try:
                deadline = time.time() + 900
                # The partial index on pending rows answers this, at any table size.
                while await conn.fetchval(
                    "SELECT count(*) FROM relaybox_outbox WHERE status = 'pending'"
                ):
                    if time.time() > deadline or proc.poll() is not None:
                        raise RuntimeError("bench growth: the dispatcher did not deliver all")
                    await asyncio.sleep(0.2)
                span = await conn.fetchval(
                    "SELECT max(sent_at) - min(sent_at) FROM relaybox_outbox WHERE id > $1",
                    first,
                )
            finally:
                proc.terminate()
                proc.wait(30)
        finally:
            await conn.close()
    finally:
        sink.kill()
        sink.wait(10)
    return float(pending / span)


async def worker_rss(url: str, seconds: float) -> tuple[float, float]:
    """RSS (MiB) of a worker over ``seconds`` of a large backlog: first and last sample."""
    env = {**os.environ, "RELAYBOX_DATABASE_URL": url, "RELAYBOX_LOG_LEVEL": "warning"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "relaybox", "worker", "--app", "bench.process_app:box"],
        cwd=ROOT,
        env=env,
    )
    try:
        await asyncio.sleep(3)
        first = psutil.Process(proc.pid).memory_info().rss / 2**20
        await asyncio.sleep(seconds)
        last = psutil.Process(proc.pid).memory_info().rss / 2**20
    finally:
        proc.terminate()
        proc.wait(30)
    return first, last


def step_from_env() -> str:
    raw = os.environ.get("BENCH_GROWTH_STEP", "")
    if raw not in ("", "seed", "measure"):
        raise SystemExit(f"BENCH_GROWTH_STEP: seed or measure (or unset for both), not {raw!r}")
    if raw and "BENCH_RUN_ID" not in os.environ:
        raise SystemExit("BENCH_GROWTH_STEP: set BENCH_RUN_ID too, the same for both steps")
    return raw


def main(*, quick: bool = False, rounds: int = 3) -> str:
    ensure_wrk()
    sizes = sizes_from_env(quick)
    layouts = layouts_from_env()
    step = step_from_env()
    # 20,000 events: ~10 s at each size (5,000 took ~2.5 s, and one autovacuum or
    # checkpoint during it swung the rate by 20 %).
    pending = 1_000 if quick else 20_000
    rounds = 1 if quick else rounds
    runs = [(size, layout) for size in sizes for layout in layouts]
    plans: list[str] = []
    accepts: dict[Run, list[float]] = {run: [] for run in runs}
    processes: dict[Run, float] = {}
    dispatches: dict[Run, list[float]] = {run: [] for run in runs}
    disk: dict[Run, int] = {}
    with tempfile.TemporaryDirectory(prefix="relaybox-growth-") as tmp:
        reqfile = Path(tmp) / "requests.tsv"
        for size, layout in runs if step == "measure" else ():  # seeded by an earlier run
            url = adopt_database(seed_name((size, layout)))
            disk[size, layout] = asyncio.run(database_size(url))
        for i, size in enumerate(sizes if step != "measure" else ()):  # seeded once
            started = time.perf_counter()
            url = fresh_pg_database(seed_name((size, "plain")))
            disk[size, "plain"], inbox, outbox = asyncio.run(seed(url, size, pending))
            print(
                f"  growth {size:>9,} rows: seeded in {time.perf_counter() - started:,.0f} s,"
                f" {disk[size, 'plain'] / 2**20:,.0f} MiB on disk (pg_database_size)",
                flush=True,
            )
            if i == 0 and len(sizes) > 1:
                check_disk(inbox / (size + pending), outbox / size, sizes[1:], pending, layouts)
            for layout in layouts:
                if layout != "plain":
                    started = time.perf_counter()
                    disk[size, layout] = partition_copy(size, layout)
                    print(
                        f"  growth {size:>9,} rows: copied and partitioned by {layout} in"
                        f" {time.perf_counter() - started:,.0f} s",
                        flush=True,
                    )
            if "plain" not in layouts:
                fresh_pg_database(seed_name((size, "plain")))  # its disk back
        if step == "seed":
            kept = [keep_database(seed_name(run)) for run in runs]
            return (
                f"growth: seeded {', '.join(kept)} and left them in place; measure with"
                f" BENCH_GROWTH_STEP=measure BENCH_RUN_ID={os.environ['BENCH_RUN_ID']}"
            )
        # Accept alternates over the runs, round after round (medians): a single run
        # per size let the VM's drift between runs pass for growth (2026-12-01: the
        # first size, run first, read 1.00 against 1.22 and 1.29 for the larger ones).
        for _ in range(rounds):
            for run in runs:
                url = fresh_pg_database(copy_name(run), seed_name(run))
                # Signed now: a timestamp older than the source's tolerance is refused
                # with 401, and a 10M-row seed or copy takes longer than that.
                make_requests(reqfile, 100_000 if not quick else 10_000)
                app = {"BENCH_APP": "relaybox", "BENCH_DB_URL": url}
                with serve(app, port=free_port()) as base:
                    accepts[run].append(run_wrk(base, reqfile, 3 if quick else 5, 64)["rate"])
                print(f"  growth {label(run)}: accept {accepts[run][-1]:,.0f}/s", flush=True)
                if not accepts[run][-1]:
                    raise RuntimeError(f"bench growth: nothing accepted at {label(run)}")
                fresh_pg_database(copy_name(run))  # the copy's disk back, now
        for run in runs:
            url = fresh_pg_database(copy_name(run), seed_name(run))
            processes[run] = asyncio.run(process_rate(url, pending))
            print(f"  growth {label(run)}: process {processes[run]:,.0f}/s", flush=True)
            fresh_pg_database(copy_name(run))  # the copy's disk back, now
        # Dispatch alternates over the runs too, each on its seed itself (the seeds
        # serve nothing after this; a copy of the largest takes minutes and its disk):
        # each round's 20,000 messages join that seed's history, a small part of it at
        # the sizes that matter.
        for _ in range(rounds):
            for run in runs:
                url = pg_url(db_name(seed_name(run)))
                dispatches[run].append(asyncio.run(dispatch_rate(url, pending)))
                print(f"  growth {label(run)}: dispatch {dispatches[run][-1]:,.0f}/s", flush=True)
        for layout in layouts:
            plans += [
                f"{layout}: {plan}"
                for plan in asyncio.run(explain(pg_url(db_name(seed_name((sizes[-1], layout))))))
            ]
        for run in runs:
            fresh_pg_database(seed_name(run))  # the seeds' disk back, now
        big = min(sizes[-1], RSS_BACKLOG)
        url = fresh_pg_database("bench_growth_rss")
        asyncio.run(seed(url, 0, big, history=0))
        first, last = asyncio.run(worker_rss(url, 5 if quick else 20))
    rows: list[list[Any]] = [
        [
            f"{size:,}",
            layout,
            f"{disk[size, layout] / 2**20:,.0f}",
            median(accepts[size, layout]),
            processes[size, layout],
            median(dispatches[size, layout]),
        ]
        for size, layout in runs
    ]
    base = rows[0][3:6]
    for r in rows:
        r.extend(f"{mine / at_first:.2f}" for mine, at_first in zip(r[3:6], base, strict=True))
    out = table(
        f"growth: finished rows already in the inbox and as many delivered messages in the"
        f" outbox history, their keys included; accept and dispatch {rounds} alternating"
        f" round(s), medians; {pending:,} pending processed, and as many messages"
        f" dispatched, each time",
        [
            "rows",
            "layout",
            "seed MiB",
            "accept/s",
            "process/s",
            "dispatch/s",
            "accept vs first",
            "process vs first",
            "dispatch vs first",
        ],
        rows,
    )
    if len(layouts) > 1:
        out += "\nagainst plain at the same size (accept, process, dispatch):"
        for size, layout in runs:
            if layout != "plain" and "plain" in layouts:
                mine, plain = (
                    [median(accepts[r]), processes[r], median(dispatches[r])]
                    for r in ((size, layout), (size, "plain"))
                )
                out += f"\n  {size:,} {layout}: " + ", ".join(
                    f"{a / b:.2f}" for a, b in zip(mine, plain, strict=True)
                )
    if rounds > 1:
        for what, found in (("accept", accepts), ("dispatch", dispatches)):
            out += f"\n{what} rounds: " + "; ".join(
                f"{label(run)}: " + ", ".join(f"{r:,.0f}" for r in found[run]) + "/s"
                for run in runs
            )
    out += (
        f"\nworker RSS with {big:,} pending rows: {first:.0f} MiB after 3 s, {last:.0f} MiB later"
    )
    out += "\nEXPLAIN at the largest size:\n  " + "\n  ".join(plans)
    return out


async def database_size(url: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        return int(await conn.fetchval("SELECT pg_database_size(current_database())"))
    finally:
        await conn.close()


Run = tuple[int, str]
"""One measured case: the finished rows seeded, and the layout."""


def label(run: Run) -> str:
    size, layout = run
    return f"{size:>9,} rows" + ("" if layout == "plain" else f" ({layout})")


def seed_name(run: Run) -> str:
    size, layout = run
    return (
        f"bench_growth_{size}_seed" if layout == "plain" else f"bench_growth_{size}_{layout}_seed"
    )


def copy_name(run: Run) -> str:
    size, layout = run
    return f"bench_growth_{size}" if layout == "plain" else f"bench_growth_{size}_{layout}"


def partition_copy(size: int, layout: str) -> int:
    """A copy of the plain seed of ``size``, converted to partitions by ``layout`` as
    ``relaybox migrate --partitions`` converts a live database; its size on disk."""
    url = fresh_pg_database(seed_name((size, layout)), seed_name((size, "plain")))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "relaybox",
            "migrate",
            "--database-url",
            url,
            "--partitions",
            layout,
        ],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )

    async def size_of() -> int:
        conn = await asyncpg.connect(url)
        try:
            parted = await conn.fetchval(
                "SELECT count(*) FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partrelid"
                " WHERE c.relname LIKE 'relaybox_%'"
            )
            if not parted:
                raise RuntimeError(f"bench growth: {layout} partitions were not made")
            await conn.execute("VACUUM ANALYZE")
            return int(await conn.fetchval("SELECT pg_database_size(current_database())"))
        finally:
            await conn.close()

    return asyncio.run(size_of())
