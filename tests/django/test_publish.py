"""``relaybox.contrib.django.publish`` in the application's ``transaction.atomic()``:
rolled back with the application's change, committed with it, delivered by the
dispatcher and verified with the official ``standardwebhooks`` package."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import standardwebhooks
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from examples.django_credits.credits.models import Order

from relaybox.contrib.django import get_box, publish
from relaybox.contrib.django.portal import run
from relaybox.errors import NotInTransaction
from relaybox.outbound import EndpointSpec, create_endpoint
from tests.django.conftest import BOTH, publish_order, rows
from tests.support.receivers import HttpReceiver

pytestmark = pytest.mark.django_db(transaction=True, databases=BOTH)

WS = "ws_django"


@pytest.fixture
def receiver(alias: str) -> Iterator[tuple[HttpReceiver, str]]:
    """A real HTTP receiver (in relaybox's loop) and its endpoint's signing secret."""
    box = get_box()
    hooks = HttpReceiver()
    run(hooks.__aenter__())
    try:
        _, secret = run(create_endpoint(box, WS, EndpointSpec(url=hooks.url)))
        yield hooks, secret
    finally:
        run(hooks.__aexit__(None, None, None))


def dispatch_once() -> int:
    dispatcher = get_box().dispatcher()
    try:
        return int(run(dispatcher.run_once(), timeout=60))
    finally:
        run(dispatcher.close())


def test_publish_rolls_back_or_commits_with_the_application(
    alias: str, receiver: tuple[HttpReceiver, str]
) -> None:
    hooks, secret = receiver
    with pytest.raises(RuntimeError), transaction.atomic(using=alias):
        Order.objects.create(workspace=WS, credits=5, completed=True)
        publish("order.completed", {"credits": 5}, tenant=WS, idempotency_key="order-x")
        raise RuntimeError("the order failed after publishing")
    assert Order.objects.count() == 0
    assert rows(alias, "SELECT id FROM relaybox_messages") == []
    assert rows(alias, "SELECT id FROM relaybox_outbox") == []
    assert dispatch_once() == 0

    def nothing_before_the_commit() -> None:
        if alias == "postgres":  # (SQLite: the dispatcher would wait for this writer)
            assert dispatch_once() == 0

    order, message = publish_order(alias, WS, before_commit=nothing_before_the_commit)
    assert dispatch_once() == 1
    [seen] = hooks.requests
    standardwebhooks.Webhook(secret).verify(seen.body, seen.headers)
    assert seen.webhook_id == message.id
    sent = json.loads(seen.body)
    assert sent["type"] == "order.completed"
    assert sent["data"] == {"order": order.pk, "credits": 5}
    [delivery] = rows(alias, "SELECT status FROM relaybox_outbox")
    assert delivery == {"status": "sent"}


def test_the_same_idempotency_key_publishes_once(alias: str) -> None:
    with transaction.atomic(using=alias):
        first: Any = publish("order.completed", {"n": 1}, tenant=WS, idempotency_key="k-1")
    with transaction.atomic(using=alias):
        again: Any = publish("order.completed", {"n": 1}, tenant=WS, idempotency_key="k-1")
    assert again.id == first.id
    assert len(rows(alias, "SELECT id FROM relaybox_messages")) == 1


def test_an_ordering_key_numbers_the_keys_messages(alias: str) -> None:
    """``ordering_key`` goes through to ``publish_sync``: numbered per key in the
    application's transaction; a rolled-back publish gives its number back."""
    with transaction.atomic(using=alias):
        first: Any = publish("order.completed", {"n": 1}, tenant=WS, ordering_key="order-7")
    with pytest.raises(RuntimeError), transaction.atomic(using=alias):
        publish("order.completed", {"n": 2}, tenant=WS, ordering_key="order-7")
        raise RuntimeError("the order failed after publishing")
    with transaction.atomic(using=alias):
        second: Any = publish("order.completed", {"n": 3}, tenant=WS, ordering_key="order-7")
    assert (first.sequence, second.sequence) == (1, 2)
    stored = rows(alias, "SELECT ordering_key, sequence FROM relaybox_messages ORDER BY sequence")
    assert stored == [
        {"ordering_key": "order-7", "sequence": 1},
        {"ordering_key": "order-7", "sequence": 2},
    ]


def test_publish_outside_atomic_is_refused(alias: str) -> None:
    """With an error that says what happened (not a settings error): nothing written."""
    with pytest.raises(NotInTransaction, match=r"inside django\.db\.transaction\.atomic") as raised:
        publish("order.completed", {}, tenant=WS)
    assert not isinstance(raised.value, ImproperlyConfigured)
    assert rows(alias, "SELECT id FROM relaybox_messages") == []
