"""examples/django_credits as its README runs it, in real processes on a SQLite file:
``manage.py migrate``, ``runserver``, ``manage.py relaybox send-test`` (a delivery
signed as Stripe signs it) and ``manage.py relaybox worker``: the workspace gets its
100 credits, once."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.procs import ROOT, Proc, free_port, wait_http

pytestmark = pytest.mark.slow

PROJECT = ROOT / "examples" / "django_credits"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    import os

    keep = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "RELAYBOX_"))}
    return {**keep, "DATABASE_URL": f"sqlite:///{tmp_path / 'credits.db'}", "PYTHONPATH": ""}


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.kill()


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def start(procs: list[Proc], name: str, args: list[str], env: dict[str, str], log: Path) -> Proc:
    proc = Proc(name, [sys.executable, str(PROJECT / "manage.py"), *args], env, log)
    procs.append(proc)
    return proc


def credits(db: Path) -> int | None:
    with sqlite3.connect(db) as conn:
        row = conn.execute(
            "SELECT credits FROM credits_balance WHERE workspace = 'ws_dev'"
        ).fetchone()
    return None if row is None else int(row[0])


async def test_the_example_grants_credits_once(
    env: dict[str, str], procs: list[Proc], tmp_path: Path
) -> None:
    migrated = manage("migrate", env=env)
    assert migrated.returncode == 0, migrated.stderr
    assert "Applying relaybox.0001_initial... OK" in migrated.stdout
    current = manage("relaybox", "migrate", env=env)  # relaybox agrees: nothing to do
    assert current.returncode == 0 and "up to date" in current.stdout, current.stdout

    port = free_port()
    server = start(
        procs,
        "runserver",
        ["runserver", f"127.0.0.1:{port}", "--noreload"],
        env,
        tmp_path / "runserver.log",
    )
    await wait_http(f"http://127.0.0.1:{port}/admin/login/", within=60, proc=server)
    url = f"http://127.0.0.1:{port}"
    sent = manage(
        "relaybox",
        "send-test",
        "stripe",
        "--url",
        url,
        "--type",
        "invoice.paid",
        "--event-id",
        "evt_example_1",
        env=env,
    )
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert '"status": "accepted"' in sent.stdout, sent.stdout
    again = manage(
        "relaybox",
        "send-test",
        "stripe",
        "--url",
        url,
        "--type",
        "invoice.paid",
        "--event-id",
        "evt_example_1",
        env=env,
    )
    assert '"status": "duplicate"' in again.stdout, again.stdout

    db = Path(env["DATABASE_URL"].removeprefix("sqlite:///"))
    worker = start(procs, "worker", ["relaybox", "worker"], env, tmp_path / "worker.log")
    deadline = time.monotonic() + 60
    while credits(db) != 100:
        assert worker.alive(), worker.tail()
        assert time.monotonic() < deadline, worker.tail()
        await asyncio.sleep(0.1)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM credits_grant").fetchone() == (1,)
        assert conn.execute("SELECT status FROM relaybox_inbox").fetchall() == [("done",)]
        outbox = conn.execute("SELECT channel FROM relaybox_outbox").fetchall()
    assert outbox == [("email",)]
    assert worker.terminate() == 0, worker.tail()


def test_the_models_docs_django_md_shows_are_the_examples() -> None:
    """docs/django.md shows ``credits/models.py`` (it does not run it: the page's other
    blocks import the example's own models): every class and field it shows is the
    example's, of the same kind, and it leaves none of them out."""
    import ast
    import re

    from django.apps import apps

    text = (ROOT / "docs" / "django.md").read_text()
    [block] = re.findall(r"```python\n# credits/models.py\n(.*?)```", text, flags=re.S)
    shown: dict[str, dict[str, str]] = {}
    for node in ast.parse(block).body:
        if isinstance(node, ast.ClassDef):
            fields = shown.setdefault(node.name, {})
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call):
                    [target] = stmt.targets
                    assert isinstance(target, ast.Name) and isinstance(
                        stmt.value.func, ast.Attribute
                    )
                    fields[target.id] = stmt.value.func.attr
    assert set(shown) == {"Grant", "Balance", "Order"}
    for name, fields in shown.items():
        model = apps.get_model("credits", name)
        actual = {f.name: type(f).__name__ for f in model._meta.get_fields() if f.name != "id"}
        assert fields == actual, name
