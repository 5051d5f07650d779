"""Bytes on disk per event, both directions, on PostgreSQL: what one PostgreSQL holds.

Receiving: ``n`` Stripe-shaped ``invoice.paid`` deliveries (about 1.3 KB of JSON each,
with their headers) go into the inbox through the store, and ``relaybox worker`` runs
the credits example on them (a business key and an outbox row each). Sending: ``n``
messages of about 1 KB are published to one endpoint and ``relaybox dispatch``
delivers them to a local sink (one attempt logged each). Each event and each message
names a customer as its subject, indexed for erasure (``relaybox_subjects``, shown
always). Then the sizes of every
relaybox table (heap, indexes and TOAST) per event: as written, after the retention
purge (payloads, bodies and response bytes dropped; keys, outcomes and attempt rows
kept) and a plain ``VACUUM`` (space PostgreSQL reuses for new rows, not returned to
the file system), and after ``VACUUM FULL`` (what the kept rows take, compacted).
The last row sums the keys tables, what stays once retention drops the history.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from typing import Any

import asyncpg

from bench.common import ROOT, free_port, fresh_pg_database, table
from bench.dispatch import start_sink
from bench.process import WORKSPACES


def stripe_invoice(i: int, rng: random.Random) -> bytes:
    """An ``invoice.paid`` event shaped like Stripe's (ids, amounts, one line item)."""
    ident = f"{i:08d}{rng.getrandbits(40):010x}"
    event = {
        "id": f"evt_{ident}",
        "object": "event",
        "api_version": "2024-06-20",
        "created": 1_764_000_000 + i,
        "type": "invoice.paid",
        "livemode": False,
        "pending_webhooks": 1,
        "request": {"id": None, "idempotency_key": None},
        "data": {
            "object": {
                "id": f"in_{ident}",
                "object": "invoice",
                "invoice": f"in_{ident}",
                "workspace": f"ws{i % WORKSPACES}",
                "account_country": "PT",
                "amount_due": 2900,
                "amount_paid": 2900,
                "currency": "eur",
                "customer": f"cus_{rng.getrandbits(48):012x}",
                "customer_email": f"billing+{i}@example.com",
                "hosted_invoice_url": f"https://invoice.stripe.com/i/acct_1/test_{ident}",
                "lines": {
                    "object": "list",
                    "data": [
                        {
                            "id": f"il_{ident}",
                            "amount": 2900,
                            "description": "1 x Pro plan (at EUR 29.00 / month)",
                            "period": {"start": 1_764_000_000, "end": 1_766_592_000},
                            "price": {"id": "price_pro_monthly", "unit_amount": 2900},
                            "quantity": 1,
                        }
                    ],
                },
                "status": "paid",
                "subscription": f"sub_{rng.getrandbits(48):012x}",
            }
        },
    }
    return json.dumps(event, separators=(",", ":")).encode()


HEADERS = json.dumps(
    {
        "content-type": "application/json; charset=utf-8",
        "stripe-signature": "t=1764000000,v1=" + "0" * 64,
        "user-agent": "Stripe/1.0 (+https://stripe.com/docs/webhooks)",
    }
)


async def receive(url: str, n: int) -> None:
    """``n`` deliveries through the store's accept, then the worker processes them."""
    from relaybox.sources.base import subject_digest
    from relaybox.store import NewDelivery, open_store

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "CREATE TABLE bench_balances (workspace TEXT PRIMARY KEY, credits BIGINT NOT NULL)"
        )
        await conn.execute(
            "INSERT INTO bench_balances SELECT 'ws' || g, 0 FROM generate_series(0, $1) g",
            WORKSPACES - 1,
        )
    finally:
        await conn.close()
    rng = random.Random(7)
    store = open_store(url)
    try:
        for start in range(0, n, 500):
            batch = []
            for i in range(start, min(n, start + 500)):
                body = stripe_invoice(i, rng)
                # The credits handler reads "invoice" and "workspace" at the top level.
                payload = json.loads(body)
                payload.update(payload["data"]["object"])
                raw = json.dumps(payload, separators=(",", ":")).encode()
                delivery = NewDelivery(
                    "bench", "acct", payload["id"], "invoice.paid", None,
                    raw[:32], raw, HEADERS, None, time.time(),
                    subject=subject_digest(payload["customer"]),
                )  # fmt: skip
                batch.append(delivery)
            await store.inbox.accept(batch)
    finally:
        await store.close()
    env = {**os.environ, "RELAYBOX_DATABASE_URL": url, "RELAYBOX_LOG_LEVEL": "warning"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "relaybox", "worker", "--app", "bench.process_app:box"],
        cwd=ROOT,
        env=env,
    )
    try:
        await _until(url, "SELECT count(*) FROM relaybox_inbox WHERE status = 'pending'", 0, proc)
    finally:
        proc.terminate()
        proc.wait(30)


async def send(url: str, n: int) -> None:
    """``n`` messages to one endpoint, delivered by ``relaybox dispatch`` to a sink."""
    from relaybox.outbound.endpoints import EndpointSpec, create_endpoint
    from relaybox.outbound.vault import new_key

    os.environ["RELAYBOX_DATABASE_URL"] = url
    os.environ.setdefault("RELAYBOX_OUTBOUND__SECRETS_KEY", new_key())
    port = free_port()
    sink = start_sink(port, "uvicorn")
    from bench.dispatch_app import box

    box.settings = box.settings.model_copy(update={"database_url": url})
    rng = random.Random(11)
    try:
        await create_endpoint(
            box,
            "bench",
            EndpointSpec(url=f"http://127.0.0.1:{port}/ok/0", event_types=["order.*"]),
        )
        for start in range(0, n, 250):
            async with box.store.transaction() as conn:
                for i in range(start, min(n, start + 250)):
                    order = {
                        "order": f"ord_{i:08d}",
                        "customer": f"cus_{rng.getrandbits(48):012x}",
                        "email": f"buyer+{i}@example.com",
                        "total": {"amount": 12900, "currency": "EUR"},
                        "items": [
                            {"sku": f"SKU-{j:04d}", "qty": 1, "price": 4300} for j in range(3)
                        ],
                        "shipping": {"city": "Lisboa", "country": "PT", "postcode": "1000-001"},
                        "note": "x" * 400,
                    }
                    await box.publish(
                        conn,
                        "order.completed",
                        order,
                        tenant="bench",
                        idempotency_key=f"o{i}",
                        subject=order["customer"],
                    )
        await box.close()
        env = {**os.environ, "RELAYBOX_LOG_LEVEL": "warning"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "relaybox", "dispatch", "--app", "bench.dispatch_app:box"],
            cwd=ROOT,
            env=env,
        )
        try:
            await _until(url, "SELECT count(*) FROM relaybox_outbox WHERE status = 'sent'", n, proc)
        finally:
            proc.terminate()
            proc.wait(30)
    finally:
        sink.kill()
        sink.wait(10)


async def _until(url: str, sql: str, value: int, proc: subprocess.Popen[bytes]) -> None:
    conn = await asyncpg.connect(url)
    try:
        deadline = time.time() + 900
        while (await conn.fetchval(sql)) != value:
            if time.time() > deadline or proc.poll() is not None:
                raise RuntimeError(f"bench size: {sql!r} never reached {value}")
            await asyncio.sleep(0.2)
    finally:
        await conn.close()


PURGE_SECONDS: list[float] = []


KEPT_FOR_GOOD = (
    "relaybox_event_keys",
    "relaybox_message_keys",
    "relaybox_business_keys",
    "relaybox_outbox_keys",
    "relaybox_operations",
)
"""The tables of keys kept apart from the history (migrations 0027, 0031 and 0034: the
outbox's keys, a handler's row's), and the readable business keys (what is left of them
once retention purged their events). A delivery's key (``relaybox_delivery_keys``,
migration 0037) lives as long as its message: shown on its own row."""

DELIVERY_KEYS = "relaybox_delivery_keys"


async def sizes(url: str) -> dict[str, int]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT relname, pg_total_relation_size(oid) AS bytes FROM pg_class"
            " WHERE relkind = 'r' AND relname LIKE 'relaybox\\_%' ORDER BY relname"
        )
        return {r["relname"]: r["bytes"] for r in rows}
    finally:
        await conn.close()


async def purge(url: str) -> None:
    """The retention purge of everything finished (as if its age had passed), then
    ``VACUUM FULL``."""
    from relaybox import Relaybox
    from relaybox.retention import purge

    box = Relaybox(url)
    try:
        await purge(box, older_than=0.0)
    finally:
        await box.close()
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("VACUUM FULL")
    finally:
        await conn.close()


async def measure(n: int) -> dict[str, dict[str, int]]:
    url = fresh_pg_database("size")
    subprocess.run(
        [sys.executable, "-m", "relaybox", "migrate", "--database-url", url],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    await receive(url, n)
    await send(url, n)
    written = await sizes(url)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("VACUUM FULL")
    finally:
        await conn.close()
    kept = await sizes(url)
    t0 = time.perf_counter()
    await purge(url)
    PURGE_SECONDS.append(time.perf_counter() - t0)
    purged = await sizes(url)
    return {"written": written, "kept": kept, "purged": purged}


def main(*, quick: bool = False) -> str:
    n = int(os.environ.get("BENCH_SIZE_N", 1_000 if quick else 20_000))
    started = time.perf_counter()
    found = asyncio.run(measure(n))
    rows: list[list[Any]] = []
    stages = ("written", "kept", "purged")
    totals = dict.fromkeys(stages, 0)
    for name in sorted(found["written"]):
        for stage in stages:
            totals[stage] += found[stage].get(name, 0)
        # Tables the run does not grow (one page and an index or two) are left out.
        if found["written"][name] >= 64 * 1024 or name == "relaybox_subjects":
            rows.append([name, *(found[stage].get(name, 0) / n for stage in stages)])
    rows.append(["all relaybox tables", *(totals[s] / n for s in stages)])
    # What outlives the history (its partitions dropped by retention): the keys that
    # decide duplicates, repeated publishes and business keys.
    rows.append(
        [
            "keys kept for good (" + " + ".join(KEPT_FOR_GOOD) + ")",
            *(sum(found[s].get(t, 0) for t in KEPT_FOR_GOOD) / n for s in stages),
        ]
    )
    rows.append(
        [
            f"delivery keys, dropped with their messages' partitions ({DELIVERY_KEYS})",
            *(found[s].get(DELIVERY_KEYS, 0) / n for s in stages),
        ]
    )
    return table(
        f"bytes on disk per event, {n:,} received and processed + {n:,} published and "
        f"delivered (PostgreSQL, heap + indexes + TOAST; the purge took "
        f"{PURGE_SECONDS[-1]:.1f} s; {time.perf_counter() - started:.0f} s in all)",
        [
            "table",
            "as written (with dead row versions)",
            "kept, with payloads (VACUUM FULL)",
            "after the retention purge",
        ],
        [[r[0], *(f"{v:,.0f}" for v in r[1:])] for r in rows],
    )
