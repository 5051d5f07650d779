"""``--json`` on every command that prints something: one JSON document on stdout.
In-process with click's CliRunner, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
from typing import Any

import click
import pytest
from click.testing import CliRunner

from relaybox.cli import main

APP = "tests.support.outbound_app:box"


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch, database_url: str) -> Any:
    for key in list(os.environ):
        if key.startswith("RELAYBOX_") and not key.startswith("RELAYBOX_TEST_"):
            monkeypatch.delenv(key)
    runner = CliRunner()

    def invoke(*args: str, code: int = 0, db: bool = True) -> Any:
        extra = ["--app", APP, "--database-url", database_url] if db else []
        result = runner.invoke(main, [*args, *extra], prog_name="relaybox")
        assert result.exit_code == code, (args, result.output, result.exception)
        return json.loads(result.stdout)

    return invoke


def test_every_printing_command_takes_json() -> None:
    """Every command but the long-running ones (they print logs)."""
    ctx = click.Context(main)
    missing = []

    def walk(command: click.Command, path: list[str]) -> None:
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None
                walk(sub, [*path, name])
        elif not any("--json" in getattr(p, "opts", ()) for p in command.params):
            missing.append(" ".join(path))

    walk(main, [])
    assert sorted(missing) == ["dispatch", "serve", "worker"]


def test_json_output_of_actions(run: Any) -> None:
    migrated = run("migrate", "--json")
    assert isinstance(migrated["applied"], list) and migrated["plaintext"] == 0
    assert run("migrate", "--json")["applied"] == []
    assert len(run("endpoints", "new-key", "--json", db=False)["key"]) > 20

    created = run(
        "endpoints", "create", "--tenant", "t1", "--url", "https://hooks.example.com/x",
        "--json",
    )  # fmt: skip
    endpoint_id = created["id"]
    assert run("endpoints", "show", endpoint_id, "--json")["id"] == endpoint_id
    disabled = run("endpoints", "disable", endpoint_id, "--reason", "r", "--actor", "a", "--json")
    assert (disabled["endpoint_id"], disabled["status"], disabled["disabled_reason"]) == (
        endpoint_id, "disabled", "manual by a: r",
    )  # fmt: skip
    run("endpoints", "enable", endpoint_id, "--reason", "r", "--json")
    recovered = run("endpoints", "recover", endpoint_id, "--since", "1h", "--reason", "r", "--json")
    assert recovered["recovered"] == 0
    key = run("api-keys", "create", "--tenant", "t1", "--name", "ci", "--json")
    assert run("api-keys", "revoke", key["id"], "--json") == {"id": key["id"], "revoked": True}
