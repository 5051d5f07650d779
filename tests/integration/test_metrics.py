"""/metrics over HTTP, parsed with prometheus_client's parser, on both backends; and
the same numbers from /metrics, ``relaybox stats --json`` and the dashboard overview
after one scripted scenario (accepted, duplicate, quarantined, dead, retrying)."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import time
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from relaybox import Context, PermanentError, Relaybox, Secret, sources
from relaybox.config import Settings
from relaybox.metrics import Metrics
from tests.conftest import Served

STD_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
TOKEN = "test-admin-token-0123456789"


def make_box(database_url: str, **settings: Any) -> Relaybox:
    """A box with one Standard Webhooks source ("std") and handlers that end each
    event type differently: ok → done, bad → dead invalid, flaky → retrying,
    anything else → dead unhandled."""
    box = Relaybox(settings=Settings(database_url=database_url, admin_token=TOKEN, **settings))
    box.source("std", sources.standard(secrets=[Secret(STD_SECRET, tenant="t1")]))

    @box.handler("std", "ok")
    async def ok(ctx: Context) -> None:
        await ctx.once(f"std:{ctx.payload['data']['id']}:grant", fingerprint="v1")
        await ctx.outbox.add("email", f"std:{ctx.payload['data']['id']}:mail", {"to": "x"})

    @box.handler("std", "bad")
    async def bad(ctx: Context) -> None:
        raise PermanentError("amount must be positive")

    @box.handler("std", "flaky")
    async def flaky(ctx: Context) -> None:
        raise ConnectionError("upstream down")

    return box


async def post(
    session: aiohttp.ClientSession, url: str, event_id: str, event_type: str, data: Any
) -> str:
    """A signed delivery through the real receiver; returns its accept status."""
    body = json.dumps({"type": event_type, "data": data}).encode()
    source = sources.standard(secrets=[Secret(STD_SECRET)])
    headers = source.sign(body, event_id=event_id, event_type=event_type, now=time.time())
    headers["content-type"] = "application/json"
    async with session.post(f"{url}/webhooks/std", data=body, headers=headers) as response:
        assert response.status == 200, await response.text()
        return str((await response.json())["status"])


async def scenario(box: Relaybox, url: str) -> dict[str, str]:
    """Deliveries over HTTP, then one worker pass: two done, one duplicate, one
    quarantined, one dead invalid, one dead unhandled, one retrying, one pending."""
    async with aiohttp.ClientSession() as session:
        answers = {
            "e1": await post(session, url, "e1", "ok", {"id": "inv_1"}),
            "e1 again": await post(session, url, "e1", "ok", {"id": "inv_1"}),
            "e1 changed": await post(session, url, "e1", "ok", {"id": "inv_1", "amount": 9}),
            "e2": await post(session, url, "e2", "ok", {"id": "inv_2"}),
            "e3": await post(session, url, "e3", "bad", {"id": "inv_3"}),
            "e4": await post(session, url, "e4", "flaky", {"id": "inv_4"}),
            "e5": await post(session, url, "e5", "mystery", {"id": "inv_5"}),
        }
        await box.worker().run_once()
        answers["e6"] = await post(session, url, "e6", "ok", {"id": "inv_6"})
    assert answers == {
        "e1": "accepted",
        "e1 again": "duplicate",
        "e1 changed": "quarantined",
        "e2": "accepted",
        "e3": "accepted",
        "e4": "accepted",
        "e5": "accepted",
        "e6": "accepted",
    }
    return answers


def parse(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(metrics: dict[Any, float], name: str, **labels: str) -> float:
    return metrics[(name, tuple(sorted(labels.items())))]


async def scrape(url: str) -> dict[Any, float]:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as response:
        assert response.status == 200
        assert response.headers["content-type"].startswith("text/plain")
        return parse(await response.text())


async def test_metrics_scrape_parses_and_counts_the_queues(database_url: str) -> None:
    box = make_box(database_url)
    try:
        async with Served(box.asgi(roles=("receiver",))) as server:
            await scenario(box, server.url)
            box.metrics.observe_delivery("webhook", 204, 0.12)
            box.metrics.observe_delivery("webhook", None, 10.0, error="timeout")
            box.metrics.observe_divergence("stripe")
            m = await scrape(server.url)
    finally:
        await box.close()
    inbox = {"queue": "inbox", "source": "std"}
    assert sample(m, "relaybox_database_up") == 1
    assert sample(m, "relaybox_queue_pending", **inbox) == 2  # e4 retrying, e6 new
    assert sample(m, "relaybox_queue_retrying", **inbox) == 1
    assert sample(m, "relaybox_queue_pending_attempts", **inbox) == 1
    assert 0 <= sample(m, "relaybox_queue_oldest_pending_age_seconds", **inbox) < 60
    assert sample(m, "relaybox_queue_rows", status="done", **inbox) == 2
    assert sample(m, "relaybox_dead_letters", reason="invalid", **inbox) == 1
    assert sample(m, "relaybox_dead_letters", reason="unhandled", **inbox) == 1
    assert sample(m, "relaybox_dead_letters", reason="exhausted", **inbox) == 0
    assert sample(m, "relaybox_quarantined", source="std") == 1
    outbox = {"queue": "outbox", "source": "email"}
    assert sample(m, "relaybox_queue_pending", **outbox) == 2
    assert sample(m, "relaybox_accept_seconds_count", status_class="2xx") == 8
    assert sample(m, "relaybox_inbox_outcomes_total", source="std", outcome="done") == 2
    delivered = {"channel": "webhook"}
    assert sample(m, "relaybox_delivery_results_total", status_class="2xx", **delivered) == 1
    assert sample(m, "relaybox_delivery_results_total", status_class="timeout", **delivered) == 1
    assert sample(m, "relaybox_delivery_seconds_count", status_class="2xx", **delivered) == 1
    assert sample(m, "relaybox_reconcile_divergences_total", source="stripe") == 1


async def test_a_scrape_storm_reads_the_database_once_per_second(database_url: str) -> None:
    box = make_box(database_url)
    reads = 0
    original = box.store.db.connect  # every read of the store's areas opens one here

    def counting() -> Any:
        nonlocal reads
        reads += 1
        return original()

    box.store.db.connect = counting  # type: ignore[method-assign]
    try:
        await box.metrics.scrape(box)
        one = reads  # the queues' snapshot and the database's health
        assert 1 <= one <= 2
        for _ in range(20):
            await box.metrics.scrape(box)
        assert reads == one
        box.metrics._snapshot_read_at -= Metrics.cache_seconds  # the second passes
        await box.metrics.scrape(box)
        assert reads == 2 * one
    finally:
        await box.close()


async def test_an_unreachable_database_reports_down_instead_of_failing() -> None:
    box = make_box("postgresql://nobody@127.0.0.1:1/none")
    try:
        m = parse((await box.metrics.scrape(box)).decode())
    finally:
        await box.close()
    assert sample(m, "relaybox_database_up") == 0
    assert ("relaybox_queue_pending", (("queue", "inbox"), ("source", "std"))) not in m


async def test_long_transactions_and_dead_rows_are_exported(database_url: str) -> None:
    """PostgreSQL: a session idle in a transaction that read relaybox_inbox shows as the
    oldest transaction touching relaybox's tables, and deleted rows as dead rows until
    vacuum. SQLite: the pages deletes freed and the write-ahead log's size."""
    box = make_box(database_url)
    try:
        async with Served(box.asgi(roles=("receiver",))) as server:
            await scenario(box, server.url)
            if database_url.startswith("postgresql"):
                import asyncpg

                dsn = database_url.replace("postgresql+asyncpg", "postgresql")
                other, deleter = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
                try:
                    await other.execute("BEGIN")
                    await other.fetch("SELECT count(*) FROM relaybox_inbox")
                    await deleter.execute("DELETE FROM relaybox_inbox_attempts")
                    await deleter.execute("SELECT pg_stat_force_next_flush()")
                    await asyncio.sleep(1.2)
                    m = await scrape(server.url)
                finally:
                    await other.close()
                    await deleter.close()
                age = sample(m, "relaybox_db_oldest_transaction_seconds", scope="relaybox")
                assert 1.0 <= age < 60
                assert sample(m, "relaybox_db_oldest_transaction_seconds", scope="database") >= age
                assert sample(m, "relaybox_db_idle_in_transaction") == 1
                table = {"table": "relaybox_inbox_attempts"}
                assert sample(m, "relaybox_db_dead_rows", **table) >= 1
                assert 0 < sample(m, "relaybox_db_dead_row_ratio", **table) <= 1
                box.metrics._snapshot_read_at -= Metrics.cache_seconds
                m = await scrape(server.url)  # the session closed: nothing open
                assert sample(m, "relaybox_db_oldest_transaction_seconds", scope="relaybox") == 0
                assert sample(m, "relaybox_db_idle_in_transaction") == 0
            else:
                async with box.store.transaction() as conn:
                    await conn.exec_driver_sql("CREATE TABLE filler (b BLOB)")
                    await conn.exec_driver_sql(
                        "INSERT INTO filler SELECT zeroblob(4096) FROM"
                        " (WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n"
                        " WHERE i < 200) SELECT i FROM n)"
                    )
                async with box.store.transaction() as conn:
                    await conn.exec_driver_sql("DELETE FROM filler")
                m = await scrape(server.url)
                assert 0.3 < sample(m, "relaybox_db_free_page_ratio") < 1
                assert sample(m, "relaybox_db_wal_bytes") > 200 * 4096
                assert not any(name.startswith("relaybox_db_oldest") for name, _ in m)
    finally:
        await box.close()


def overview_numbers(html: str) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for name, value in re.findall(r'data-metric="(\w+)"[^>]*>([^<]*)<', html):
        out[name] = float(value) if value.strip().isdigit() else None
    age = re.search(r'data-metric="oldest_pending_age_seconds"\s+data-value="([^"]*)"', html)
    assert age is not None
    out["oldest_pending_age_seconds"] = float(age.group(1)) if age.group(1) else None
    return out


async def test_metrics_stats_json_and_overview_agree(database_url: str) -> None:
    box = make_box(database_url)
    try:
        async with Served(box.asgi(roles=("receiver", "admin"))) as server:
            await scenario(box, server.url)
            m = await scrape(server.url)
            # The cookie jar must accept cookies from an IP address (127.0.0.1).
            async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:
                async with session.post(
                    f"{server.url}/admin/login", data={"token": TOKEN, "next": "/admin/"}
                ) as response:
                    assert response.status == 200  # followed the redirect to the overview
                    html = await response.text()
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "relaybox.cli", "stats", "--json",
                "--database-url", database_url,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            out, err = await process.communicate()
    finally:
        await box.close()
    assert process.returncode == 0, err.decode()
    cli = json.loads(out)
    page = overview_numbers(html)
    inbox = {"queue": "inbox", "source": "std"}
    from_metrics = {
        "pending": sample(m, "relaybox_queue_pending", **inbox),
        "retrying": sample(m, "relaybox_queue_retrying", **inbox),
        "done": sample(m, "relaybox_queue_rows", status="done", **inbox),
        "dead": sum(
            sample(m, "relaybox_dead_letters", reason=r, **inbox)
            for r in ("invalid", "exhausted", "conflict", "unhandled")
        ),
        "dead_invalid": sample(m, "relaybox_dead_letters", reason="invalid", **inbox),
        "dead_unhandled": sample(m, "relaybox_dead_letters", reason="unhandled", **inbox),
        "quarantined": sample(m, "relaybox_quarantined", source="std"),
    }
    assert from_metrics == {
        "pending": 2,
        "retrying": 1,
        "done": 2,
        "dead": 2,
        "dead_invalid": 1,
        "dead_unhandled": 1,
        "quarantined": 1,
    }
    for key, value in from_metrics.items():
        cli_value = cli["dead_by_reason"]["unhandled"] if key == "dead_unhandled" else cli[key]
        assert cli_value == value, key
        assert page[key] == value, key
    ages = [
        sample(m, "relaybox_queue_oldest_pending_age_seconds", **inbox),
        cli["oldest_pending_age_seconds"],
        page["oldest_pending_age_seconds"],
    ]
    assert max(ages) - min(ages) < 10  # read at slightly different moments
