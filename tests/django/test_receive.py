"""The Django view receives as the ASGI receiver does: a signed Stripe delivery
through Django served for real (WSGI: pytest-django's live server; ASGI: uvicorn)
makes one inbox row, answered 2xx after its COMMIT; bad requests get the receiver's
status codes and JSON bodies, byte for byte."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.db import connections

from relaybox.contrib.django import get_box
from relaybox.contrib.django.portal import run
from relaybox.testing import signed_delivery
from tests.django.conftest import BOTH, rows
from tests.django.servers import asgi_server, post
from tests.support.faultapp import invoice_paid
from tests.support.procs import free_port

pytestmark = pytest.mark.django_db(transaction=True, databases=BOTH)


def signed(event: dict[str, Any]) -> Any:
    return signed_delivery(
        get_box().sources["stripe"], event_id=event["id"], event_type=event["type"], payload=event
    )


def test_a_signed_delivery_makes_one_inbox_row(alias: str, live_server: Any) -> None:
    event = invoice_paid("evt_view_1", "in_view_1", account="acct_django")
    delivery = signed(event)
    url = f"{live_server.url}/webhooks/stripe"
    first = post(url, delivery.body, delivery.headers)
    assert first.status_code == 200, first.text
    assert first.json() == {"status": "accepted", "event_id": "evt_view_1"}
    # The 2xx came after the COMMIT: the row is there, from any connection.
    [row] = rows(alias, "SELECT source, account, event_id, tenant, status FROM relaybox_inbox")
    assert row == {
        "source": "stripe",
        "account": "acct_django",
        "event_id": "evt_view_1",
        "tenant": "ws_django",
        "status": "pending",
    }
    again = post(url, delivery.body, delivery.headers)
    assert again.json() == {"status": "duplicate", "event_id": "evt_view_1"}
    assert len(rows(alias, "SELECT id FROM relaybox_inbox")) == 1


def test_under_asgi_too(alias: str) -> None:
    event = invoice_paid("evt_view_2", "in_view_2", account="acct_django")
    delivery = signed(event)
    with asgi_server() as base:
        answer = post(f"{base}/webhooks/stripe", delivery.body, delivery.headers)
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"status": "accepted", "event_id": "evt_view_2"}
    assert [r["event_id"] for r in rows(alias, "SELECT event_id FROM relaybox_inbox")] == [
        "evt_view_2"
    ]


def test_fifty_concurrent_copies_make_one_row(alias: str, live_server: Any) -> None:
    delivery = signed(invoice_paid("evt_view_3", "in_view_3", account="acct_django"))
    url = f"{live_server.url}/webhooks/stripe"
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda _: post(url, delivery.body, delivery.headers), range(50)))
    assert [a.status_code for a in answers] == [200] * 50
    outcomes = sorted(a.json()["status"] for a in answers)
    assert outcomes == ["accepted"] + ["duplicate"] * 49
    assert len(rows(alias, "SELECT id FROM relaybox_inbox")) == 1


async def _asgi_answer(
    box: Any, method: str, path: str, headers: dict[str, str], body: bytes
) -> tuple[int, dict[str, str], bytes]:
    """The ASGI receiver's answer to the same request, in process."""
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "root_path": "",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "scheme": "http",
        "server": ("127.0.0.1", 80),
    }
    sent = False
    messages: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    await box.receiver(scope, receive, send)
    start, payload = messages
    extra = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], extra, payload["body"]


def test_bad_requests_get_the_asgi_receivers_answers(alias: str, live_server: Any) -> None:
    box = get_box()
    good = signed(invoice_paid("evt_view_4", "in_view_4", account="acct_django"))
    tampered = dict(good.headers, **{"stripe-signature": "t=1,v1=" + "0" * 64})
    big = b"{" + b" " * (box.sources["stripe"].max_body + 10) + b"}"
    cases = [
        ("POST", "/nope", good.headers, good.body),  # 404 unknown source
        ("GET", "/stripe", {}, b""),  # 405, Allow: POST
        ("POST", "/stripe", tampered, good.body),  # 401 bad signature
        ("POST", "/stripe", {"content-type": "application/json"}, good.body),  # 401 missing
        ("POST", "/stripe", good.headers, big),  # 413
        ("POST", "/stripe", good.headers, b"{not json"),  # 401 (signature of other bytes)
    ]
    for method, path, headers, body in cases:
        status, extra, raw = run(_asgi_answer(box, method, path, headers, body))
        answer = post(f"{live_server.url}/webhooks{path}", body, headers, method=method)
        assert answer.status_code == status, (path, answer.text)
        assert answer.content == raw, path
        assert answer.headers.get("content-type") == extra["content-type"]
        assert answer.headers.get("allow") == extra.get("allow")
        assert answer.headers.get("retry-after") == extra.get("retry-after")
        assert status >= 400 and json.loads(raw)["error"]
    assert rows(alias, "SELECT id FROM relaybox_inbox") == []


@contextmanager
def database_away(alias: str, tmp_path: Path) -> Iterator[None]:
    """relaybox's database unreachable for the view: ``DATABASES[alias]`` names a port
    nothing listens on (PostgreSQL) or a file under a regular file, which cannot be
    created or opened (SQLite), and the box follows (its connections closed); then the
    real one again."""
    params = connections[alias].settings_dict
    if connections[alias].vendor == "sqlite":
        (tmp_path / "not-a-directory").write_bytes(b"")
        key, away = "NAME", str(tmp_path / "not-a-directory" / "app.db")
    else:
        key, away = "PORT", str(free_port())
    real = params[key]
    params[key] = away
    get_box()
    try:
        yield
    finally:
        params[key] = real
        get_box()


def test_the_database_away_is_a_503_with_retry_after(
    alias: str, live_server: Any, tmp_path: Path
) -> None:
    url = f"{live_server.url}/webhooks/stripe"
    delivery = signed(invoice_paid("evt_view_away", "in_view_away", account="acct_django"))
    with database_away(alias, tmp_path):
        away = post(url, delivery.body, delivery.headers)
    assert away.status_code == 503, away.text
    assert away.headers["Retry-After"] == "5"
    assert away.json()["error"] == "unavailable"
    assert rows(alias, "SELECT id FROM relaybox_inbox") == []
    # The sender's retry, once the database is back, is accepted.
    again = post(url, delivery.body, delivery.headers)
    assert again.status_code == 200, again.text
    assert again.json() == {"status": "accepted", "event_id": "evt_view_away"}
    assert len(rows(alias, "SELECT id FROM relaybox_inbox")) == 1
