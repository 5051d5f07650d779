"""Reconciliation (no authoritative version → ask the provider, coordinated
per resource) on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection
from structlog.testing import capture_logs

from relaybox import Context, FrozenClock, Relaybox
from relaybox.inbound.projections import current, integer_order, write
from relaybox.inbound.reconcile import Reconciler, register, request
from relaybox.store import NewDelivery
from tests.integration.test_replay import invoke


async def test_the_newer_read_wins_when_the_older_fetch_returns_last(box: Relaybox) -> None:
    """Two reconciliations of one resource overlap; the one that started first gets
    the provider's older answer and returns last: the newer state is kept."""
    provider = {"sub_1": "active"}
    old_read_started, release_old_read = asyncio.Event(), asyncio.Event()
    calls = 0

    async def fetch(resource_id: str) -> dict[str, str]:
        nonlocal calls
        calls += 1
        answer = {"status": provider[resource_id]}  # read now ...
        if calls == 2:
            old_read_started.set()
            await release_old_read.wait()  # ... returned late
        return answer

    applied: list[Any] = []

    async def apply(conn: AsyncConnection, resource_id: str, state: Any) -> None:
        applied.append(state)

    reconciler = Reconciler(box, "billing", fetch, apply=apply)
    assert (await reconciler.reconcile("sub_1")).outcome == "repaired"  # absent → stored
    older = asyncio.create_task(reconciler.reconcile("sub_1"))
    await old_read_started.wait()
    provider["sub_1"] = "canceled"  # the provider changes after the first read
    newer = await reconciler.reconcile("sub_1")
    release_old_read.set()
    late = await older
    assert (newer.outcome, newer.ticket) == ("repaired", 3)
    assert (late.outcome, late.ticket) == ("superseded", 2)
    stored = await current(box, "billing:sub_1")
    assert stored is not None
    assert (stored.state, stored.version, stored.origin) == (
        {"status": "canceled"},
        "3",
        "reconcile",
    )
    assert applied == [{"status": "active"}, {"status": "canceled"}]
    metrics = box.metrics.render().decode()
    assert 'relaybox_reconcile_divergences_total{source="billing"} 2.0' in metrics
    assert 'relaybox_reconcile_outcomes_total{outcome="superseded",source="billing"} 1.0' in metrics


async def test_divergences_are_counted_logged_and_repaired(box: Relaybox) -> None:
    async with box.store.transaction() as conn:
        await conn.execute(text("CREATE TABLE plans (id TEXT PRIMARY KEY, plan TEXT)"))

    async def apply(conn: AsyncConnection, resource_id: str, state: Any) -> None:
        # The application's own table, repaired in the transaction of the write.
        await conn.execute(
            text(
                "INSERT INTO plans VALUES (:id, :plan)"
                " ON CONFLICT (id) DO UPDATE SET plan = excluded.plan"
            ),
            {"id": resource_id, "plan": state["plan"]},
        )

    provider = {"acct_1": {"plan": "pro"}, "acct_2": {"plan": "free"}}

    async def fetch(resource_id: str) -> Any:
        if resource_id == "acct_broken":
            raise ConnectionError("provider timeout")
        return provider[resource_id]

    reconciler = Reconciler(box, "crm", fetch, apply=apply)
    first = await reconciler.run(["acct_1", "acct_2"])
    assert first.counts() == {"in_sync": 0, "repaired": 2, "superseded": 0, "failed": 0}
    again = await reconciler.run(every=True)  # every resource reconciled before
    assert again.counts()["in_sync"] == 2
    provider["acct_2"] = {"plan": "pro"}  # a change whose webhook we never got
    with capture_logs() as logs:
        report = await reconciler.run(every=True)
        broken = await reconciler.reconcile("acct_broken")
    assert report.as_dict()["divergences"] == ["crm:acct_2"]
    [divergence] = [e for e in logs if e["event"] == "reconcile_divergence"]
    assert (divergence["resource_key"], divergence["log_level"]) == ("crm:acct_2", "warning")
    assert broken.outcome == "failed" and "provider timeout" in (broken.error or "")
    plans = await box.store.fetch_all("SELECT id, plan FROM plans ORDER BY id")
    assert plans == [{"id": "acct_1", "plan": "pro"}, {"id": "acct_2", "plan": "pro"}]
    counted = await box.store.fetch_all(
        "SELECT resource_id, divergences FROM relaybox_reconcile ORDER BY resource_id"
    )
    assert [(c["resource_id"], c["divergences"]) for c in counted] == [
        ("acct_1", 1),
        ("acct_2", 2),
        ("acct_broken", 0),
    ]


async def test_a_handler_requests_a_reconciliation(box: Relaybox, clock: FrozenClock) -> None:
    """No remote call in the handler's transaction: it records a request, served after.
    A key projected with provider versions is refused."""
    provider = {"sub_9": {"status": "past_due"}}

    async def fetch(resource_id: str) -> Any:
        return provider[resource_id]

    reconciler = Reconciler(box, "billing", fetch)

    @box.handler("billing", "subscription.updated")
    async def on_update(ctx: Context) -> None:
        await request(ctx, ctx.payload["id"])

    raw = json.dumps({"id": "sub_9"}).encode()
    await box.store.inbox.accept(
        [
            NewDelivery(
                source="billing",
                account="a",
                event_id="evt_1",
                event_type="subscription.updated",
                tenant=None,
                fingerprint=b"x",
                payload=raw,
                headers=None,
                version=None,
                received_at=clock.now(),
            )
        ]
    )
    await box.worker().run_once()
    assert await reconciler.known(requested=True) == ["sub_9"]
    served = await reconciler.run(requested=True)
    assert [r.outcome for r in served.results] == ["repaired"]
    assert await reconciler.known(requested=True) == []
    assert (await reconciler.run(requested=True)).results == []

    # A key kept by provider versions is not reconciled (the two orders do not mix).
    async with box.store.transaction() as conn:
        await write(
            box,
            conn,
            resource_key="billing:sub_7",
            origin="event",
            version="4",
            version_key=integer_order("4"),
            state_json='"active"',
            source="billing",
            inbox_id=None,
        )
    provider["sub_7"] = {"status": "canceled"}
    refused = await reconciler.reconcile("sub_7")
    assert refused.outcome == "failed" and "provider versions" in (refused.error or "")
    stored = await current(box, "billing:sub_7")
    assert stored is not None and (stored.version, stored.state) == ("4", "active")


# -- the command ------------------------------------------------------------------


def cli_box() -> Relaybox:
    """``--app tests.integration.test_reconcile:cli_box``: a Relaybox whose "crm" reconciler reads
    the provider's state from the JSON file named by ``RECONCILE_PROVIDER``."""
    box = Relaybox()

    def provider() -> dict[str, Any]:
        return dict(json.loads(Path(os.environ["RECONCILE_PROVIDER"]).read_text()))

    async def fetch(resource_id: str) -> Any:
        state = provider()[resource_id]
        if state == "boom":
            raise RuntimeError("provider answered 500")
        return state

    async def every() -> list[str]:
        return sorted(provider())

    register(box, "crm", fetch, list_resources=every)
    return box


async def test_reconcile_command(database_url: str, tmp_path: Path) -> None:
    state_file = tmp_path / "provider.json"
    env = {"RECONCILE_PROVIDER": str(state_file)}
    base = [
        "reconcile",
        "--app",
        "tests.integration.test_reconcile:cli_box",
        "--database-url",
        database_url,
    ]
    state_file.write_text(json.dumps({"a1": {"plan": "pro"}, "a2": {"plan": "free"}}))
    code, out, err = await invoke(*base, "--source", "crm", "--all", "--json", env=env)
    assert code == 0, err
    assert json.loads(out)["divergences"] == ["crm:a1", "crm:a2"]
    code, out, err = await invoke(*base, "--source", "crm", "--resource", "a2", "--json", env=env)
    assert (code, json.loads(out)["in_sync"]) == (0, 1)
    state_file.write_text(json.dumps({"a1": {"plan": "pro"}, "a2": "boom"}))
    code, out, err = await invoke(*base, "--source", "crm", "--all", env=env)
    assert code == 1
    assert "provider answered 500" in err and "in_sync" in out
    code, out, err = await invoke(*base, "--source", "nope", "--all", env=env)
    assert code == 2 and "no reconciler" in err
