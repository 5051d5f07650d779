"""One time grammar in every command: ``2h``, ``7d``, ``30m`` (that long ago), epoch
seconds and ISO 8601 are accepted wherever a time is, anything else is a usage error
(exit 2) naming the accepted forms. In-process with click's CliRunner, both backends."""

from __future__ import annotations

import os
from typing import Any

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
    assert (
        runner.invoke(main, ["migrate", "--app", APP, "--database-url", database_url]).exit_code
        == 0
    )

    def invoke(*args: str, code: int = 0) -> Any:
        result = runner.invoke(
            main, [*args, "--app", APP, "--database-url", database_url], prog_name="relaybox"
        )
        assert result.exit_code == code, (args, result.output, result.exception)
        return result

    return invoke


@pytest.mark.parametrize("when", ["2h", "7d", "30m", "1767225600", "2026-01-01T00:00:00Z"])
def test_every_form_is_accepted_everywhere(run: Any, when: str) -> None:
    run("inbox", "list", "--since", when, "--until", when, "--json")
    run("dead", "list", "--since", when, "--json")
    # Parsed, then refused for what it names (no such endpoint): exit 1, not 2.
    missing = run("endpoints", "recover", "ep_nope", "--since", when, "--reason", "r", code=1)
    assert "no endpoint ep_nope" in missing.output


@pytest.mark.parametrize("when", ["yesterday", "2x", "1e9"])
def test_anything_else_is_a_usage_error_naming_the_forms(run: Any, when: str) -> None:
    for args in (
        ("inbox", "list", "--since", when),
        ("dead", "retry", "--all", "--reason", "r", "--until", when),
        ("endpoints", "recover", "ep_nope", "--since", when, "--reason", "r"),
        ("replay", "--since", when, "--dry-run"),
    ):
        result = run(*args, code=2)
        assert "is not a time: use 2h, 30m, 7d" in result.output, args
    bad = run("purge", "--older-than", when, code=2)
    assert "is not a duration" in bad.output
