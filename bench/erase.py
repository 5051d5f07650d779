"""Erasing one subject among many rows, on PostgreSQL: time and rows touched.

The inbox is filled with ``size`` finished events (about 450 bytes of Stripe-shaped
JSON each, with headers, and a ``last_error`` quoting the customer's e-mail from a
first failed attempt, whose row in ``relaybox_inbox_attempts`` is there too), 10 per
customer, each indexed under its customer's subject digest as a source with
``subject = "data.object.customer"`` indexes it at accept; plus three customers each
of 10, 100 and 1,000 events. Filling is one INSERT ... SELECT generate_series per
250,000 rows (the accept path is measured apart below), then ``VACUUM ANALYZE`` and a
``CHECKPOINT``. Each of those customers is then erased with
:func:`relaybox.erasure.erase` (payload, headers and last error of each event, the
error text of each attempt): the table shows the median time of the three and the
shared buffers the inbox's erase statement touches for the whole subject (``EXPLAIN
(ANALYZE, BUFFERS)`` of it, rolled back, just before: the subject index, the inbox's
primary key, heap and indexes), against the pages the inbox table has. The same is
done at a tenth of the size first: the buffers stay flat as the table grows tenfold,
because the erasure reads the subject's index entries, not history. ``--rows N``
sets the size (default 1,000,000).

The accept's added cost with a subject path: the store's group-commit insert of
batches of 64 deliveries with and without subject digests, alternated (PostgreSQL; the
second runs ``inbox_accept_fast_subjects``, the same statement with the index's
INSERT), and in process :meth:`Source.verify` with and without ``subject`` and
:meth:`Source.subject_of` alone.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import time
import timeit
from typing import Any

import asyncpg

from bench.common import fresh_pg_database, table

PREFIX = b"relaybox.subject\x00"
CUSTOMERS_PER = 10


def _fill_sql(first: int, last: int, tag: str) -> str:
    """Rows ``first``..``last`` (inclusive) of the inbox, done, each with its subject
    index row: customer ``cus_<tag>_<i / 10>``; the first 3,330 rows of the range
    belong to three customers of 10, three of 100 and three of 1,000 events."""
    d = f"(g - {first})"
    customer = (
        f"CASE WHEN {d} < 30 THEN 'cus_{tag}_ten_' || ({d} / 10)"
        f" WHEN {d} < 330 THEN 'cus_{tag}_hundred_' || (({d} - 30) / 100)"
        f" WHEN {d} < 3330 THEN 'cus_{tag}_thousand_' || (({d} - 330) / 1000)"
        f" ELSE 'cus_{tag}_' || (g / {CUSTOMERS_PER}) END"
    )
    return f"""
WITH rows AS (
    SELECT g, {customer} AS customer FROM generate_series({first}, {last}) AS g
), ins AS (
    INSERT INTO relaybox_inbox (source, account, event_id, event_type, tenant, fingerprint,
        payload, headers, status, attempts, next_attempt_at, received_at, updated_at,
        done_at, last_error)
    SELECT 'stripe', 'acct_1', 'evt_' || g, 'invoice.paid', NULL,
        sha256(convert_to('evt_' || g, 'UTF8')),
        convert_to(json_build_object(
            'id', 'evt_' || g, 'object', 'event', 'type', 'invoice.paid',
            'created', 1764000000 + g,
            'data', json_build_object('object', json_build_object(
                'id', 'in_' || g, 'object', 'invoice', 'customer', customer,
                'customer_email', 'billing+' || g || '@example.com',
                'amount_paid', 2900, 'currency', 'eur', 'status', 'paid',
                'hosted_invoice_url', 'https://invoice.stripe.com/i/acct_1/test_' || g,
                'description', '1 x Pro plan (at EUR 29.00 / month)')))::text, 'UTF8'),
        '{{"content-type": "application/json", "stripe-signature": "t=1764000000,v1=abc"}}',
        'done', 2, 0, 1764000000 + g, 1764000000 + g, 1764000000 + g,
        'ValueError: no account for billing+' || g || '@example.com'
    FROM rows
    RETURNING id, event_id
), attempts AS (
    INSERT INTO relaybox_inbox_attempts (inbox_id, attempt, outcome, error, worker,
        started_at, finished_at)
    SELECT ins.id, 1, 'retry',
        'ValueError: no account for billing+' || r.g || '@example.com', 'bench',
        1764000000 + r.g, 1764000000 + r.g
    FROM ins JOIN rows r ON ins.event_id = 'evt_' || r.g
)
INSERT INTO relaybox_subjects (digest, kind, ref)
SELECT sha256('\\x{PREFIX.hex()}'::bytea || convert_to(r.customer, 'UTF8')), 'inbox',
       ins.id::text
FROM ins JOIN rows r ON ins.event_id = 'evt_' || r.g
"""


async def _buffers(conn: asyncpg.Connection, sql: str, digest: bytes) -> int:
    """Shared buffers (hit or read) the inbox erase statement touches for the whole
    subject at once, in a transaction rolled back: every relation it reads, the
    subject index, the inbox's primary key and heap, the indexes it updates."""
    async with conn.transaction():
        plan = await conn.fetchval(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", digest, 0.0, 1_000_000
        )
        raise _Rollback(json.loads(plan)[0]["Plan"])


class _Rollback(Exception):
    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan


async def _touched(conn: asyncpg.Connection, sql: str, digest: bytes) -> int:
    try:
        await _buffers(conn, sql, digest)
    except _Rollback as done:
        return int(done.plan["Shared Hit Blocks"]) + int(done.plan["Shared Read Blocks"])
    raise AssertionError("unreachable")


async def _erase_rows(url: str, size: int, tag: str) -> list[list[Any]]:
    from relaybox import Relaybox
    from relaybox.config import Settings
    from relaybox.erasure import erase, subject_digest

    conn = await asyncpg.connect(url)
    box = Relaybox(settings=Settings(database_url=url))
    rows = []
    try:
        pages = await conn.fetchval(
            "SELECT relpages FROM pg_class WHERE relname = 'relaybox_inbox'"
        )
        await erase(box, subject="nobody", actor="bench", reason="warm-up")  # pools open
        for name, expected in (("ten", 10), ("hundred", 100), ("thousand", 1000)):
            times, touched = [], []
            for k in range(3):  # three customers of each size: the median
                who = f"cus_{tag}_{name}_{k}"
                touched.append(
                    await _touched(conn, box.store.db.q["erase_inbox_subject"], subject_digest(who))
                )
                started = time.perf_counter()
                done = await erase(box, subject=who, actor="bench", reason="bench")
                times.append(time.perf_counter() - started)
                assert done.rows["inbox"] == expected, (who, done.rows)
                assert done.rows["inbox_attempts"] == expected, (who, done.rows)
            rows.append(
                [
                    f"{size:,}",
                    f"{expected} + {expected}",
                    f"{sorted(times)[1] * 1000:.0f} ms",
                    ", ".join(f"{t * 1000:.0f}" for t in times),
                    sorted(touched)[1],
                    pages,
                ]
            )
    finally:
        await box.close()
        await conn.close()
    return rows


def _verify_cost() -> list[list[Any]]:
    """Source.verify with and without a subject path, and the path's own step
    (:meth:`Source.subject_of` on the parsed payload), alternated in rounds so that
    the machine's changing speed falls on both alike; the best round of each."""
    from relaybox.testing import signed_delivery, test_source

    payload = {
        "id": "evt_1",
        "type": "invoice.paid",
        "data": {"object": {"id": "in_1", "customer": "cus_123", "pad": "x" * 900}},
    }
    calls = {}
    for label, options in (
        ("verify, no subject path", {}),
        ("verify, subject = data.object.customer", {"subject": "data.object.customer"}),
    ):
        source = test_source("stripe", **options)
        source.name = "stripe"
        d = signed_delivery(source, payload=payload, now=time.time())
        headers = {k.lower(): v for k, v in d.headers.items()}
        calls[label] = functools.partial(source.verify, headers, d.body, time.time())
        if options:
            calls["subject_of alone (extract + SHA-256)"] = functools.partial(
                source.subject_of, headers, payload
            )
    n = 10_000
    best = dict.fromkeys(calls, float("inf"))
    for _ in range(7):
        for label, call in calls.items():
            best[label] = min(best[label], timeit.timeit(call, number=n))
    return [[label, f"{t / n * 1e6:.2f} µs"] for label, t in best.items()]


async def _accept_cost(url: str, batches: int) -> list[list[Any]]:
    from relaybox.store import NewDelivery, open_store

    store = open_store(url)
    await store.migrate()
    rows = []
    try:
        times: dict[bool, list[float]] = {False: [], True: []}
        for b in range(batches):
            for with_subject in (False, True):  # alternated: the same load on both
                batch = []
                for i in range(64):
                    key = f"{int(with_subject)}_{b}_{i}"
                    body = json.dumps({"id": key, "pad": "x" * 900}).encode()
                    digest = hashlib.sha256(PREFIX + f"c{i}".encode()).digest()
                    batch.append(
                        NewDelivery(
                            source="s",
                            account="a",
                            event_id=key,
                            event_type="t",
                            tenant=None,
                            fingerprint=hashlib.sha256(body).digest(),
                            payload=body,
                            headers="{}",
                            version=None,
                            received_at=time.time(),
                            subject=digest if with_subject else None,
                        )
                    )
                started = time.perf_counter()
                await store.inbox.accept(batch)
                times[with_subject].append(time.perf_counter() - started)
        for label, with_subject in (("no subject", False), ("with subject", True)):
            median = sorted(times[with_subject])[batches // 2]
            rows.append([label, f"{median * 1000:.2f} ms", f"{64 / median:,.0f} rows/s"])
    finally:
        await store.close()
    return rows


async def _run(size: int, batches: int) -> str:
    from relaybox.store import open_store

    url = fresh_pg_database("erase")
    store = open_store(url)
    await store.migrate()
    await store.close()
    conn = await asyncpg.connect(url)
    small = max(size // 10, 4000)
    results: list[list[Any]] = []
    fill: list[str] = []
    try:
        started = time.perf_counter()
        await conn.execute(_fill_sql(1, small, "a"))
        await conn.execute("VACUUM ANALYZE relaybox_inbox")
        await conn.execute("VACUUM ANALYZE relaybox_subjects")
        await conn.execute("VACUUM ANALYZE relaybox_inbox_attempts")
        await conn.execute("CHECKPOINT")
        fill.append(f"{small:,} rows in {time.perf_counter() - started:.0f} s")
    finally:
        await conn.close()
    results += await _erase_rows(url, small, "a")
    conn = await asyncpg.connect(url)
    try:
        started = time.perf_counter()
        for first in range(small + 1, size + 1, 250_000):
            await conn.execute(_fill_sql(first, min(first + 249_999, size), f"b{first}"))
        await conn.execute("VACUUM ANALYZE relaybox_inbox")
        await conn.execute("VACUUM ANALYZE relaybox_subjects")
        await conn.execute("VACUUM ANALYZE relaybox_inbox_attempts")
        await conn.execute("CHECKPOINT")
        fill.append(f"{size - small:,} more in {time.perf_counter() - started:.0f} s")
    finally:
        await conn.close()
    results += await _erase_rows(url, size, f"b{small + 1}")
    erase_table = table(
        f"Erase one subject among many finished inbox rows (PostgreSQL; filled: {'; '.join(fill)})",
        [
            "inbox rows",
            "subject's rows (events + attempts)",
            "erase time (median)",
            "each run, ms",
            "buffers touched",
            "inbox pages",
        ],
        results,
    )
    accept_url = fresh_pg_database("erase_accept")
    accept = table(
        f"The accept with a subject path: group-commit insert of 64 deliveries (PostgreSQL, "
        f"median of {batches} batches)",
        ["deliveries", "per batch", "rate"],
        await _accept_cost(accept_url, batches),
    )
    verify = table(
        "The accept with a subject path: Source.verify of a 1 KB Stripe delivery (in process, "
        "best of 7 alternated rounds of 10,000)",
        ["step", "per call"],
        _verify_cost(),
    )
    return "\n\n".join([erase_table, accept, verify])


def main(*, quick: bool = False, rows: int | None = None) -> str:
    size = rows or (20_000 if quick else 1_000_000)
    return asyncio.run(_run(size, 20 if quick else 400))
