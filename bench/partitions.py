"""python -m bench partitions: expiring N finished events by dropping their time
partition against the per-row purge.

Each round fills a fresh PostgreSQL database with ``BENCH_PARTITIONS_N`` (100,000; the
``--rows`` option) finished events, each with a payload of about 1 KB, headers and one
attempt, all past their 30-day age, then expires them:

* ``purge``: one table each (``retention.partitions = "off"``), the retention purge's
  per-row ``UPDATE`` in batches of 1,000 (the payloads and headers dropped, the rows
  kept);
* ``drop``: the tables partitioned by day (``relaybox migrate --partitions day`` on the
  empty database, then filled), the maintenance's drop of the partition (DETACH, then
  DROP, the attempts' partition with it).

``--sending`` expires the sending side's history instead: ``--rows`` sent messages of
about 1 KB, one delivery each with one attempt, all past their 30-day age; ``purge``
empties the deliveries (their attempts' responses with them) and then the message
bodies, ``drop`` drops the partitions of messages, deliveries and attempts.

``--migrate`` measures the live migration instead: a database of ``--rows`` finished
events (1,000,000 by default) with one attempt each, not partitioned, converted by
``PartitionsStore.convert("day")`` while a client accepts batches of 10 events
without pause: the conversion's wall time, the accepts done meanwhile, the slowest
accept and any error (there must be none), and that every row is still there.

Measured: wall time, CPU seconds of the machine (every process: relaybox and the
PostgreSQL backends; /proc/stat, so other work on the machine counts too) and of this
process, the dead row versions the inbox is left with (``n_dead_tup`` once the
statistics are flushed) and its size on disk after. Rounds alternate the modes.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from typing import Any

import psycopg

from bench.common import ROOT, fresh_pg_database, median, table

DAY = 86400.0
NOW = 2_000_000_000.0


def _busy_cpu() -> float:
    """CPU seconds the whole machine has spent busy (not idle, not waiting)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _migrate(url: str, *extra: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "relaybox", "migrate", "--database-url", url, *extra],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if done.returncode:
        raise RuntimeError(f"relaybox migrate failed: {done.stderr[-2000:]}")


def _fill(url: str, n: int) -> None:
    old = NOW - 60 * DAY
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO relaybox_inbox (source, account, event_id, event_type, tenant,"
            " fingerprint, payload, headers, status, next_attempt_at, received_at,"
            " updated_at, done_at)"
            " SELECT 'stripe', 'acct', 'evt_' || g, 'invoice.paid', 't' || (g % 100),"
            " sha256(g::text::bytea), convert_to(repeat(md5(g::text), 32), 'UTF8'),"
            f" '{{\"content-type\": \"application/json\"}}', 'done', {old}, {old}, {old},"
            f" {old} FROM generate_series(1, {n}) g"
        )
        conn.execute(
            "INSERT INTO relaybox_inbox_attempts (inbox_id, attempt, outcome, worker,"
            f" started_at, finished_at) SELECT id, 1, 'done', 'w', {old}, {old}"
            " FROM relaybox_inbox"
        )
        conn.execute("ANALYZE")


def _fill_sending(url: str, n: int) -> None:
    """``n`` sent messages (ids of today, as publishers make them, published 60 days
    before NOW), one delivery each, one attempt each."""
    old = NOW - 60 * DAY
    ms = int(time.time() * 1000)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO relaybox_messages (id, tenant, event_type, body, created_at)"
            f" SELECT 'msg_' || lpad(to_hex({ms}::bigint), 11, '0') || lpad(to_hex(g), 16, '0'),"
            " 't' || (g % 100), 'invoice.paid', repeat(md5(g::text), 32), "
            f"{old} FROM generate_series(1, {n}) g"
        )
        conn.execute(
            "INSERT INTO relaybox_outbox (channel, key, payload, tenant, status, attempts,"
            " next_attempt_at, created_at, updated_at, sent_at, lane, endpoint_id, message_id)"
            f" SELECT 'webhook', id || ':ep_1', 'null', tenant, 'sent', 1, {old}, {old}, {old},"
            f" {old}, 'ep_1', 'ep_1', id FROM relaybox_messages"
        )
        conn.execute(
            "INSERT INTO relaybox_outbox_attempts (outbox_id, attempt, dispatcher, started_at,"
            f" duration, outcome, status_code, response) SELECT id, 1, 'd', {old}, 0.1, 'sent',"
            " 200, 'ok' FROM relaybox_outbox"
        )
        conn.execute("ANALYZE")


def _dead_and_size(url: str, prefixes: tuple[str, ...] = ("inbox",)) -> tuple[int, int]:
    """Dead row versions and bytes on disk of the tables named relaybox_<prefix>..."""
    where = " OR ".join(f"relname LIKE 'relaybox\\_{p}%'" for p in prefixes)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_force_next_flush()")
        time.sleep(0.7)  # the statistics of the purge's backends reach the collector
        row = conn.execute(
            "SELECT coalesce(sum(n_dead_tup), 0), coalesce(sum(pg_total_relation_size(relid)), 0)"
            f" FROM pg_stat_user_tables WHERE {where}"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def _purge(url: str, sending: bool = False) -> None:
    from relaybox.store import open_store

    store = open_store(url)
    try:
        for which in ("outbox", "messages") if sending else ("inbox",):
            while await store.history.retention_purge_batch(
                which, cutoff=NOW - 30 * DAY, now=NOW, limit=1000
            ):
                pass
    finally:
        await store.close()


async def _drop(url: str) -> list[str]:
    from relaybox.store import open_store

    store = open_store(url)

    def age(table: str, tenant: str | None, source: str | None) -> float:
        return 30 * DAY

    try:
        result = await store.partitions.maintain("day", drop=(NOW, age, lambda table: 30 * DAY))
    finally:
        await store.close()
    return result.dropped


def one(mode: str, n: int, k: int, sending: bool = False) -> dict[str, Any]:
    url = fresh_pg_database(f"parts_{mode}_{k}")
    if mode == "drop":
        _migrate(url, "--partitions", "day")  # the fresh database: one go
    else:
        _migrate(url)
    (_fill_sending if sending else _fill)(url, n)
    cpu0, own0, t0 = _busy_cpu(), time.process_time(), time.perf_counter()
    if mode == "drop":
        dropped = asyncio.run(_drop(url))
        wanted = ("relaybox_outbox_p", "relaybox_messages_p") if sending else ("relaybox_inbox_p",)
        if not all(any(p.startswith(w) for p in dropped) for w in wanted):
            raise RuntimeError(f"nothing dropped: {dropped}")
    else:
        asyncio.run(_purge(url, sending))
    wall = time.perf_counter() - t0
    cpu, own = _busy_cpu() - cpu0, time.process_time() - own0
    dead, size = _dead_and_size(url, ("outbox", "messages") if sending else ("inbox",))
    return {"wall": wall, "cpu": cpu, "own": own, "dead": dead, "size": size}


async def _migrate_live(url: str, n: int) -> dict[str, Any]:
    import hashlib

    from relaybox.store import open_store
    from relaybox.store.inbox_rows import NewDelivery

    store = open_store(url)
    stop = asyncio.Event()
    slowest, accepted, errors = 0.0, 0, []

    async def traffic() -> None:
        nonlocal slowest, accepted
        k = 0
        while not stop.is_set():
            batch = []
            for _ in range(10):
                k += 1
                body = f'{{"n": {k}}}'.encode()
                batch.append(
                    NewDelivery(
                        source="live", account="a", event_id=f"live_{k}", event_type="t",
                        tenant=None, fingerprint=hashlib.sha256(body).digest(), payload=body,
                        headers="{}", version=None, received_at=time.time(),
                    )
                )  # fmt: skip
            t = time.perf_counter()
            try:
                await store.inbox.accept(batch)
                accepted += len(batch)
            except Exception as exc:  # counted: the run reports them
                errors.append(f"{type(exc).__name__}: {exc}")
            slowest = max(slowest, time.perf_counter() - t)

    load = asyncio.create_task(traffic())
    try:
        await asyncio.sleep(1)
        t0 = time.perf_counter()
        converted = await store.partitions.convert("day")
        wall = time.perf_counter() - t0
        await asyncio.sleep(1)
    finally:
        stop.set()
        await load
    rows = await store.fetch_all(
        "SELECT count(*) FILTER (WHERE source = 'stripe') AS old,"
        " count(*) FILTER (WHERE source = 'live') AS live FROM relaybox_inbox"
    )
    await store.close()
    return {
        "wall": wall,
        "converted": converted,
        "accepted": accepted,
        "slowest": slowest,
        "errors": errors[:3],
        "old": rows[0]["old"],
        "live": rows[0]["live"],
    }


def migrate_main(rows: int | None = None) -> str:
    n = rows or 1_000_000
    url = fresh_pg_database("parts_migrate")
    _migrate(url)
    _fill(url, n)
    with psycopg.connect(url, autocommit=True) as conn:  # bulk rows carry no keys
        conn.execute(
            "INSERT INTO relaybox_keys_backfill (kind, finished_at) VALUES ('event', 1)"
            " ON CONFLICT (kind) DO UPDATE SET finished_at = 1"
        )
    r = asyncio.run(_migrate_live(url, n))
    if r["errors"] or r["old"] != n or r["live"] != r["accepted"]:
        raise RuntimeError(f"the live migration lost or refused rows: {r}")
    return table(
        f"live migration of {n:,} events (and as many attempts) to day partitions",
        ["conversion wall s", "accepts meanwhile", "slowest accept s", "errors", "rows kept"],
        [[f"{r['wall']:.2f}", f"{r['accepted']:,}", f"{r['slowest']:.2f}", "0",
          f"{r['old']:,} + {r['live']:,}"]],
    )  # fmt: skip


def main(
    *, quick: bool = False, rounds: int = 3, rows: int | None = None, sending: bool = False
) -> str:
    n = 2_000 if quick else rows or int(os.environ.get("BENCH_PARTITIONS_N", "100000"))
    runs: dict[str, list[dict[str, Any]]] = {"purge": [], "drop": []}
    what = "outbox and messages" if sending else "inbox"
    for k in range(rounds):
        for mode in ("purge", "drop") if k % 2 == 0 else ("drop", "purge"):
            r = one(mode, n, k, sending)
            runs[mode].append(r)
            print(
                f"round {k + 1} {mode}: {r['wall']:.2f} s wall, {r['cpu']:.2f} s CPU"
                f" (machine), {r['own']:.2f} s CPU (relaybox), {r['dead']:,} dead rows,"
                f" {what} {r['size'] / 2**20:.1f} MiB after",
                flush=True,
            )
    rows_out = []
    for mode, label in (("purge", "per-row purge (UPDATE)"), ("drop", "partition drop")):
        rs = runs[mode]
        rows_out.append(
            [
                label,
                " / ".join(f"{r['wall']:.2f}" for r in rs),
                f"{median([r['cpu'] for r in rs]):.2f}",
                f"{median([r['own'] for r in rs]):.2f}",
                f"{median([r['dead'] for r in rs]):,.0f}",
                f"{median([r['size'] for r in rs]) / 2**20:.1f}",
            ]
        )
    expired = (
        f"{n:,} sent messages (body ~1 KB, one delivery and one attempt each)"
        if sending
        else f"{n:,} finished events (payload ~1 KB, one attempt each)"
    )
    return table(
        f"expiring {expired}, {rounds} rounds",
        [
            "how",
            "wall s (each round)",
            "CPU s machine (median)",
            "CPU s relaybox",
            "dead rows after",
            f"{what} MiB after",
        ],
        rows_out,
    )
