"""``manage.py relaybox dispatch`` and ``manage.py relaybox serve``, real processes on
Django's settings and the test database: the dispatcher delivers what
``relaybox.contrib.django.publish`` committed in ``transaction.atomic()`` to a real
HTTP receiver, and ``serve`` answers ``/healthz``, accepts a signed delivery and its
worker grants it with the ORM handler."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import standardwebhooks
from django.db import connections
from examples.django_credits.credits.models import Balance, Grant

from relaybox.contrib.django import get_box
from relaybox.testing import signed_delivery
from tests.django.conftest import BOTH, publish_order, rows, wait_until
from tests.django.servers import post
from tests.django.test_publish import receiver
from tests.support.faultapp import invoice_paid
from tests.support.procs import Proc, ProcessExited, Procs, free_port, wait_http
from tests.support.receivers import HttpReceiver

pytestmark = [pytest.mark.django_db(transaction=True, databases=BOTH), pytest.mark.slow]

__all__ = ["receiver"]  # the fixture, imported for this module's tests

WS = "ws_django"


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    yield p
    p.cleanup()


def manage(procs: Procs, alias: str, name: str, *args: str) -> Proc:
    """``python -m django relaybox <args>`` on the test database of ``alias``."""
    env = {
        **procs.base_env,
        "DJANGO_SETTINGS_MODULE": "tests.django.settings",
        "DJANGO_TEST_ALIAS": alias,
        "DJANGO_TEST_DB_NAME": str(connections[alias].settings_dict["NAME"]),
    }
    argv = [sys.executable, "-m", "django", "relaybox", *args]
    proc = Proc(name, argv, env, procs.workdir / f"{len(procs.started):02d}-{name}.log")
    procs.started.append(proc)
    return proc


def test_manage_py_relaybox_dispatch_delivers_what_publish_committed(
    alias: str, receiver: tuple[HttpReceiver, str], procs: Procs
) -> None:
    hooks, secret = receiver
    order, message = publish_order(alias, WS)
    dispatcher = manage(procs, alias, "dispatch", "dispatch")

    def sent() -> bool:
        return rows(alias, "SELECT status FROM relaybox_outbox") == [{"status": "sent"}]

    wait_until(sent, dispatcher)
    [seen] = hooks.requests
    standardwebhooks.Webhook(secret).verify(seen.body, seen.headers)
    assert seen.webhook_id == message.id
    body = json.loads(seen.body)
    assert (body["type"], body["data"]) == ("order.completed", {"order": order.pk, "credits": 5})
    assert dispatcher.terminate() == 0, dispatcher.tail()  # SIGTERM: a graceful stop
    assert len(hooks.requests) == 1


def serve(procs: Procs, alias: str) -> tuple[Proc, str]:
    """``manage.py relaybox serve`` (receiver and worker) on a free port, once its
    ``/healthz`` answers 200. A port taken between choosing and binding it is retried."""
    for _ in range(3):
        port = free_port()
        args = ["serve", "--roles", "receiver,worker", "--host", "127.0.0.1", "--port", str(port)]
        proc = manage(procs, alias, "serve", *args)
        url = f"http://127.0.0.1:{port}"
        try:
            asyncio.run(wait_http(f"{url}/healthz", within=60, proc=proc))
            return proc, url
        except ProcessExited:
            if "address already in use" not in proc.tail(200).lower():
                raise
    raise RuntimeError("could not start serve on a free port")


def test_manage_py_relaybox_serve_receives_and_its_worker_grants(alias: str, procs: Procs) -> None:
    server, url = serve(procs, alias)
    assert post(f"{url}/healthz", b"", {}, method="GET").status_code == 200
    event = invoice_paid("evt_serve", "in_serve", account="acct_django")
    delivery = signed_delivery(
        get_box().sources["stripe"], event_id=event["id"], event_type=event["type"], payload=event
    )
    answer = post(f"{url}/webhooks/stripe", delivery.body, delivery.headers)
    assert answer.status_code == 200, answer.text
    assert answer.json()["status"] == "accepted"
    unsigned = {k: v for k, v in delivery.headers.items() if k.lower() != "stripe-signature"}
    forged = {**unsigned, "Stripe-Signature": f"t={int(time.time())},v1={'0' * 64}"}
    refused = post(f"{url}/webhooks/stripe", delivery.body, forged)
    assert 400 <= refused.status_code < 500, refused.text

    def done() -> bool:
        return rows(alias, "SELECT status FROM relaybox_inbox") == [{"status": "done"}]

    wait_until(done, server)
    [grant] = Grant.objects.all()
    assert (grant.workspace, grant.invoice_id, grant.credits) == (WS, "in_serve", 100)
    assert Balance.objects.get(workspace=WS).credits == 100
    assert server.terminate() == 0, server.tail()
