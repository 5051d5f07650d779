"""``relaybox replay`` (a real subprocess) on SQLite and PostgreSQL: by status, by ids,
by source and time range; dry run; purged payloads; every replay recorded; a replayed
event goes through the same handler and business keys, so it never grants twice."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import structlog
from click.testing import CliRunner
from sqlalchemy import text

from relaybox import Context, FrozenClock, PermanentError, Relaybox
from relaybox.cli import main
from relaybox.store import NewDelivery

ROOT = Path(__file__).resolve().parents[2]


async def run_cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run ``relaybox ARGS`` as a separate process from the project root."""
    script = Path(sys.executable).with_name("relaybox")
    proc = await asyncio.create_subprocess_exec(
        str(script),
        *args,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run the same command in this process (a thread: the command runs its own event
    loop), which is much faster than a process; one test per command also runs
    :func:`run_cli` to prove the installed entry point."""
    result = await asyncio.to_thread(CliRunner().invoke, main, list(args), env=env)
    structlog.reset_defaults()  # the command pointed logging at the runner's stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def settings_file(tmp_path: Path, database_url: str) -> str:
    path = tmp_path / "relaybox.toml"
    path.write_text(f'database_url = {json.dumps(database_url)}\nlog_level = "warning"\n')
    return str(path)


def paid(event_id: str, invoice: str, at: float) -> NewDelivery:
    raw = json.dumps({"id": event_id, "type": "invoice.paid", "data": {"id": invoice}}).encode()
    return NewDelivery(
        source="billing",
        account="acct_1",
        event_id=event_id,
        event_type="invoice.paid",
        tenant="ws_1",
        fingerprint=hashlib.sha256(raw).digest(),
        payload=raw,
        headers=None,
        version=None,
        received_at=at,
    )


async def statuses(box: Relaybox) -> dict[str, str]:
    rows = await box.store.fetch_all("SELECT event_id, status FROM relaybox_inbox")
    return {r["event_id"]: r["status"] for r in rows}


async def test_replay_cli(box: Relaybox, clock: FrozenClock, tmp_path: Path) -> None:
    cfg = settings_file(tmp_path, box.settings.database_url)
    async with box.store.transaction() as conn:
        await conn.execute(text("CREATE TABLE grants (invoice TEXT PRIMARY KEY)"))
        await conn.execute(text("CREATE TABLE bugs (invoice TEXT PRIMARY KEY)"))
        await conn.execute(text("INSERT INTO bugs VALUES ('inv_3')"))
    calls: list[str] = []

    @box.handler("billing", "invoice.paid")
    async def grant(ctx: Context) -> None:
        invoice = ctx.payload["data"]["id"]
        calls.append(ctx.event.event_id)
        bug = (
            await ctx.conn.execute(text("SELECT 1 FROM bugs WHERE invoice = :i"), {"i": invoice})
        ).first()
        if bug:
            raise PermanentError(f"cannot read {invoice}")
        if await ctx.once(f"billing:{ctx.event.account}:{invoice}:initial-credit-grant"):
            await ctx.conn.execute(text("INSERT INTO grants VALUES (:i)"), {"i": invoice})

    t0 = clock.now()
    outcomes = await box.store.inbox.accept(
        [
            paid("e1", "inv_1", t0),
            paid("e2", "inv_2", t0),
            paid("e3", "inv_3", t0),
            paid("e4", "inv_1", t0),  # another event for invoice 1: no second grant
        ]
    )
    ids = {f"e{i + 1}": o.inbox_id for i, o in enumerate(outcomes)}
    worker = box.worker()
    await worker.run_once()
    assert await statuses(box) == {"e1": "done", "e2": "done", "e3": "dead", "e4": "done"}
    # e3 failing rolled its group back (PostgreSQL runs the claim's events in one
    # transaction): the group ran again with a savepoint each and e3's outcome kept, so
    # the others may have run twice, e3 once.
    assert set(calls) == {"e1", "e2", "e3", "e4"} and calls.count("e3") == 1
    calls.clear()

    # The bug is fixed: replay the dead letters.
    async with box.store.transaction() as conn:
        await conn.execute(text("DELETE FROM bugs"))
    # The installed entry point once (a process costs ~1 s); in-process after that.
    cli = run_cli if box.store.backend == "sqlite" else invoke
    code, out, err = await cli(
        "replay", "--status", "dead", "--actor", "alice", "--reason", "fixed the reader",
        "--json", "--config", cfg,
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["replayed"] == [ids["e3"]]
    await worker.run_once()
    assert (await statuses(box))["e3"] == "done"

    # A dry run over the whole range changes nothing.
    window = ["--source", "billing", "--since", str(t0 - 1), "--until", str(t0 + 1)]
    code, out, err = await invoke(
        "replay", *window, "--dry-run", "--reason", "look", "--json", "--config", cfg
    )
    assert code == 0, err
    assert json.loads(out)["would_replay"] == sorted(ids.values())
    assert set((await statuses(box)).values()) == {"done"}

    # By ids, then the whole range (several transactions, a progress bar): the same
    # handler runs again and its business keys keep one grant per invoice.
    code, out, err = await invoke(
        "replay", str(ids["e1"]), str(ids["e4"]), "--reason", "audit", "--json", "--config", cfg
    )
    assert code == 0, err
    assert json.loads(out)["replayed"] == [ids["e1"], ids["e4"]]
    await worker.run_once()
    code, out, err = await invoke(
        "replay", *window, "--batch", "2", "--reason", "whole range", "--config", cfg
    )
    assert code == 0, err
    assert "replayed 4 row(s)" in out
    await worker.run_once()
    assert set((await statuses(box)).values()) == {"done"}
    grants = await box.store.fetch_all("SELECT invoice FROM grants ORDER BY invoice")
    assert [g["invoice"] for g in grants] == ["inv_1", "inv_2", "inv_3"]
    dead, by_id, whole = ["e3"], ["e1", "e4"], list(ids)
    assert sorted(calls) == sorted(dead + by_id + whole)
    recorded = await box.store.fetch_all(
        "SELECT inbox_id, actor, reason, previous_status FROM relaybox_replays ORDER BY id"
    )
    assert [(r["reason"], r["previous_status"]) for r in recorded] == [
        ("fixed the reader", "dead"),
        ("audit", "done"),
        ("audit", "done"),
        *[("whole range", "done")] * 4,
    ]
    assert recorded[0]["actor"] == "alice" and recorded[1]["actor"]

    # A purged payload cannot be replayed; an unknown id is reported. Both fail.
    async with box.store.transaction() as conn:
        await conn.execute(
            text("UPDATE relaybox_inbox SET payload = NULL WHERE id = :i"), {"i": ids["e2"]}
        )
    code, out, err = await invoke(
        "replay", str(ids["e2"]), "999", "--reason", "again", "--json", "--config", cfg
    )
    assert code == 1, err
    result: dict[str, Any] = json.loads(out)
    assert (result["purged"], result["not_found_or_pending"], result["replayed"]) == (
        [ids["e2"]],
        [999],
        [],
    )


async def test_replay_cli_refuses_an_empty_selection(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    code, _, err = await invoke("replay", "--reason", "x", "--database-url", url)
    assert code == 2 and "select rows" in err
    code, _, err = await invoke("replay", "1", "--database-url", url)
    assert code == 2 and "--reason" in err


async def test_a_discarded_dead_letter_stays_out_of_a_replay_unless_asked(
    box: Relaybox, clock: FrozenClock, tmp_path: Path
) -> None:
    """``dead discard`` is "out of the queue for good": a replay by source and time
    (CLI and admin use case alike) leaves it out and says so; --include-discarded, or
    naming its id, replays it."""
    from relaybox.ops.inbound import dead_discard, replay_selection

    cfg = settings_file(tmp_path, box.settings.database_url)

    @box.handler("billing", "invoice.paid")
    async def refuse(ctx: Context) -> None:
        raise PermanentError("not ours")

    t0 = clock.now()
    [kept, thrown] = await box.store.inbox.accept([paid("d1", "i1", t0), paid("d2", "i2", t0)])
    await box.worker().run_once()
    assert await statuses(box) == {"d1": "dead", "d2": "dead"}
    await dead_discard(box, thrown.inbox_id, actor="ops", reason="sandbox event")

    window = ["--source", "billing", "--since", str(t0 - 1), "--until", str(t0 + 1)]
    code, out, err = await invoke(
        "replay", *window, "--reason", "outage", "--json", "--config", cfg
    )
    assert code == 0, err
    answer = json.loads(out)
    assert (answer["replayed"], answer["discarded"]) == ([kept.inbox_id], [thrown.inbox_id])
    assert await statuses(box) == {"d1": "pending", "d2": "dead"}
    [row] = await box.store.fetch_all(
        "SELECT discarded_at FROM relaybox_inbox WHERE event_id = 'd2'"
    )
    assert row["discarded_at"] is not None  # still discarded, not cleared

    result = await replay_selection(
        box, source="billing", since=None, until=None, statuses=["dead"], limit=10,
        actor="ops", reason="again",
    )  # fmt: skip
    assert (result.replayed, result.discarded) == ([], [thrown.inbox_id])
    assert "left out" in result.message

    code, out, err = await invoke(
        "replay", *window, "--status", "dead", "--include-discarded", "--reason", "yes, it",
        "--json", "--config", cfg,
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["replayed"] == [thrown.inbox_id]
    assert await statuses(box) == {"d1": "pending", "d2": "pending"}
