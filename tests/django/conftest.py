"""pytest-django for tests/django only: Django is configured when this directory is
collected (tests.django.settings), so the rest of the suite runs without it.

Each test picks a backend with ``alias`` (``default``: SQLite file, ``postgres``:
the suite's PostgreSQL server, a test database of its own), on which relaybox and
the example's models both run. relaybox's tables are unmanaged by Django's test
flush: ``alias`` empties them after each test."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db import connections

import django
from relaybox.contrib.django import get_box, publish, reset_box
from relaybox.contrib.django.portal import run
from tests.support.procs import Proc

BOTH = ["default", "postgres"]


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """After tests/conftest.py has the PostgreSQL server's URL in the environment."""
    if not django_settings.configured:
        ours = "DJANGO_SETTINGS_MODULE" not in os.environ
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.django.settings")
        django.setup()
        if ours:  # loaded now; processes other tests start are no Django project
            del os.environ["DJANGO_SETTINGS_MODULE"]


@pytest.fixture(scope="session", autouse=True)
def _close_box(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """relaybox's connections closed before the test databases are dropped."""
    yield
    with django_db_blocker.unblock():
        reset_box()


@pytest.fixture(params=BOTH, ids=["sqlite", "postgres"])
def alias(request: pytest.FixtureRequest, settings: Any, transactional_db: None) -> Iterator[str]:
    settings.RELAYBOX_DATABASE = request.param
    yield request.param
    empty_relaybox_tables(request.param)


def empty_relaybox_tables(alias: str) -> None:
    conn = connections[alias]
    tables = [
        t
        for t in conn.introspection.table_names()
        if t.startswith("relaybox_") and t != "relaybox_migrations"
    ]
    with conn.cursor() as cur:
        if conn.vendor == "postgresql":
            cur.execute(f"TRUNCATE {', '.join(tables)} CASCADE")
        else:
            cur.execute("BEGIN")
            cur.execute("PRAGMA defer_foreign_keys = ON")
            for table in tables:
                cur.execute(f"DELETE FROM {table}")
            cur.execute("COMMIT")


def rows(alias: str, sql: str, *params: Any) -> list[dict[str, Any]]:
    """``sql`` (``%s`` parameters) on ``alias``, as dicts."""
    with connections[alias].cursor() as cur:
        cur.execute(sql, params)
        names = [c[0] for c in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def drain_worker(max_steps: int = 50) -> int:
    """Worker steps (in relaybox's loop) until nothing is due; rows processed."""
    worker = get_box().worker()
    total = 0
    for _ in range(max_steps):
        count = int(run(worker.run_once(), timeout=120))
        if count == 0:
            return total
        total += count
    raise AssertionError(f"the worker still had due rows after {max_steps} steps")


def drain_when_due(within: float = 30) -> int:
    """:func:`drain_worker` until it processes something: a retry comes due after its
    backoff (wall clock), polled until ``within`` seconds."""
    deadline = time.monotonic() + within
    while (count := drain_worker()) == 0:
        assert time.monotonic() < deadline, "the retry never came due"
        time.sleep(0.1)
    return count


def wait_until(check: Callable[[], bool], proc: Proc, within: float = 60) -> None:
    """Poll ``check()`` (the database, as another process leaves it) until it is true;
    fail with ``proc``'s log if it exits first or ``within`` seconds pass."""
    deadline = time.monotonic() + within
    while not check():
        assert proc.alive(), proc.tail()
        assert time.monotonic() < deadline, proc.tail()
        time.sleep(0.1)


def publish_order(
    alias: str, workspace: str, *, before_commit: Callable[[], None] | None = None
) -> tuple[Any, Any]:
    """An order completed for 5 credits and its ``order.completed`` message, published
    in the same ``transaction.atomic()``; ``before_commit`` runs inside it, last.
    Returns (order, message)."""
    from django.db import transaction
    from examples.django_credits.credits.models import Order

    with transaction.atomic(using=alias):
        order = Order.objects.create(workspace=workspace, credits=5, completed=True)
        message = publish(
            "order.completed",
            {"order": order.pk, "credits": 5},
            tenant=workspace,
            idempotency_key=f"order-{order.pk}",
        )
        if before_commit is not None:
            before_commit()
    return order, message
