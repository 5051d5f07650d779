"""The ``relaybox`` command: in-process with click's CliRunner, and as a user runs it
(real processes) for the README quick start."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
from click.testing import CliRunner, Result

from relaybox.cli import main
from relaybox.store.backend import load_migrations
from tests.conftest import _dsn, _with_db, admin_url, drop_pg_database, free_port

UNREACHABLE = "postgresql://postgres@127.0.0.1:1/x"


def relaybox_command() -> list[str]:
    script = Path(sys.executable).with_name("relaybox")
    if script.exists():
        return [str(script)]
    found = shutil.which("relaybox")
    assert found, "the relaybox console script is not installed"
    return [found]


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAYBOX_")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    for key in list(os.environ):
        if key.startswith("RELAYBOX_") and not key.startswith("RELAYBOX_TEST_"):
            monkeypatch.delenv(key)
    return CliRunner()


def invoke(runner: CliRunner, *args: str) -> Result:
    return runner.invoke(main, list(args), catch_exceptions=False, prog_name="relaybox")


def output(result: Result) -> str:
    """stdout and stderr together (click ≥ 8.2 keeps them apart, older mixes them)."""
    try:
        return result.stdout + result.stderr
    except ValueError:
        return result.output


# -- migrate / stats ---------------------------------------------------------------------


def test_migrate_applies_then_says_up_to_date(runner: CliRunner, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db' / 'q.db'}"
    first = invoke(runner, "migrate", "--database-url", url)
    assert first.exit_code == 0, output(first)
    names = [f"{v:04d}_{n}" for v, n, _ in load_migrations("sqlite")]
    assert first.stdout.strip() == "applied: " + ", ".join(names)
    assert "0001_initial" in first.stdout
    second = invoke(runner, "migrate", "--database-url", url)
    assert second.exit_code == 0, output(second)
    assert second.stdout.strip() == "schema is up to date"


def test_migrate_reads_the_database_url_from_the_environment(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAYBOX_DATABASE_URL", f"sqlite:///{tmp_path / 'env.db'}")
    result = invoke(runner, "migrate")
    assert result.exit_code == 0, output(result)
    assert "0001_initial" in result.stdout
    assert (tmp_path / "env.db").exists()


@pytest.fixture
async def fresh_pg_url() -> AsyncIterator[str]:
    name = f"relaybox_cli_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(_dsn(admin_url()))
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    url = _with_db(admin_url(), name)
    yield url
    await drop_pg_database(url)


def test_migrate_postgres(runner: CliRunner, fresh_pg_url: str) -> None:
    first = invoke(runner, "migrate", "--database-url", fresh_pg_url)
    assert first.exit_code == 0, output(first)
    assert first.stdout.startswith("applied: 0001_initial")
    second = invoke(runner, "migrate", "--database-url", fresh_pg_url)
    assert (second.exit_code, second.stdout.strip()) == (0, "schema is up to date")


def leaves(data: object, path: str = "") -> dict[str, object]:
    """Flatten nested JSON objects to {"a.b": value}."""
    if isinstance(data, dict):
        out: dict[str, object] = {}
        for key, value in data.items():
            out.update(leaves(value, f"{path}.{key}" if path else key))
        return out
    return {path: data}


def test_stats_json_on_an_empty_database(runner: CliRunner, database_url: str) -> None:
    result = invoke(runner, "stats", "--json", "--database-url", database_url)
    assert result.exit_code == 0, output(result)
    data = json.loads(result.stdout)
    for key in ("pending", "done", "ignored", "dead", "dead_invalid", "dead_exhausted"):
        assert data[key] == 0, key
    assert data["quarantined"] == 0
    assert data["oldest_pending_age_seconds"] is None
    # Whatever else it reports: every count is zero and every age unknown.
    for key, value in leaves(data).items():
        assert value == (None if key.endswith("age_seconds") else 0), (key, value)
    result = invoke(runner, "stats", "--database-url", database_url)
    assert result.exit_code == 0, output(result)
    for metric in ("pending", "quarantined"):
        assert metric in result.stdout


def test_stats_before_migrate_says_what_to_do(runner: CliRunner, tmp_path: Path) -> None:
    result = invoke(runner, "stats", "--json", "--database-url", f"sqlite:///{tmp_path / 'n.db'}")
    assert result.exit_code == 3
    assert "relaybox migrate" in output(result)


@pytest.mark.parametrize("command", ["migrate", "stats"])
def test_unreachable_database_exits_3_naming_it(runner: CliRunner, command: str) -> None:
    started = time.monotonic()
    result = invoke(runner, command, "--database-url", UNREACHABLE)
    assert result.exit_code == 3, output(result)
    text = output(result)
    assert "database unreachable" in text
    assert "postgresql://postgres@127.0.0.1:1/x" in text
    assert "Traceback" not in text
    assert time.monotonic() - started < 10


def test_unreachable_database_message_hides_the_password(runner: CliRunner) -> None:
    result = invoke(runner, "stats", "--database-url", "postgresql://app:s3cr3t@127.0.0.1:1/x")
    assert result.exit_code == 3
    text = output(result)
    assert "127.0.0.1:1/x" in text
    assert "s3cr3t" not in text


def test_unsupported_database_url_is_a_usage_error(runner: CliRunner) -> None:
    result = invoke(runner, "migrate", "--database-url", "mysql://u@h/db")
    assert result.exit_code == 2
    assert "unsupported database URL scheme 'mysql'" in output(result)


def test_bad_config_file_is_a_usage_error(runner: CliRunner, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[worker]\nconcurrency = 0\n")
    result = invoke(runner, "migrate", "--config", str(bad))
    assert result.exit_code == 2
    assert "worker.concurrency" in output(result)
    missing = invoke(runner, "stats", "--config", str(tmp_path / "missing.toml"))
    assert missing.exit_code == 2
    assert "does not exist" in output(missing)


def test_config_file_sources_and_database(runner: CliRunner, tmp_path: Path) -> None:
    config = tmp_path / "relaybox.toml"
    config.write_text(
        f'database_url = "sqlite:///{tmp_path / "cfg.db"}"\n'
        '[sources.gh]\nprovider = "github"\nsecrets = ["s"]\n'
    )
    result = invoke(runner, "migrate", "--config", str(config))
    assert result.exit_code == 0, output(result)
    assert (tmp_path / "cfg.db").exists()
    # send-test knows the configured source (and says which exist when it is not one).
    unknown = invoke(runner, "send-test", "nope", "--config", str(config))
    assert unknown.exit_code == 2
    assert "'nope'" in output(unknown) and "gh" in output(unknown)


def test_send_test_to_nothing_listening_fails(runner: CliRunner) -> None:
    port = free_port()
    result = invoke(runner, "send-test", "stripe", "--url", f"http://127.0.0.1:{port}")
    assert result.exit_code == 1
    assert "could not reach" in output(result)


def test_serve_refuses_unknown_roles(runner: CliRunner, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    result = invoke(runner, "serve", "--roles", "receiver,juggler", "--database-url", url)
    assert result.exit_code == 2
    assert "juggler" in output(result)


def test_serve_says_a_port_is_taken_before_claiming_to_serve_on_it(
    runner: CliRunner, tmp_path: Path
) -> None:
    """The banner ("… on http://127.0.0.1:PORT") comes once the address is bound: a
    taken port is one error line and exit 3, nothing claiming to serve before it."""
    import socket

    url = f"sqlite:///{tmp_path / 'r.db'}"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = invoke(runner, "serve", "--port", str(port), "--database-url", url)
    assert result.exit_code == 3, output(result)
    assert result.stderr.splitlines() == [
        f"Error: cannot serve on 127.0.0.1:{port}: Address already in use"
    ]
    assert result.stdout == ""


def test_help_and_version(runner: CliRunner) -> None:
    result = invoke(runner, "--help")
    assert result.exit_code == 0
    for command in ("serve", "worker", "migrate", "stats", "send-test"):
        assert command in result.stdout
    version = invoke(runner, "--version")
    assert version.exit_code == 0
    assert version.stdout.startswith("relaybox, version ")


# -- the quick start, as a user runs it ---------------------------------------------------


def run_cli(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*relaybox_command(), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=clean_env(),
    )


def run_cli_concurrently(
    *commands: list[str], timeout: float = 30
) -> list[subprocess.CompletedProcess[str]]:
    """Independent commands at once (each process start costs the import time)."""
    procs = [
        subprocess.Popen(
            [*relaybox_command(), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=clean_env(),
        )
        for args in commands
    ]
    done = []
    for args, proc in zip(commands, procs, strict=True):
        out, err = proc.communicate(timeout=timeout)
        done.append(subprocess.CompletedProcess(args, proc.returncode, out, err))
    return done


class Server:
    def __init__(self, proc: subprocess.Popen[str], url: str, db: Path, log: Path) -> None:
        self.proc, self.url, self.db, self.log = proc, url, db, log

    def stderr(self) -> str:
        return self.log.read_text()


def wait_healthy(proc: subprocess.Popen[str], url: str, log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"relaybox serve exited with {proc.returncode}: {log.read_text()}")
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.05)
    pytest.fail("relaybox serve did not become healthy")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    port = free_port()
    db = tmp_path / "q.db"
    log = tmp_path / "serve.log"  # a file, not a pipe nobody drains while it runs
    with log.open("w") as stderr:
        proc = subprocess.Popen(
            [
                *relaybox_command(),
                "serve",
                "--port",
                str(port),
                "--database-url",
                f"sqlite:///{db}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            text=True,
            env=clean_env(),
            cwd=tmp_path,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, log)
        yield Server(proc, url, db, log)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def read_db(db: Path, sql: str) -> list[tuple[object, ...]]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return conn.execute(sql).fetchall()
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return []
        raise
    finally:
        conn.close()


def poll(check: object, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.05)
    pytest.fail(f"condition not met within {timeout}s: {check}")


def test_quick_start(server: Server, runner: CliRunner) -> None:
    send = ["send-test", "--url", server.url]
    first, resend_1, demo = run_cli_concurrently(
        [*send, "stripe"],
        [*send, "stripe", "--event-id", "evt_qs_1"],
        [*send, "demo"],  # the Standard Webhooks demo source
    )
    for result in (first, resend_1, demo):
        assert result.returncode == 0, result.stderr
        assert "-> 200 " in result.stdout and '"accepted"' in result.stdout, result.stdout
    assert f"{server.url}/webhooks/stripe" in first.stdout
    assert f"{server.url}/webhooks/demo" in demo.stdout

    # A provider's retry: the same event id sent again is a duplicate, not a conflict.
    resend_2 = run_cli(*send, "stripe", "--event-id", "evt_qs_1")
    assert resend_2.returncode == 0, resend_2.stderr
    assert "-> 200 " in resend_2.stdout and '"duplicate"' in resend_2.stdout, resend_2.stdout

    # The worker inside serve processes them all; the demo handler grants the credits
    # once per invoice although two events named it.
    poll(
        lambda: read_db(server.db, "SELECT status FROM relaybox_inbox") == [("done",)] * 3,
        timeout=20,
    )
    assert read_db(server.db, "SELECT workspace, credits FROM demo_balances") == [
        ("workspace_demo", 100)
    ]
    events = read_db(server.db, "SELECT source, event_type FROM relaybox_inbox")
    assert sorted(events) == [
        ("demo", "test.event"),
        ("stripe", "invoice.paid"),
        ("stripe", "invoice.paid"),
    ]

    stats = invoke(runner, "stats", "--json", "--database-url", f"sqlite:///{server.db}")
    assert stats.exit_code == 0, output(stats)
    counts = json.loads(stats.stdout)
    assert (counts["done"], counts["pending"], counts["quarantined"]) == (3, 0, 0)

    started = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    try:
        code = server.proc.wait(10)
    except subprocess.TimeoutExpired:
        pytest.fail("relaybox serve did not stop within 10 s of SIGTERM")
    assert code == 0, code  # a graceful stop, like `worker` and `dispatch`
    assert time.monotonic() - started < 10
    err = server.stderr()
    assert "Traceback" not in err, err
    assert "/webhooks/stripe" in err  # the start banner lists the demo's sources


def test_serve_postgres_embedded_from_an_empty_folder(tmp_path: Path) -> None:
    """`relaybox serve --postgres-embedded` starts a throwaway PostgreSQL under
    ./.relaybox/pg (creating the folder) and serves the demo on it."""
    port = free_port()
    proc = subprocess.Popen(
        [
            *relaybox_command(),
            "serve",
            "--postgres-embedded",
            "--port",
            str(port),
            "--roles",
            "receiver,worker",
        ],
        cwd=tmp_path,
        env=clean_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.time() + 120  # initdb and a first start, on a loaded machine
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                    assert json.loads(r.read())["status"] == "ok"
                    break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                assert time.time() < deadline, "serve --postgres-embedded did not come up"
                time.sleep(0.2)
        sent = subprocess.run(
            [*relaybox_command(), "send-test", "stripe", "--url", f"http://127.0.0.1:{port}"],
            cwd=tmp_path,
            env=clean_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert sent.returncode == 0 and '"accepted"' in sent.stdout, sent.stdout + sent.stderr
        assert (tmp_path / ".relaybox" / "pg" / "PG_VERSION").exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def test_reading_an_absent_sqlite_database_does_not_create_it(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In an empty folder, ``stats`` (the demo's sqlite:///relaybox.db) says there is no
    database there instead of leaving an empty relaybox.db behind; ``doctor`` too;
    ``migrate`` creates it. In a folder that does not exist either, nothing is made."""
    monkeypatch.chdir(tmp_path)
    for args in (["stats"], ["inbox", "list", "--json"], ["dead", "retry", "1", "--reason", "r"]):
        result = invoke(runner, *args)
        assert result.exit_code == 3, (args, output(result))
        assert "no database at relaybox.db (sqlite:///relaybox.db): run `relaybox migrate`" in (
            result.stderr
        )
    doctor = invoke(runner, "doctor", "--json")
    assert doctor.exit_code == 4  # tables missing: run migrate
    checks = {c["check"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["database"]["detail"].startswith("no database at relaybox.db")
    assert "run `relaybox migrate`" in checks["migrations"]["detail"]
    assert invoke(runner, "stats", "--database-url", "sqlite:///data/x.db").exit_code == 3
    assert list(tmp_path.iterdir()) == []
    assert invoke(runner, "migrate").exit_code == 0
    assert (tmp_path / "relaybox.db").exists()
    assert invoke(runner, "stats").exit_code == 0
