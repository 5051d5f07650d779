"""python -m bench retention: the purge with ages per tenant against the global purge.

One PostgreSQL database of ``BENCH_RETENTION_N`` (300,000) finished events, as many
messages and sent deliveries (each with an attempt and its response bytes), spread
evenly over 1,000 tenants and finished evenly over the last 120 days, is copied
(``CREATE DATABASE … TEMPLATE``) for each round of each mode:

* ``global``: no tenant has ages of its own: the purge at 30 days as before (four
  passes, the statements of a purge without ages per tenant);
* ``grouped``: a third of the tenants keep 7 days and a third 90 days (set through the
  admin API's store method), the rest the global 30 days: one pass per distinct age
  and table, and a filtering pass for the rest (some keep longer than 30 days);
* ``per tenant``: the same ages, one statement per tenant (``TENANTS_PER_STATEMENT``
  = 1): what grouping saves (one round only outside ``--quick``: it takes minutes,
  and its time is the statements', not the rows').

Each round times the first purge (rows due purged), a second one right after in the
same loop (nothing due: what every scheduled run costs at least, its scans starting
where the first ended), and a third as a new process would run it (``relaybox
purge``: its scans read again from the start). Rounds alternate the modes.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import psycopg

from bench.common import ROOT, fresh_pg_database, table

DAY = 86400.0
TENANTS = 1000
NOW = 2_000_000_000.0
AGES = {0: 7 * DAY, 1: 30 * DAY, 2: 90 * DAY}
"""Tenant n keeps AGES[n % 3]; 30 days is the global age."""


def build(n: int) -> None:
    """The template database: migrated, filled, analyzed."""
    url = fresh_pg_database("retention_tpl")
    migrated = subprocess.run(
        [sys.executable, "-m", "relaybox", "migrate", "--database-url", url],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if migrated.returncode:
        raise RuntimeError(f"relaybox migrate failed: {migrated.stderr[-2000:]}")
    spread = int(120 * DAY)
    rows = (
        f"SELECT g, 't' || lpad((g % {TENANTS})::text, 4, '0') AS tenant,"
        f" {NOW} - ((g::bigint * 7919) % {spread}) AS t FROM generate_series(1, {n}) g"
    )
    statements = [
        "INSERT INTO relaybox_inbox (source, account, event_id, event_type, tenant,"
        " fingerprint, payload, headers, status, attempts, next_attempt_at, received_at,"
        " updated_at, done_at)"
        " SELECT CASE WHEN g % 2 = 0 THEN 'stripe' ELSE 'github' END, 'acct', 'evt_' || g,"
        " 'thing.happened', tenant, decode(md5(g::text), 'hex'),"
        " convert_to(repeat('x', 300), 'UTF8'), '{}', 'done', 1, t, t - 1, t, t"
        f" FROM ({rows}) s",
        "INSERT INTO relaybox_messages (id, tenant, event_type, body, created_at)"
        f" SELECT 'msg_' || g, tenant, 'thing.happened', repeat('x', 300), t - 1 FROM ({rows}) s",
        "INSERT INTO relaybox_outbox (channel, key, payload, tenant, status, attempts,"
        " next_attempt_at, created_at, updated_at, sent_at, message_id)"
        " SELECT 'webhook', 'msg_' || g || ':ep', 'null', tenant, 'sent', 1, t, t - 1, t, t,"
        f" 'msg_' || g FROM ({rows}) s",
        "INSERT INTO relaybox_outbox_attempts (outbox_id, attempt, started_at, duration,"
        " outcome, status_code, response, headers)"
        " SELECT id, 1, updated_at, 0.1, 'ok', 200, 'thanks', '{}' FROM relaybox_outbox",
        "VACUUM ANALYZE",
    ]
    with psycopg.connect(url, autocommit=True) as conn:
        for sql in statements:
            conn.execute(sql)  # type: ignore[arg-type]


def with_policies() -> None:
    """A copy of the template where two thirds of the tenants have ages of their own."""
    url = fresh_pg_database("retention_tpl_ages", template="retention_tpl")
    with psycopg.connect(url, autocommit=True) as conn:
        for n in range(TENANTS):
            age = AGES[n % 3]
            if age != 30 * DAY:
                conn.execute(
                    "INSERT INTO relaybox_retention_policies (tenant, payload_max_age,"
                    " outbox_payload_max_age, updated_at, updated_by) VALUES (%s, %s, %s, %s, %s)",
                    (f"t{n:04}", age, age, NOW, "bench"),
                )
        conn.execute("VACUUM ANALYZE relaybox_retention_policies")


async def timed_purges(url: str, per_statement: int | None) -> dict[str, Any]:
    from relaybox import FrozenClock, Relaybox
    from relaybox.config import Settings
    from relaybox.retention import policy, purge

    saved = policy.TENANTS_PER_STATEMENT
    if per_statement is not None:
        policy.TENANTS_PER_STATEMENT = per_statement
    box = Relaybox(settings=Settings(database_url=url), clock=FrozenClock(NOW))
    try:
        await box.store.migrate()
        marks = policy.ScanMarks()  # as the maintenance loop keeps them
        started = time.perf_counter()
        first = await purge(box, marks=marks)
        first_s = time.perf_counter() - started
        started = time.perf_counter()
        again = await purge(box, marks=marks)
        again_s = time.perf_counter() - started
        started = time.perf_counter()
        fresh = await purge(box)  # a new process (relaybox purge): no marks
        fresh_s = time.perf_counter() - started
    finally:
        policy.TENANTS_PER_STATEMENT = saved
        await box.close()
    rows = first.inbox + first.outbox + first.messages
    for nothing in (again, fresh):
        assert nothing.inbox + nothing.outbox + nothing.messages == 0, nothing
    detail = (first.inbox, first.outbox, first.messages)
    return {"first": first_s, "again": again_s, "fresh": fresh_s, "rows": rows,
            "passes": first.passes, "detail": detail}  # fmt: skip


def expected(n: int, scoped: bool) -> tuple[int, int, int]:
    """Rows a purge at NOW must empty per table (inbox, outbox, messages)."""
    spread = int(120 * DAY)
    inbox = outbox = messages = 0
    for g in range(1, n + 1):
        t = NOW - ((g * 7919) % spread)
        age = AGES[(g % TENANTS) % 3] if scoped else 30 * DAY
        if t < NOW - age:
            inbox += 1
            outbox += 1
        if t - 1 < NOW - age:
            messages += 1
    return inbox, outbox, messages


def main(*, quick: bool = False, rounds: int = 3) -> str:
    n = int(os.environ.get("BENCH_RETENTION_N", 3_000 if quick else 300_000))
    started = time.perf_counter()
    build(n)
    with_policies()
    built = time.perf_counter() - started
    modes: list[tuple[str, str, int | None, bool]] = [
        ("global (no ages per tenant)", "retention_tpl", None, False),
        ("grouped (1,000 tenants, 3 ages)", "retention_tpl_ages", None, True),
        ("one statement per tenant", "retention_tpl_ages", 1, True),
    ]
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, *_ in modes}
    for round_ in range(rounds):
        for name, template, per_statement, scoped in modes:
            if per_statement is not None and round_ and not quick:
                continue  # minutes a round, and statements, not rows, make its time
            url = fresh_pg_database("retention_run", template=template)
            found = asyncio.run(timed_purges(url, per_statement))
            want = expected(n, scoped)
            assert found["detail"] == want, (name, found["detail"], want)
            results[name].append(found)
    out = []
    for name, *_ in modes:
        runs = results[name]
        out.append(
            [
                name,
                runs[0]["passes"],
                runs[0]["rows"],
                statistics.median(r["first"] for r in runs),
                ", ".join(f"{r['first']:.2f}" for r in runs),
                statistics.median(r["again"] for r in runs),
                ", ".join(f"{r['again']:.2f}" for r in runs),
                statistics.median(r["fresh"] for r in runs),
                ", ".join(f"{r['fresh']:.2f}" for r in runs),
            ]
        )
    return table(
        f"retention: purge of {n:,} events, messages and deliveries each, 1,000 tenants "
        f"(PostgreSQL; built in {built:.0f} s; {rounds} rounds, medians)",
        (
            "mode",
            "passes",
            "rows purged",
            "first s",
            "rounds",
            "again s",
            "rounds",
            "new process s",
            "rounds",
        ),
        out,
    )
