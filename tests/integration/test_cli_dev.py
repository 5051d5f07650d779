"""Development mode (``relaybox serve --dev``, ``RELAYBOX_DEV=1`` for every command):
one switch instead of three settings for a local loop, on SQLite and PostgreSQL. It
allows plain http to this machine's endpoints and says so, gives a PostgreSQL without
``outbound.secrets_key`` a key file of its own, and refuses to serve beyond loopback.
Without it, the refusals name the settings that change them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from relaybox.cli import main

HOOK = "http://127.0.0.1:9000/hook"


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, database_url: str) -> Any:
    for key in list(os.environ):
        if key.startswith("RELAYBOX_") and not key.startswith("RELAYBOX_TEST_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(tmp_path)  # .relaybox/dev.key is made here
    runner = CliRunner()

    def invoke(*args: str, code: int = 0, dev: bool = False) -> Result:
        env = {"RELAYBOX_DEV": "1"} if dev else {}
        result = runner.invoke(main, [*args, "--database-url", database_url], env=env)
        assert result.exit_code == code, (args, result.output)
        return result

    return invoke


def test_without_it_the_refusals_name_their_settings(run: Any) -> None:
    refused = run("endpoints", "create", "--tenant", "t1", "--url", HOOK, code=2)
    assert "https is required" in refused.stderr
    assert "outbound.allow_insecure_loopback" in refused.stderr
    assert "relaybox serve --dev" in refused.stderr


def test_relaybox_dev_lets_every_command_use_loopback_endpoints(
    run: Any, database_url: str, tmp_path: Path
) -> None:
    created = run("endpoints", "create", "--tenant", "t1", "--url", HOOK, dev=True)
    endpoint = json.loads(created.stdout)
    assert endpoint["url"] == HOOK and endpoint["secret"].startswith("whsec_")
    assert "development mode (RELAYBOX_DEV): allowed plain http to loopback" in created.stderr
    assert "127.0.0.0/8 and ::1/128 (outbound.allow_networks)" in created.stderr
    key_file = tmp_path / ".relaybox" / "dev.key"
    if database_url.startswith("postgresql"):
        # No outbound.secrets_key: the secret is sealed with a development key file.
        assert f"{Path('.relaybox/dev.key')}" in created.stderr
        assert key_file.stat().st_mode & 0o777 == 0o600
    else:  # SQLite keeps its key beside the database, as without --dev
        assert not key_file.exists()
    # Another command, another process in real life: the same key opens the secret.
    shown = json.loads(run("endpoints", "show", endpoint["id"], dev=True).stdout)
    assert [s["secret"] for s in shown["secrets"]] == [endpoint["secret"]]


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "::", "example.com"])
def test_serve_dev_refuses_to_bind_beyond_loopback(run: Any, host: str) -> None:
    for dev in ({"args": ("--dev",), "dev": False}, {"args": (), "dev": True}):
        refused = run("serve", *dev["args"], "--host", host, code=2, dev=dev["dev"])
        assert "serves on a loopback address only" in refused.stderr, refused.stderr
        assert f"not {host}" in refused.stderr
        assert "relaybox " not in refused.stderr.split("Error:")[0]  # nothing served


def test_the_commands_variables_are_not_settings(run: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """RELAYBOX_APP (--app) and RELAYBOX_DEV are the command's, not unknown settings."""
    monkeypatch.setenv("RELAYBOX_APP", "tests.support.outbound_app:box")
    assert "pending" in json.loads(run("stats", "--json", dev=True).stdout)
