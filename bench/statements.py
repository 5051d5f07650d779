"""python -m bench.statements: the fixed cost of a statement on time partitions, per
hot statement, against one table each.

Builds three databases from one seed (``BENCH_STATEMENTS_ROWS`` finished rows, 10,000
by default, as ``bench growth`` seeds them, plus 20 endpoints and 20,000 pending
deliveries): ``plain`` (one table each), ``day`` (converted as ``relaybox migrate
--partitions day`` converts it: the first partition, those made ahead, the DEFAULT)
and ``day+30`` (the same with partitions made 30 days ahead, about what a day layout
keeps in steady state with a 30-day retention). Then runs the hot statements as the
code runs them (asyncpg, prepared, each on a connection with its pool's settings),
the layouts interleaved round by round, and reports per statement the median CPU time
of the PostgreSQL backend (``/proc/<pid>/schedstat``: far less noisy than the wall
time on a shared machine; the server must run on this machine) and the median wall
time the client saw. Statements that write are rolled back, except the accept (new
keys each time).

``--rounds`` (default 200) rounds; the first tenth is warm-up, left out. ``--against
REF`` also runs, interleaved in the same rounds, the claim and the lease as commit REF
wrote them (git show), the claim on a connection with that commit's settings: before
2026-12-07 it was left to PostgreSQL's choice of plan (custom plans, planned anew each
call)."""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

import asyncpg

from bench.common import fresh_pg_database, table
from bench.growth import partition_copy, seed, seed_name

LAYOUTS = ("plain", "day", "day+30")
GENERIC = {"plan_cache_mode": "force_generic_plan", "enable_bitmapscan": "off"}
"""Backend.generic_pool's settings (the accept, the lease)."""
START = {"synchronous_commit": "off", "plan_cache_mode": "force_generic_plan"}
"""Backend.start_pool's (the claim, start marks)."""
ENDPOINTS = 20
PENDING = 20_000


def cpu_ns(conn: asyncpg.Connection) -> int:
    with open(f"/proc/{conn.get_server_pid()}/schedstat") as f:
        return int(f.read().split()[0])


async def fill(url: str) -> None:
    """``ENDPOINTS`` endpoints and ``PENDING`` deliveries due now, spread over them."""
    from relaybox import Relaybox
    from relaybox.outbound import configure
    from relaybox.outbound.endpoints import EndpointSpec, create_endpoint
    from relaybox.outbound.vault import new_key

    os.environ.setdefault("RELAYBOX_OUTBOUND__SECRETS_KEY", new_key())
    box = Relaybox(url)
    configure(box, allow_insecure_loopback=True, allow_networks=["127.0.0.0/8"])
    try:
        spec = EndpointSpec(
            url="http://127.0.0.1:9/ok", event_types=["order.*"], max_in_flight=5, timeout=5.0
        )
        ids = [(await create_endpoint(box, "bench", spec))[0].id for _ in range(ENDPOINTS)]
    finally:
        await box.close()
    conn = await asyncpg.connect(url)
    try:
        now = time.time()
        await conn.execute(
            "WITH m AS (INSERT INTO relaybox_messages (id, tenant, event_type, body, created_at)"
            " SELECT 'msg_' || lpad(to_hex(($2::float8 * 1000)::bigint), 11, '0') || 'p' || g,"
            " 'bench', 'order.completed', json_build_object('n', g)::text, $2::float8"
            " FROM generate_series(0, $1::bigint - 1) g RETURNING id)"
            " INSERT INTO relaybox_outbox (channel, key, payload, tenant, status,"
            " next_attempt_at, created_at, updated_at, lane, endpoint_id, message_id)"
            " SELECT 'webhook', m.id || ':' || e.ep, 'null', 'bench', 'pending', $2::float8,"
            " $2::float8, $2::float8, e.ep, e.ep, m.id FROM m CROSS JOIN LATERAL"
            " (SELECT ($3::text[])[1 + abs(hashtext(m.id)) % cardinality($3::text[])] AS ep) e",
            PENDING,
            now,
            ids,
        )
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()


async def more_partitions(url: str, days: int) -> int:
    from relaybox.store.backend import load_queries
    from relaybox.store.partitions import maintain

    conn = await asyncpg.connect(url)
    try:
        done = await maintain(conn, load_queries("postgres"), "day", ahead=days)
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()
    return len(done.created)


def build(rows: int) -> dict[str, str]:
    """The three databases (see the module's text): layout → URL."""
    url = fresh_pg_database(seed_name((rows, "plain")))
    asyncio.run(seed(url, rows, PENDING))
    partition_copy(rows, "day")
    urls = {
        "plain": fresh_pg_database("statements_plain", seed_name((rows, "plain"))),
        "day": fresh_pg_database("statements_day", seed_name((rows, "day"))),
    }
    for url in urls.values():
        asyncio.run(fill(url))
    urls["day+30"] = fresh_pg_database("statements_day30", "statements_day")
    asyncio.run(more_partitions(urls["day+30"], 30))
    return urls


class Layout:
    """One database's connections, as the pools open them."""

    def __init__(self, name: str, url: str) -> None:
        self.name, self.url = name, url

    async def open(self) -> None:
        from relaybox.store.backend import load_queries
        from relaybox.store.postgres import _PREPARED

        q = load_queries("postgres")
        self.generic = await asyncpg.connect(self.url, server_settings=GENERIC)
        self.start = await asyncpg.connect(self.url, server_settings=START)
        self.raw = await asyncpg.connect(self.url)  # the worker's (SQLAlchemy's) sessions
        # --against: the start pool as it was (PostgreSQL chose each claim's plan)
        self.start_then = await asyncpg.connect(
            self.url, server_settings={"synchronous_commit": "off"}
        )
        await self.raw.execute(
            ";".join(f"PREPARE relaybox_{n}({t}) AS {q[n]}" for n, t in _PREPARED.items())
        )
        self.pending = [
            r[0]
            for r in await self.raw.fetch(
                "SELECT id FROM relaybox_inbox WHERE status = 'pending' ORDER BY id LIMIT 2000"
            )
        ]
        self.partitions = int(
            await self.raw.fetchval(
                "SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                " WHERE c.relkind = 'r' AND (c.relname LIKE 'relaybox_outbox_p%'"
                " OR c.relname = 'relaybox_outbox_default')"
            )
        )

    async def close(self) -> None:
        for conn in (self.generic, self.start, self.raw, self.start_then):
            await conn.close()


Sample = tuple[float, float]
"""Backend CPU µs, client wall µs."""


async def timed(conn: asyncpg.Connection, sql: str, args: Sequence[Any] | None) -> Any:
    c0, t0 = cpu_ns(conn), time.perf_counter()
    res = await (conn.execute(sql) if args is None else conn.fetch(sql, *args))
    t1, c1 = time.perf_counter(), cpu_ns(conn)
    return ((c1 - c0) / 1e3, (t1 - t0) * 1e6), res


async def undone(conn: asyncpg.Connection, sql: str, args: Sequence[Any] | None = None) -> Any:
    """``sql`` timed in a transaction rolled back after it."""
    await conn.execute("BEGIN")
    try:
        return await timed(conn, sql, args)
    finally:
        await conn.execute("ROLLBACK")


def lease_args(now: float, slots: int, sent: Sequence[Any] = ()) -> tuple[Any, ...]:
    """outbox_lease's parameters (PostgresDispatch.outbox_lease): ``slots`` free, the
    rows ``sent`` recorded as successes."""
    ids = [r["id"] for r in sent]
    cols: list[list[Any]] = [
        ids,
        [r["lease_token"] for r in sent],
        [r["attempts"] for r in sent],
        [r["endpoint_id"] for r in sent],
        [now] * len(ids),
        [0.004] * len(ids),
        [200] * len(ids),
        [None] * len(ids),
        [""] * len(ids),
    ]
    fair: tuple[Any, ...] = (100, 25, [], [])  # lane cap, a tenant's rows, tenants, theirs
    heads = ["{}"] * len(ids)
    return (
        now,
        slots,
        ["webhook"],
        "bench",
        now + 30,
        *cols,
        ["webhook"],
        2,
        *fair,
        heads,
    )


async def round_of(
    layout: Layout,
    out: dict[tuple[str, str], list[Sample]],
    now: float,
    then: dict[str, str] | None = None,
) -> None:
    from relaybox.store.backend import load_queries
    from relaybox.store.inbox_rows import NewDelivery
    from relaybox.store.postgres import _columns, _literal

    q = load_queries("postgres")

    def put(name: str, sample: Sample) -> None:
        out.setdefault((name, layout.name), []).append(sample)

    def execute(name: str, params: Sequence[Any]) -> str:
        return f"EXECUTE relaybox_{name}({','.join(map(_literal, params))})"

    batch = sorted(
        (
            NewDelivery(
                "bench",
                "acct",
                f"st_{random.getrandbits(64):x}",
                "invoice.paid",
                None,
                b"\x01" * 32,
                b'{"invoice": "x", "workspace": "ws1"}',
                None,
                None,
                now,
            )
            for _ in range(16)
        ),
        key=lambda d: d.key,
    )
    cols = _columns(batch)
    sample, _ = await timed(
        layout.generic,
        q["inbox_accept_fast"],
        (*cols[:11], [None] * 16, now, [None] * 16, *cols[11:]),
    )
    put("accept (16 new events)", sample)
    claims = [(layout.start, q["inbox_claim"], "")]
    if then:  # in either order, at random: neither runs on the other's warm caches
        claims.append((layout.start_then, then["inbox_claim"], " at REF"))
        random.shuffle(claims)
    for conn, sql, at in claims:
        sample, rows = await undone(conn, sql, (now, 128, 30.0, 10, 64))
        assert len(rows) == 128
        put("inbox_claim (128 rows)" + at, sample)
    ids = sorted(random.sample(layout.pending, 8))
    put("inbox_start (8 ids)", (await undone(layout.start, q["inbox_start"], (ids, now)))[0])
    group: tuple[Any, ...] = (ids, [0] * 8, [], [], [], [], [], [], [], [], [], now)
    put(
        "inbox_lock_group (8 ids)",
        (await undone(layout.raw, execute("inbox_lock_group", group)))[0],
    )
    put(
        "inbox_complete (8 ids)",
        (await undone(layout.raw, execute("inbox_complete", (ids, now))))[0],
    )
    leases = [(q["outbox_lease"], "")]
    if then:
        leases.append((then["outbox_lease"], " at REF"))
        random.shuffle(leases)
    for label, slots in (
        ("outbox_lease (5 + 5 recorded)", 5),
        ("outbox_lease (25 + 25 recorded)", 100),
    ):
        for sql, at in leases:
            await layout.generic.execute("BEGIN")
            try:  # leased, then recorded as sent with the next lease, rolled back
                first = await layout.generic.fetch(sql, *lease_args(now, slots))
                sent = [r for r in first if r["id"] is not None]
                args = lease_args(now, slots, sent)
                sample, rows = await timed(layout.generic, sql, args)
                assert len(rows[0]["recorded"]) == len(sent)
                put(label + at, sample)
            finally:
                await layout.generic.execute("ROLLBACK")


def statements_at(ref: str) -> dict[str, str]:
    """The claim's and the lease's text at commit ``ref`` (as load_queries reads them:
    comment lines dropped)."""
    import re
    import subprocess

    from bench.common import ROOT

    found: dict[str, str] = {}
    for path in ("postgres.sql", "postgres_outbound.sql"):
        text = subprocess.run(
            ["git", "show", f"{ref}:src/relaybox/store/sql/{path}"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        parts = re.split(r"^-- name: (\w+)\s*$", text, flags=re.MULTILINE)
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            lines = [ln for ln in body.splitlines() if not ln.lstrip().startswith("--")]
            found[name] = "\n".join(lines).strip()
    return {name: found[name] for name in ("inbox_claim", "outbox_lease")}


async def measure(urls: dict[str, str], rounds: int, then: dict[str, str] | None = None) -> str:
    layouts = [Layout(name, url) for name, url in urls.items()]
    for layout in layouts:
        await layout.open()
    out: dict[tuple[str, str], list[Sample]] = {}
    try:
        for i in range(rounds):
            now = time.time()
            for layout in layouts[i % len(layouts) :] + layouts[: i % len(layouts)]:
                await round_of(layout, out, now, then)
    finally:
        for layout in layouts:
            await layout.close()
    names = list(dict.fromkeys(name for name, _ in out))
    header = ["statement"]
    for layout in layouts:
        header += [f"{layout.name} CPU µs", f"{layout.name} wall µs"]
    rows: list[list[Any]] = []
    for name in names:
        row: list[Any] = [name]
        base = None
        for layout in layouts:
            samples = out[name, layout.name][rounds // 10 :]
            c = statistics.median(s[0] for s in samples)
            w = statistics.median(s[1] for s in samples)
            base = base or (c, w)
            if layout is layouts[0]:
                row += [f"{c:,.0f}", f"{w:,.0f}"]
            else:
                row += [f"{c:,.0f} (x{c / base[0]:.2f})", f"{w:,.0f} (x{w / base[1]:.2f})"]
        rows.append(row)
    parts = ", ".join(f"{layout.name} {layout.partitions}" for layout in layouts)
    return table(
        f"statements: medians of {rounds - rounds // 10} interleaved rounds; partitions of"
        f" relaybox_outbox: {parts}",
        header,
        rows,
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.statements")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--against", metavar="REF", help="also the claim and lease at REF")
    args = parser.parse_args()
    then = statements_at(args.against) if args.against else None
    from relaybox.log import configure_logging

    configure_logging("warning")
    rows = int(os.environ.get("BENCH_STATEMENTS_ROWS", "10000"))
    started = time.perf_counter()
    urls = build(rows)
    print(f"  statements: built in {time.perf_counter() - started:,.0f} s", flush=True)
    print(asyncio.run(measure(urls, args.rounds, then)))


if __name__ == "__main__":
    main()
