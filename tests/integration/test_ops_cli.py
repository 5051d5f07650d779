"""The operator commands (``inbox``, ``dead``, ``quarantine``, ``stats``, ``purge``,
``doctor``) against real databases on both backends: rich tables for people, ``--json``
for scripts, exit codes that mean something."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import structlog
from click.testing import CliRunner, Result

from relaybox import FrozenClock, Relaybox
from relaybox.cli import main
from relaybox.config import Settings
from tests.conftest import SECRETS_KEY, free_port
from tests.integration.test_admin_api import delivery, seed

Invoke = Callable[..., Any]


def _logs_to_real_stderr() -> None:
    structlog.reset_defaults()
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.__stderr__))


def cli_runner() -> Iterator[Invoke]:
    """Run ``relaybox …`` in this process, in a thread (the command runs its own
    event loop). The command configures logging as it does in production (to stderr,
    here the runner's), so ``--json`` output on stdout stays parseable; then the
    test's own logs go to the real stderr again (the runner's is closed).

    (``configure_logging`` is not patched away: a command module imported for the
    first time under such a patch kept the no-op for the rest of the worker's tests,
    which then logged with structlog's defaults, to stdout, into their JSON.)"""
    _logs_to_real_stderr()
    runner = CliRunner()

    async def invoke(*args: str, code: int = 0) -> Result:
        try:
            result = await asyncio.to_thread(
                runner.invoke, main, list(args), catch_exceptions=False
            )
        finally:
            _logs_to_real_stderr()
        assert result.exit_code == code, (args, result.stdout, result.stderr)
        return result

    yield invoke
    structlog.reset_defaults()


@pytest.fixture
def cli() -> Iterator[Invoke]:
    yield from cli_runner()


@pytest.fixture
async def seeded(database_url: str, clock: FrozenClock) -> Any:
    box = Relaybox(settings=Settings(database_url=database_url), clock=clock)
    ids = await seed(box, clock)
    await box.close()
    return database_url, ids


async def test_inbox_list_and_show(cli: Invoke, seeded: Any) -> None:
    url, ids = seeded
    out = json.loads((await cli("inbox", "list", "--database-url", url, "--json")).stdout)
    assert [e["event_id"] for e in out["items"]] == sorted(ids, key=lambda n: -ids[n])
    page = json.loads(
        (await cli("inbox", "list", "--status", "dead", "--limit", "1", "--json",
                   "--database-url", url)).stdout
    )  # fmt: skip
    newest_dead = max(("lost-1", "bad-1"), key=lambda n: ids[n])
    assert [e["event_id"] for e in page["items"]] == [newest_dead] and page["next_cursor"]
    table = (await cli("inbox", "list", "--source", "s", "--database-url", url)).stdout
    assert "ok-1" in table and "lost-1" not in table
    shown = json.loads(
        (await cli("inbox", "show", str(ids["ok-1"]), "--json", "--database-url", url)).stdout
    )
    assert [k["business_key"] for k in shown["business_keys"]] == ["s:1:grant"]
    human = (await cli("inbox", "show", str(ids["bad-1"]), "--database-url", url)).stdout
    assert "invoice has no customer" in human
    missing = await cli("inbox", "show", "999999", "--json", "--database-url", url, code=1)
    assert json.loads(missing.stdout) == {"error": "not_found", "message": "no inbox event 999999"}
    await cli("inbox", "list", "--status", "nope", "--database-url", url, code=2)


async def test_inbox_show_prints_a_payload_with_a_lone_surrogate_escaped(
    cli: Invoke, database_url: str, clock: FrozenClock
) -> None:
    """A provider's JSON may escape a lone surrogate anywhere in its payload (kept as
    sent): ``inbox show`` prints it escaped, where it used to end in a traceback."""
    box = Relaybox(settings=Settings(database_url=database_url), clock=clock)
    raw = b'{"id": "evt_s", "account": "acct_\\ud800", "note": "caf\\u00e9"}'
    row = delivery(clock, "evt_s", "ok", None, payload=raw, fingerprint=b"s" * 32)
    await box.store.inbox.accept([row])
    [found] = await box.store.fetch_all("SELECT id FROM relaybox_inbox")
    await box.close()
    human = (await cli("inbox", "show", str(found["id"]), "--database-url", database_url)).stdout
    assert '"acct_\\ud800"' in human and '"caf\\u00e9"' in human


async def test_dead_letters_list_retry_and_discard(cli: Invoke, seeded: Any) -> None:
    url, ids = seeded
    dead = json.loads((await cli("dead", "list", "--json", "--database-url", url)).stdout)
    assert {e["event_id"] for e in dead["items"]} == {"bad-1", "lost-1"}
    await cli("dead", "retry", str(ids["bad-1"]), "--database-url", url, code=2)  # no --reason
    await cli("dead", "retry", "--reason", "x", "--database-url", url, code=2)  # nothing chosen
    retried = json.loads(
        (await cli("dead", "retry", str(ids["bad-1"]), "--reason", "fixed", "--actor", "bob",
                   "--json", "--database-url", url)).stdout
    )  # fmt: skip
    assert retried["replayed"] == [ids["bad-1"]]
    again = await cli("dead", "retry", str(ids["bad-1"]), "--reason", "fixed",
                      "--database-url", url, code=1)  # fmt: skip
    assert "is not a dead letter (it is pending)" in again.stderr
    discarded = await cli("dead", "discard", str(ids["lost-1"]), "--reason", "sandbox noise",
                          "--json", "--database-url", url)  # fmt: skip
    assert json.loads(discarded.stdout)["id"] == ids["lost-1"]
    left = json.loads((await cli("dead", "list", "--json", "--database-url", url)).stdout)
    assert left["items"] == []
    bulk = json.loads(
        (await cli("dead", "retry", "--all", "--source", "s", "--reason", "bulk", "--json",
                   "--database-url", url)).stdout
    )  # fmt: skip
    assert bulk["matched"] == 0


async def test_quarantine_list_show_resolve(cli: Invoke, seeded: Any) -> None:
    url, ids = seeded
    listed = json.loads((await cli("quarantine", "list", "--json", "--database-url", url)).stdout)
    [entry] = listed["items"]
    assert entry["inbox_id"] == ids["ok-1"]
    shown = await cli("quarantine", "show", str(entry["id"]), "--database-url", url)
    assert "$.items[1]" in shown.stdout and "$.extra" in shown.stdout
    await cli("quarantine", "resolve", str(entry["id"]), "--resolution", "kept_original",
              "--reason", "benign resend", "--database-url", url)  # fmt: skip
    again = await cli("quarantine", "resolve", str(entry["id"]), "--resolution", "kept_original",
                      "--reason", "twice", "--json", "--database-url", url, code=1)  # fmt: skip
    assert json.loads(again.stdout)["error"] == "resolved"
    resolved = json.loads(
        (await cli("quarantine", "list", "--state", "resolved", "--json",
                   "--database-url", url)).stdout
    )  # fmt: skip
    assert resolved["items"][0]["resolution_reason"] == "benign resend"


async def test_stats_table_and_json(cli: Invoke, seeded: Any) -> None:
    url, _ = seeded
    data = json.loads((await cli("stats", "--json", "--database-url", url)).stdout)
    assert (data["pending"], data["done"], data["dead"], data["quarantined"]) == (1, 1, 2, 1)
    assert data["dead_by_reason"] == {"invalid": 1, "exhausted": 0, "conflict": 0, "unhandled": 1}
    assert data["outbox"]["pending"] == 1
    table = (await cli("stats", "--database-url", url)).stdout
    assert "quarantined" in table and "unhandled" in table


async def test_doctor_passes_on_a_migrated_database(
    cli: Invoke, database_url: str, tmp_path: Any
) -> None:
    config = tmp_path / "relaybox.toml"  # PostgreSQL needs a key for endpoint secrets
    config.write_text(f'[outbound]\nsecrets_key = "{SECRETS_KEY}"\n')
    found = await cli("doctor", "--json", "--config", str(config), "--database-url", database_url)
    out = json.loads(found.stdout)
    checks = {c["check"]: c["status"] for c in out["checks"]}
    assert out["ok"] and checks["database"] == checks["migrations"] == checks["clock"] == "ok"


async def test_doctor_names_long_transactions_and_dead_rows(
    cli: Invoke, database_url: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: a session idle in a transaction that read relaybox_inbox is named
    past --max-transaction-age, a table whose deleted rows wait for vacuum past
    --max-dead-ratio; SQLite: a file whose deletes freed most of its pages. Warnings:
    the exit code stays 0."""
    from relaybox.cli import doctor as doctor_module

    monkeypatch.setattr(doctor_module, "MIN_DEAD_ROWS", 1)
    config = tmp_path / "relaybox.toml"
    config.write_text(f'[outbound]\nsecrets_key = "{SECRETS_KEY}"\n')
    box = Relaybox(settings=Settings(database_url=database_url))
    await box.store.inbox.accept(
        [delivery(FrozenClock(1.8e9), f"e{i}", "x", {}) for i in range(50)]
    )
    args = ("doctor", "--json", "--config", str(config), "--database-url", database_url)
    try:
        if database_url.startswith("postgresql"):
            import asyncpg

            other = await asyncpg.connect(database_url)
            try:
                await other.execute("BEGIN")
                await other.fetch("SELECT count(*) FROM relaybox_inbox")
                await box.store.fetch_all("DELETE FROM relaybox_inbox RETURNING id")
                await box.store.fetch_all("SELECT pg_stat_force_next_flush()")
                await asyncio.sleep(1.2)
                out = json.loads((await cli(*args, "--max-transaction-age", "1")).stdout)
                pid = (await other.fetchrow("SELECT pg_backend_pid() AS pid"))["pid"]
            finally:
                await other.close()
            checks = {c["check"]: c for c in out["checks"]}
            assert checks["transactions"]["status"] == "warn"
            assert f"pid {pid} " in checks["transactions"]["detail"]
            assert "idle in transaction" in checks["transactions"]["detail"]
            assert checks["dead rows"]["status"] == "warn"
            assert "relaybox_inbox " in checks["dead rows"]["detail"]
            out = json.loads((await cli(*args)).stdout)  # the session is gone; default limits
            checks = {c["check"]: c for c in out["checks"]}
            assert checks["transactions"]["status"] == "ok"
        else:
            async with box.store.transaction() as conn:
                await conn.exec_driver_sql("CREATE TABLE filler (b BLOB)")
                await conn.exec_driver_sql(
                    "INSERT INTO filler SELECT zeroblob(4096) FROM (WITH RECURSIVE n(i) AS"
                    " (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 200) SELECT i FROM n)"
                )
            async with box.store.transaction() as conn:
                await conn.exec_driver_sql("DELETE FROM filler")
            out = json.loads((await cli(*args)).stdout)
            checks = {c["check"]: c for c in out["checks"]}
            assert checks["database health"]["status"] == "warn"
            assert "run VACUUM" in checks["database health"]["detail"]
            assert "transactions" not in checks
        assert out["ok"]
    finally:
        await box.close()


async def test_doctor_names_pending_migrations(cli: Invoke, tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path}/empty.db"
    result = await cli("doctor", "--database-url", url, code=4)  # tables missing: its own exit code
    assert "run `relaybox migrate`" in result.stderr


async def test_a_configuration_error_exits_2(cli: Invoke, tmp_path: Any) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('admin_token = "short"\n[retention]\npayload_max_age = -1\n')
    result = await cli("stats", "--config", str(config), code=2)
    assert "admin_token" in result.stderr and "retention.payload_max_age" in result.stderr
    doctor = await cli("doctor", "--config", str(config), "--json", code=2)
    assert json.loads(doctor.stdout)["checks"][0]["status"] == "fail"


@pytest.mark.parametrize(
    ("url", "named"),
    [
        (f"postgresql://relaybox@127.0.0.1:{free_port()}/relaybox", "ConnectionRefusedError"),
        ("sqlite:////proc/version/relaybox.db", "relaybox.db"),
    ],
    ids=["postgres", "sqlite"],
)
async def test_doctor_with_the_database_down_names_it_and_exits_3(url: str, named: str) -> None:
    """The real command in its own process: the message and the exit code a script sees."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "relaybox.cli", "doctor", "--database-url", url,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await process.communicate()
    assert process.returncode == 3, (out, err)
    problem = err.decode()
    assert "problem: database: database unreachable" in problem
    assert named in problem or named in out.decode()
