"""``manage.py relaybox worker`` (a real process, Django's settings) SIGKILLed before
and after the COMMIT of the ORM handler's transaction never grants twice
(tests/support/faultapp.py's faults, in tests/django/faults.py's box), and a
handler that SIGKILLs every worker running one event ends it dead ``exhausted``
after max_attempts crashes while the others are done, granted once."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from examples.django_credits.credits.models import Balance, Grant

from tests.django.conftest import BOTH, rows, wait_until
from tests.django.test_handlers import deliver
from tests.support.faultapp import POISON_INVOICE, invoice_paid
from tests.support.procs import Proc, Procs

pytestmark = [pytest.mark.django_db(transaction=True, databases=BOTH), pytest.mark.slow]

KILLED = -signal.SIGKILL


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    yield p
    p.cleanup()


def worker(procs: Procs, alias: str, fault: str, marker: Path, name: str) -> Proc:
    """``python -m django relaybox worker`` on the test database of ``alias``."""
    env = {
        **procs.base_env,
        "DJANGO_SETTINGS_MODULE": "tests.django.settings",
        "DJANGO_TEST_ALIAS": alias,
        "DJANGO_TEST_DB_NAME": str(connections[alias].settings_dict["NAME"]),
        "FAULT": fault,
        "FAULT_MARKER": str(marker),
    }
    args = [sys.executable, "-m", "django", "relaybox", "worker"]
    proc = Proc(name, args, env, procs.workdir / f"{len(procs.started):02d}-{name}.log")
    procs.started.append(proc)
    return proc


def wait_exit(proc: Proc, within: float = 60) -> int:
    """The exit code, waiting for the process itself (not polling); fail after
    ``within`` seconds."""
    try:
        return proc.popen.wait(within)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{proc.name} still running after {within} s\n{proc.tail()}") from None


def state(alias: str) -> dict[str, Any]:
    statuses: dict[str, int] = {}
    for row in rows(alias, "SELECT status FROM relaybox_inbox"):
        statuses[row["status"]] = statuses.get(row["status"], 0) + 1
    balance = Balance.objects.filter(workspace="ws_django").first()
    return {
        "inbox": statuses,
        "grants": Grant.objects.count(),
        "credits": balance.credits if balance else 0,
        "operations": len(rows(alias, "SELECT business_key FROM relaybox_operations")),
    }


def settled(alias: str, done: int) -> bool:
    return state(alias)["inbox"] == {"done": done}


def test_worker_killed_before_commit_rolls_back_and_the_next_grants_once(
    alias: str, live_server: Any, procs: Procs, tmp_path: Path
) -> None:
    deliver(live_server.url, invoice_paid("evt_k1", "in_k1", account="acct_django"))
    first = worker(procs, alias, "kill_before_commit", tmp_path / "fired", "worker1")
    assert wait_exit(first) == KILLED, first.tail()
    # Rolled back: no grant, no balance, no key; the attempt itself was counted.
    assert state(alias) == {"inbox": {"pending": 1}, "grants": 0, "credits": 0, "operations": 0}
    assert rows(alias, "SELECT attempts FROM relaybox_inbox") == [{"attempts": 1}]

    second = worker(procs, alias, "kill_before_commit", tmp_path / "fired", "worker2")
    wait_until(lambda: settled(alias, 1), second)
    assert state(alias) == {"inbox": {"done": 1}, "grants": 1, "credits": 100, "operations": 1}
    assert rows(alias, "SELECT attempts FROM relaybox_inbox") == [{"attempts": 2}]
    assert second.terminate() == 0, second.tail()


def test_worker_killed_after_commit_never_grants_twice(
    alias: str, live_server: Any, procs: Procs, tmp_path: Path
) -> None:
    deliver(live_server.url, invoice_paid("evt_k2", "in_k2", account="acct_django"))
    first = worker(procs, alias, "kill_after_commit", tmp_path / "fired", "worker1")
    assert wait_exit(first) == KILLED, first.tail()
    committed = {"inbox": {"done": 1}, "grants": 1, "credits": 100, "operations": 1}
    assert state(alias) == committed

    # The sender re-delivers, and another event names the same invoice.
    assert deliver(live_server.url, invoice_paid("evt_k2", "in_k2", account="acct_django")) == (
        "duplicate"
    )
    assert deliver(live_server.url, invoice_paid("evt_k3", "in_k2", account="acct_django")) == (
        "accepted"
    )
    second = worker(procs, alias, "kill_after_commit", tmp_path / "fired", "worker2")
    wait_until(lambda: settled(alias, 2), second)
    assert state(alias) == {**committed, "inbox": {"done": 2}}
    assert rows(alias, "SELECT attempts FROM relaybox_inbox WHERE event_id = 'evt_k2'") == [
        {"attempts": 1}
    ]
    assert second.terminate() == 0, second.tail()


def supervise(
    procs: Procs, alias: str, done: Callable[[], bool], tmp_path: Path, within: float = 90
) -> int:
    """``manage.py relaybox worker`` (FAULT=poison), restarted whenever it dies, until
    ``done()``; how many times it was killed."""
    deadline = time.monotonic() + within
    crashes = 0
    while True:
        proc = worker(procs, alias, "poison", tmp_path / "unused", f"worker{crashes}")
        while proc.alive() and not done():
            assert time.monotonic() < deadline, f"not settled after {within} s\n{procs.tails()}"
            time.sleep(0.05)
        if proc.alive():
            assert proc.terminate() == 0, proc.tail()
            return crashes
        assert proc.returncode == KILLED, proc.tail()
        crashes += 1


POISON_EVENTS = ["evt_ok_1", "evt_ok_2", "evt_poison", "evt_ok_3"]


def test_a_poison_event_is_dead_exhausted_and_the_others_are_done(
    alias: str, live_server: Any, procs: Procs, tmp_path: Path
) -> None:
    """``in_poison`` among three good invoices: each attempt SIGKILLs the worker and
    the supervisor restarts it. The attempt is counted before the handler runs, so
    after max_attempts (3) crashes the next claim dead-letters it as ``exhausted``;
    the good events end done, granted once each."""
    for event_id in POISON_EVENTS:
        invoice = POISON_INVOICE if event_id == "evt_poison" else event_id.replace("evt", "in")
        assert deliver(live_server.url, invoice_paid(event_id, invoice, account="acct_django")) == (
            "accepted"
        )

    def no_pending() -> bool:
        return not state(alias)["inbox"].get("pending")

    assert supervise(procs, alias, no_pending, tmp_path) == 3  # the default max_attempts
    inbox = {
        r["event_id"]: (r["status"], r["dead_reason"], r["attempts"])
        for r in rows(alias, "SELECT event_id, status, dead_reason, attempts FROM relaybox_inbox")
    }
    assert inbox["evt_poison"] == ("dead", "exhausted", 3), inbox
    assert {e: s for e, (s, _, _) in inbox.items()} == {
        **dict.fromkeys(POISON_EVENTS, "done"),
        "evt_poison": "dead",
    }
    assert state(alias) == {
        "inbox": {"done": 3, "dead": 1},
        "grants": 3,
        "credits": 300,
        "operations": 3,
    }
    assert sorted(g.invoice_id for g in Grant.objects.all()) == ["in_ok_1", "in_ok_2", "in_ok_3"]
