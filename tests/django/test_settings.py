"""``settings.RELAYBOX`` as a dict or a dotted path, and the mistakes a project can
make with it: each is Django's ``ImproperlyConfigured`` (and a relaybox error) that
says what to change."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from relaybox import Relaybox
from relaybox.contrib.django.conf import build_box, follow_database
from relaybox.contrib.django.db import async_database_url
from relaybox.errors import RelayboxError

project_box = Relaybox("sqlite:///elsewhere.db")


@pytest.mark.parametrize(
    ("configured", "message"),
    [
        (42, "must be a dict of relaybox settings or the dotted path"),
        ({"database_url": "sqlite:///x.db"}, "RELAYBOX_DATABASE"),
        ({"worker": {"concurrency": 0}}, "worker.concurrency"),
        ("tests.django.test_settings.nothing_here", "nothing_here"),
        ("tests.django.test_settings.WHAT", "not a Relaybox"),
    ],
)
def test_mistakes_are_named(settings: Any, configured: Any, message: str) -> None:
    settings.RELAYBOX = configured
    with pytest.raises(ImproperlyConfigured, match=message) as raised:
        build_box()
    assert isinstance(raised.value, RelayboxError)


WHAT = "a string, not a box"


def test_a_dotted_path_names_the_projects_box_on_djangos_database(settings: Any) -> None:
    settings.RELAYBOX = "tests.django.test_settings.project_box"
    box = build_box()
    assert box is project_box
    follow_database(box, "default")
    assert box.settings.database_url == async_database_url("default")
    assert box.settings.database_url.startswith("sqlite:///") and "elsewhere" not in (
        box.settings.database_url
    )


def test_a_dict_builds_a_box_that_checks_the_schema(settings: Any) -> None:
    settings.RELAYBOX = {"sources": {"stripe": {"provider": "stripe", "secrets": ["whsec_1"]}}}
    box = build_box()
    assert list(box.sources) == ["stripe"]
    assert box.settings.migrate == "check"  # manage.py migrate sets the tables up


def test_an_in_memory_sqlite_database_is_refused() -> None:
    from django.db import connections

    wrapper = connections["default"]
    saved = wrapper.settings_dict["NAME"]
    wrapper.settings_dict["NAME"] = ":memory:"
    try:
        with pytest.raises(ImproperlyConfigured, match="in memory"):
            async_database_url("default")
    finally:
        wrapper.settings_dict["NAME"] = saved


def test_a_box_synchronous_code_used_follows_the_database_it_is_moved_to(
    tmp_path: Path,
) -> None:
    """The store synchronous code made (``publish``, ``box.store.sync``) before any
    coroutine ran is closed when the box follows another database (a test runner's):
    it had kept the first one, and accepted deliveries went there. In a process of its
    own (``tests/django/moved_database.py``), where relaybox's loop has not started."""
    root = Path(__file__).parents[2]
    done = subprocess.run(
        [sys.executable, str(root / "tests/django/moved_database.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(root)},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0", "the box still reads the database it used before"


def test_relaybox_environment_variables_apply_over_the_dict(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``RELAYBOX_*`` variables apply over ``settings.RELAYBOX`` as they do over a
    relaybox.toml (they were ignored); ``RELAYBOX_DATABASE_URL`` does not: the
    database is Django's."""
    settings.RELAYBOX = {"worker": {"concurrency": 2}, "log_level": "info"}
    monkeypatch.setenv("RELAYBOX_WORKER__CONCURRENCY", "7")
    monkeypatch.setenv("RELAYBOX_OUTBOUND__TIMEOUT", "9")
    monkeypatch.setenv("RELAYBOX_DATABASE_URL", "postgresql://elsewhere/db")
    box = build_box()
    assert box.settings.worker.concurrency == 7
    assert box.settings.outbound.timeout == 9.0
    assert box.settings.log_level == "info"  # the dict's, where no variable says
    assert "elsewhere" not in box.settings.database_url
    monkeypatch.setenv("RELAYBOX_WORKER__CONCURRENCY", "0")
    with pytest.raises(ImproperlyConfigured, match=r"worker\.concurrency"):
        build_box()


def test_manage_py_relaybox_help_names_the_projects_box(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``manage.py relaybox … --help``: --app defaults to settings.RELAYBOX's box there,
    and the help says so (it said "the demo")."""
    from relaybox.contrib.django.management.commands.relaybox import Command

    monkeypatch.setenv("RELAYBOX_APP", "restored-after-the-test")
    monkeypatch.delenv("RELAYBOX_APP")  # unset, as in a shell; the command sets it
    with pytest.raises(SystemExit) as done:
        Command().run_from_argv(["manage.py", "relaybox", "stats", "--help"])
    assert done.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert (
        "--app TEXT module:attribute of your Relaybox (default: relaybox.contrib.django:box)"
        in (shown)
    )
    assert "the demo" not in shown
