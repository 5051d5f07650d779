"""The CLI's one grammar (docs/operating.md, "CLI"; relaybox.cli.grammar), checked by
walking the click command tree: a command added later is checked without editing this
file. Every command's ``--help`` fits 80 columns and spells its options the same way;
every command answers ``--json`` with one JSON document on stdout, whether it worked,
was misused, or found the database down (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from relaybox.cli import main
from relaybox.timespec import TIME_FORMS
from tests.conftest import free_port

APP = "tests.support.outbound_app:box"
LONG_RUNNING = {"serve", "worker", "dispatch"}
"""They run until a signal and print logs, not a document."""
EXTRA = {"maintenance": ["--once"]}
"""Arguments a command needs to return at all."""
DOWN = "postgresql://relaybox@127.0.0.1:1/relaybox"
"""A PostgreSQL nobody listens on."""


def commands() -> Iterator[tuple[list[str], click.Command]]:
    ctx = click.Context(main)

    def walk(command: click.Command, path: list[str]) -> Iterator[tuple[list[str], click.Command]]:
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None
                yield from walk(sub, [*path, name])
        else:
            yield path, command

    yield from walk(main, [])


def options(command: click.Command) -> list[click.Option]:
    return [p for p in command.params if isinstance(p, click.Option) and not p.hidden]


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    for key in list(os.environ):
        if key.startswith("RELAYBOX_") and not key.startswith("RELAYBOX_TEST_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("COLUMNS", "80")
    return CliRunner()


def test_the_walk_sees_every_area() -> None:
    names = {" ".join(path) for path, _ in commands()}
    assert {"inbox list", "dead retry", "endpoints create", "messages list", "replay",
            "doctor", "send-test", "portal link"} <= names  # fmt: skip
    assert len(names) > 40


def test_every_help_fits_80_columns_and_follows_the_grammar(runner: CliRunner) -> None:
    problems: list[str] = []
    for path, command in commands():
        where = " ".join(path)
        result = runner.invoke(main, [*path, "--help"], prog_name="relaybox", terminal_width=80)
        assert result.exit_code == 0, (where, result.output)
        problems += [f"{where}: {line!r} is wider than 80" for line in
                     result.stdout.splitlines() if len(line) > 80]  # fmt: skip
        shown = options(command)
        names = {o for opt in shown for o in opt.opts}
        if path[0] not in LONG_RUNNING and "--json" not in names:
            problems.append(f"{where}: no --json")
        for opt in shown:
            if opt.name in ("help",):
                continue
            if not opt.help:
                problems.append(f"{where}: {opt.opts[0]} has no help")
            if opt.name == "event_type" and opt.opts != ["--type"]:
                problems.append(f"{where}: the event type is {opt.opts[0]}, not --type")
            if opt.name != "event_type" and "--type" in opt.opts:
                problems.append(f"{where}: --type is not an event type")
            if opt.opts == ["--reason"] and not (opt.help or "").startswith("why: recorded"):
                problems.append(f"{where}: --reason is not the text recorded with the action")
            if opt.opts == ["--reason"] and not opt.required and "required" not in (opt.help or ""):
                problems.append(f"{where}: --reason does not say when it is required")
            if opt.opts == ["--actor"] and "cli:LOGIN@HOST" not in (opt.help or ""):
                problems.append(f"{where}: --actor has another default")
            if opt.opts == ["--since"] and TIME_FORMS not in (opt.help or ""):
                problems.append(f"{where}: --since does not name the time forms")
        for old in ("--event-type", "--events", "--dead-reason-filter"):
            if old in names:
                problems.append(f"{where}: shows {old}")
    assert problems == [], "\n".join(problems)


def _arguments(command: click.Command, tmp_path: Path) -> list[str]:
    """Made-up values for what the command requires: ids that do not exist, the first
    choice, an empty JSON object for a file."""
    body = tmp_path / "body.json"
    body.write_text("{}")
    args: list[str] = []
    for param in command.params:
        if not param.required:
            continue
        if isinstance(param.type, click.Choice):
            value = str(param.type.choices[0])
        elif isinstance(param.type, click.types.IntParamType):
            value = "999999"
        elif isinstance(param.type, click.File | click.Path):
            value = str(body)
        elif param.name in ("since", "until"):
            value = "1h"
        elif param.name == "url":
            value = "https://hooks.example.com/x"
        else:
            value = "nothing-here"
        if isinstance(param, click.Option):
            args.append(param.opts[0])
        args.append(value)
    return args


def _document(result: Result, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(result.stdout)
    except ValueError:
        raise AssertionError(f"{where}: stdout is not JSON: {result.stdout!r}") from None
    assert isinstance(doc, dict), f"{where}: {doc!r} is not an object"
    return doc


def _walk_json(runner: CliRunner, tmp_path: Path, database_url: str) -> dict[str, int]:
    codes: dict[str, int] = {}
    for path, command in commands():
        if path[0] in LONG_RUNNING:
            continue
        where = " ".join(path)
        names = {o for opt in options(command) for o in opt.opts}
        args = [*path, *_arguments(command, tmp_path), *EXTRA.get(where, []), "--json"]
        if "--database-url" in names:
            args += ["--app", APP, "--database-url", database_url]
        result = runner.invoke(main, args, catch_exceptions=False)
        doc = _document(result, where)
        codes[where] = result.exit_code
        if where == "doctor":
            assert set(doc) == {"ok", "checks"}, doc
        elif result.exit_code:
            assert set(doc) == {"error", "message"}, (where, doc)
            assert re.fullmatch(r"[a-z_]+", doc["error"]), (where, doc)
            errors = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
            assert errors == [f"Error: {doc['message']}"], (where, result.stderr)
        if isinstance(doc.get("items"), list) and "next_cursor" in doc:
            assert doc["next_cursor"] is None or isinstance(doc["next_cursor"], str)
    return codes


async def test_every_command_answers_json_on_both_backends(
    runner: CliRunner, tmp_path: Path, database_url: str
) -> None:
    codes = await asyncio.to_thread(_walk_json, runner, tmp_path, database_url)
    assert all(code in (0, 1, 2, 5) for code in codes.values()), codes
    # Lists are {"items": [...]} everywhere (paged ones with next_cursor).
    for where in ("inbox list", "dead list", "endpoints list", "messages list",
                  "api-keys list", "event-types list", "endpoints blocked-keys"):  # fmt: skip
        assert codes[where] == 0, where
    assert codes["dead retry"] == 2 and codes["inbox show"] == 1


def test_with_the_database_down_every_command_says_so(runner: CliRunner, tmp_path: Path) -> None:
    codes = _walk_json(runner, tmp_path, DOWN)
    reaching = {w for w, c in codes.items() if c == 3}
    assert {
        "inbox list",
        "dead list",
        "stats",
        "endpoints list",
        "messages publish",
        "purge",
        "doctor",
    } <= reaching
    assert all(code in (0, 2, 3) for code in codes.values()), codes  # fmt: skip
    # Without --json: nothing on stdout, one "Error:" line on stderr.
    result = runner.invoke(main, ["inbox", "list", "--database-url", DOWN])
    assert result.exit_code == 3 and result.stdout == ""
    assert result.stderr.startswith("Error: database unreachable (postgresql://relaybox@")


def test_old_option_names_still_parse_hidden_and_with_a_warning(
    runner: CliRunner, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'relaybox.db'}"
    assert runner.invoke(main, ["migrate", "--database-url", url]).exit_code == 0

    def run(*args: str) -> Result:
        result = runner.invoke(main, [*args, "--app", APP, "--database-url", url])
        assert result.exit_code == 0, (args, result.output)
        return result

    hook = "https://hooks.example.com/"
    created = json.loads(
        run(
            "endpoints", "create", "--tenant", "t1", "--url", hook + "a", "--events", "a.*,b.one"
        ).stdout
    )
    assert created["event_types"] == ["a.*", "b.one"]
    again = json.loads(
        run("endpoints", "create", "--tenant", "t1", "--url", hook + "b", "--type", "a.*",
            "--type", "c").stdout
    )  # fmt: skip
    assert again["event_types"] == ["a.*", "c"]
    old = run("endpoints", "create", "--tenant", "t1", "--url", "https://hooks.example.com/c",
              "--events", "x")  # fmt: skip
    assert "Warning: --events is deprecated, use --type" in old.stderr

    run("messages", "publish", "--tenant", "t1", "--type", "a.one", "--data", "{}")
    run("messages", "publish", "--tenant", "t1", "--type", "c", "--data", "{}")
    listed = json.loads(run("messages", "list", "--event-type", "c", "--json").stdout)
    assert [m["event_type"] for m in listed["items"]] == ["c"]
    assert json.loads(run("dead", "list", "--reason", "exhausted", "--json").stdout) == {
        "items": [], "next_cursor": None,
    }  # fmt: skip
    removed = json.loads(run("endpoints", "credentials", created["id"], "--type", "none").stdout)
    assert removed["id"] == created["id"]


def test_tables_fit_80_columns_with_one_time_format(runner: CliRunner, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'relaybox.db'}"
    assert runner.invoke(main, ["migrate", "--database-url", url]).exit_code == 0
    common = ["--app", APP, "--database-url", url]
    endpoint = None
    for n in range(2):
        created = runner.invoke(main, ["endpoints", "create", "--tenant", "tenant-with-a-long-name",
                             "--url", f"https://hooks.example.com/some/longer/path/{n}",
                             "--type", "invoice.payment_failed,customer.*", *common])  # fmt: skip
        endpoint = endpoint or json.loads(created.stdout)["id"]
        runner.invoke(main, ["messages", "publish", "--tenant", "tenant-with-a-long-name",
                             "--type", "invoice.payment_failed", *common])  # fmt: skip
    assert endpoint is not None
    disabled = runner.invoke(main, ["endpoints", "disable", endpoint, "--reason", "r", *common])
    assert disabled.exit_code == 0
    for args in (["endpoints", "list"], ["messages", "list"], ["messages", "undelivered"],
                 ["api-keys", "list"], ["event-types", "list"]):  # fmt: skip
        result = runner.invoke(main, [*args, *common])
        assert result.exit_code == 0, (args, result.output)
        lines = result.stdout.splitlines()
        assert all(len(line) <= 80 for line in lines), (args, result.stdout)
        # Not cropped at the edge: every row of the table ends with its border.
        drawn = [line for line in lines if line[:1] in "┏┃┡│└"]
        assert drawn and all(line[-1] in "┓┃┩│┘" for line in drawn), (args, result.stdout)
        text = result.stdout
        assert "+00:00" not in text and "_at" not in text and "event_type" not in text, text
        for word in ("status", "created", "type"):
            # A header is never cut: "statu" then "s" on the next line.
            assert not re.search(rf"\b{word[:-1]}\s*│", text) or word in text, text
    messages = runner.invoke(main, ["messages", "list", *common]).stdout
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ", messages), messages
    endpoints = runner.invoke(main, ["endpoints", "list", *common]).stdout
    assert "status" in endpoints and "enabled" in endpoints and "disabled" in endpoints


ROOT = Path(__file__).resolve().parents[2]


def _documented_commands() -> Iterator[tuple[str, list[str]]]:
    """Every ``relaybox …`` line of the shell blocks of README.md, docs/ and the
    examples' READMEs (continuation lines joined, comments and ``$`` prompts off)."""
    import shlex

    paths = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted((ROOT / "examples").glob("*/README*"))]  # fmt: skip
    for path in paths:
        block = False
        lines = path.read_text().splitlines()
        joined: list[str] = []
        for line in lines:
            if line.startswith("```"):
                block = line.strip() in ("```sh", "```bash", "```shell", "```console")
                continue
            if not block:
                continue
            if joined and joined[-1].endswith("\\"):
                joined[-1] = joined[-1][:-1] + " " + line.strip()
            else:
                joined.append(line.strip().removeprefix("$ "))
        for text in joined:
            if not text.startswith(("relaybox ", ".venv/bin/relaybox ")):
                continue
            try:
                words = shlex.split(text.split(" #")[0].split(" | ")[0].split(" &")[0])
            except ValueError:
                continue
            yield f"{path.relative_to(ROOT)}: {text}", words[1:]


def test_documented_commands_use_the_grammar() -> None:
    """A documented command names a command that exists and only options it shows
    (no deprecated spelling): what a reader copies is what ``--help`` says."""
    ctx = click.Context(main)
    problems = []
    seen = 0
    for where, words in _documented_commands():
        command: click.Command = main
        while isinstance(command, click.Group) and words and not words[0].startswith("-"):
            sub = command.get_command(ctx, words[0])
            if sub is None:
                problems.append(f"{where}: no command {words[0]!r}")
                break
            command, words = sub, words[1:]
        seen += 1
        shown = {o for opt in options(command) for o in (*opt.opts, *opt.secondary_opts)}
        shown |= {"--help", "-h", "--version"}
        for word in words:
            name = word.split("=")[0]
            if name.startswith("--") and name not in shown:
                problems.append(f"{where}: {name} is not an option of it")
    assert seen > 20
    assert problems == [], "\n".join(problems)


def test_a_failed_recovery_is_one_error_document(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The provider's API unreachable: {"error": "recovery_failed"} (was stderr only)."""
    url = f"sqlite:///{tmp_path / 'relaybox.db'}"
    assert runner.invoke(main, ["migrate", "--database-url", url]).exit_code == 0
    monkeypatch.setenv("GITHUB_TOKEN", "not-a-token")
    result = runner.invoke(main, ["recover", "--source", "stripe", "--since", "1h",
                                  "--repo", "o/n", "--hook-id", "1",
                                  "--api-url", f"http://127.0.0.1:{free_port()}",
                                  "--database-url", url, "--json"])  # fmt: skip
    assert result.exit_code == 1, result.output
    doc = _document(result, "recover")
    assert doc["error"] == "recovery_failed" and "GitHub API unreachable" in doc["message"]


def test_reason_and_actor_are_bounded_as_the_admin_api_bounds_them(
    runner: CliRunner, tmp_path: Path
) -> None:
    from relaybox.cli.grammar import MAX_ACTOR_CHARS, MAX_REASON_CHARS

    url = f"sqlite:///{tmp_path / 'relaybox.db'}"
    assert runner.invoke(main, ["migrate", "--database-url", url]).exit_code == 0
    common = ["--app", APP, "--database-url", url]
    for args in (
        ["dead", "discard", "1", "--reason", ""],
        ["dead", "discard", "1", "--reason", "r" * (MAX_REASON_CHARS + 1)],
        ["endpoints", "disable", "ep_x", "--reason", "r", "--actor", ""],
        ["endpoints", "enable", "ep_x", "--reason", "r", "--actor", "a" * (MAX_ACTOR_CHARS + 1)],
        ["erase", "--subject", "cus_1", "--reason", "", "--actor", "me"],
    ):
        result = runner.invoke(main, [*args, *common])
        assert result.exit_code == 2, (args, result.output)
        assert "characters" in result.output and "Traceback" not in result.output, args
    # At the bound it is taken (and refused for what it names: no such row, exit 1).
    at_bound = ["dead", "discard", "1", "--reason", "r" * MAX_REASON_CHARS]
    assert runner.invoke(main, [*at_bound, *common]).exit_code == 1
