"""The receiver over real HTTP (uvicorn on a free port), on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import hashlib
import hmac as hmac_mod
import json
import time
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
import stripe
from sqlalchemy.engine import make_url
from standardwebhooks.webhooks import Webhook

from relaybox import Relaybox, Secret, SystemClock, sources
from relaybox.config import Settings
from tests.conftest import Served, create_pg_database, drop_pg_database, free_port
from tests.support.proxy import TcpProxy

STD_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
STRIPE_SECRET = "whsec_test_stripe_secret"
GITHUB_SECRET = "It's a Secret to Everybody"
SLACK_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
# Well past the default 300 s tolerance: a live request may reach the server seconds
# after it was signed on a slow machine. The exact edge is tested with a fixed clock
# in test_sources.py.
OUTSIDE_TOLERANCE = 360


def configure(box: Relaybox) -> Relaybox:
    box.source("std", sources.standard(secrets=[Secret(STD_SECRET, tenant="t-std")]))
    box.source(
        "stripe",
        sources.stripe(
            secrets=[Secret(STRIPE_SECRET, account="acct_1", tenant="workspace-1")],
            ignore_types=["customer.*"],
            max_body=4096,
        ),
    )
    box.source("github", sources.github(secrets=[GITHUB_SECRET]))
    box.source("slack", sources.slack(secrets=[SLACK_SECRET]))
    return box


def std_delivery(
    msg_id: str, payload: dict[str, Any], *, when: float | None = None
) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(payload).encode()
    ts = datetime.fromtimestamp(when if when is not None else time.time(), tz=UTC)
    signature = Webhook(STD_SECRET).sign(msg_id, ts, body.decode())
    headers = {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(ts.timestamp())),
        "webhook-signature": signature,
        "content-type": "application/json",
    }
    return body, headers


def stripe_delivery(
    event: dict[str, Any], *, when: int | None = None
) -> tuple[bytes, dict[str, str]]:
    body = json.dumps(event).encode()
    t = when if when is not None else int(time.time())
    sig = stripe.WebhookSignature._compute_signature(f"{t}.{body.decode()}", STRIPE_SECRET)
    return body, {"stripe-signature": f"t={t},v1={sig}", "content-type": "application/json"}


def invoice_paid(event_id: str, invoice: str = "in_1") -> dict[str, Any]:
    return {"id": event_id, "type": "invoice.paid", "data": {"object": {"id": invoice}}}


@pytest.fixture
async def live(database_url: str) -> Any:
    box = configure(Relaybox(settings=Settings(database_url=database_url), clock=SystemClock()))
    async with Served(box.receiver) as server:
        async with aiohttp.ClientSession(server.url) as http:
            yield box, http
    await box.close()


async def inbox_rows(box: Relaybox) -> list[dict[str, Any]]:
    return await box.store.fetch_all(
        "SELECT source, account, event_id, event_type, tenant, status, payload "
        "FROM relaybox_inbox ORDER BY id"
    )


async def post(
    http: aiohttp.ClientSession, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, Any]:
    async with http.post(path, data=body, headers=headers) as r:
        return r.status, await r.json()


async def test_stripe_delivery_signed_by_official_sdk_is_accepted(live: Any) -> None:
    box, http = live
    body, headers = stripe_delivery(invoice_paid("evt_1"))
    status, answer = await post(http, "/stripe", body, headers)
    assert (status, answer["status"]) == (200, "accepted")
    [row] = await inbox_rows(box)
    assert (row["source"], row["account"], row["event_id"]) == ("stripe", "acct_1", "evt_1")
    assert (row["event_type"], row["tenant"], row["status"]) == (
        "invoice.paid",
        "workspace-1",
        "pending",
    )
    assert bytes(row["payload"]) == body  # the exact bytes, for re-verification and replay


async def test_the_headers_are_kept_without_the_hops_credentials(live: Any) -> None:
    """The delivery's headers are stored as JSON with it, except the credentials of
    the hop (Authorization, Cookie, Proxy-Authorization)."""
    box, http = live
    body, headers = stripe_delivery(invoice_paid("evt_h"))
    extra = {"authorization": "Bearer x", "cookie": "s=1", "x-request-id": "r-1"}
    status, _ = await post(http, "/stripe", body, {**headers, **extra})
    assert status == 200
    [row] = await box.store.fetch_all("SELECT headers FROM relaybox_inbox")
    kept = json.loads(row["headers"])
    assert kept["stripe-signature"] == headers["stripe-signature"]
    assert kept["x-request-id"] == "r-1"
    assert not {"authorization", "cookie"} & set(kept)


async def test_standard_webhooks_signed_by_official_package_is_accepted(live: Any) -> None:
    box, http = live
    body, headers = std_delivery("msg_1", {"type": "user.created", "data": {"id": 1}})
    status, answer = await post(http, "/std", body, headers)
    assert (status, answer["status"]) == (200, "accepted")
    [row] = await inbox_rows(box)
    assert (row["event_id"], row["event_type"], row["tenant"]) == ("msg_1", "user.created", "t-std")


async def test_github_delivery_uses_delivery_header_as_event_id(live: Any) -> None:
    box, http = live
    body = json.dumps({"action": "opened", "installation": {"id": 42}}).encode()
    sig = hmac_mod.new(GITHUB_SECRET.encode(), body, hashlib.sha256).hexdigest()
    headers = {
        "x-hub-signature-256": f"sha256={sig}",
        "x-github-delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        "x-github-event": "issues",
    }
    status, _ = await post(http, "/github", body, headers)
    assert status == 200
    [row] = await inbox_rows(box)
    assert row["event_id"] == "72d3162e-cc78-11e3-81ab-4c9367dc0958"
    assert (row["account"], row["event_type"]) == ("42", "issues.opened")


async def test_fifty_concurrent_copies_make_one_row(live: Any) -> None:
    box, http = live
    body, headers = stripe_delivery(invoice_paid("evt_dup"))
    results = await asyncio.gather(*(post(http, "/stripe", body, headers) for _ in range(50)))
    assert all(status == 200 for status, _ in results)
    assert sorted(a["status"] for _, a in results) == ["accepted"] + ["duplicate"] * 49
    assert len(await inbox_rows(box)) == 1


async def test_duplicate_leaves_the_original_row_alone(live: Any) -> None:
    box, http = live
    body, headers = stripe_delivery(invoice_paid("evt_keep"))
    await post(http, "/stripe", body, headers)
    await box.store.fetch_all(
        "UPDATE relaybox_inbox SET status = 'dead', dead_reason = 'invalid' RETURNING id"
    )
    status, answer = await post(http, "/stripe", body, headers)
    assert (status, answer["status"]) == (200, "duplicate")
    [row] = await inbox_rows(box)
    assert row["status"] == "dead"  # its recovery path (replay) is untouched


async def test_same_id_with_other_content_goes_to_quarantine(live: Any) -> None:
    box, http = live
    body, headers = stripe_delivery(invoice_paid("evt_q", invoice="in_A"))
    await post(http, "/stripe", body, headers)
    other, other_headers = stripe_delivery(invoice_paid("evt_q", invoice="in_B"))
    for _ in range(2):  # a repeated conflicting delivery is quarantined once
        status, answer = await post(http, "/stripe", other, other_headers)
        assert (status, answer["status"]) == (200, "quarantined")
    [row] = await inbox_rows(box)
    assert bytes(row["payload"]) == body
    quarantined = await box.store.fetch_all("SELECT event_id, payload FROM relaybox_quarantine")
    assert [(q["event_id"], bytes(q["payload"])) for q in quarantined] == [("evt_q", other)]


async def test_configured_ignored_type_is_recorded_not_processed(live: Any) -> None:
    box, http = live
    event = {"id": "evt_ign", "type": "customer.updated", "data": {"object": {}}}
    body, headers = stripe_delivery(event)
    status, answer = await post(http, "/stripe", body, headers)
    assert (status, answer["status"]) == (200, "ignored")
    [row] = await inbox_rows(box)
    assert row["status"] == "ignored"


def _bad_inputs() -> list[tuple[str, str, int, str]]:
    return [
        ("bad signature", "/stripe", 401, "bad_signature"),
        ("missing signature", "/stripe", 401, "missing_signature"),
        ("stale timestamp", "/stripe", 401, "stale_timestamp"),
        ("future timestamp", "/stripe", 401, "stale_timestamp"),
        ("malformed header", "/std", 400, "malformed_headers"),
        ("oversized declared", "/stripe", 413, "payload_too_large"),
        ("oversized chunked", "/stripe", 413, "payload_too_large"),
        ("malformed json", "/stripe", 400, "malformed_json"),
        ("unknown source", "/nope", 404, "unknown_source"),
        ("reserialised json", "/stripe", 401, "bad_signature"),
    ]


@pytest.mark.parametrize(("case", "path", "expected", "code"), _bad_inputs())
async def test_bad_input_gets_its_status_and_changes_nothing(
    live: Any, case: str, path: str, expected: int, code: str
) -> None:
    box, http = live
    body, headers = stripe_delivery(invoice_paid("evt_bad"))
    data: Any = body
    if case == "bad signature":
        signed = headers["stripe-signature"]  # ends in hex: change its last two digits
        headers["stripe-signature"] = signed[:-2] + ("11" if signed.endswith("00") else "00")
    elif case == "missing signature":
        del headers["stripe-signature"]
    elif case == "stale timestamp":
        body, headers = stripe_delivery(
            invoice_paid("evt_bad"), when=int(time.time()) - OUTSIDE_TOLERANCE
        )
        data = body
    elif case == "future timestamp":
        body, headers = stripe_delivery(
            invoice_paid("evt_bad"), when=int(time.time()) + OUTSIDE_TOLERANCE
        )
        data = body
    elif case == "malformed header":
        data, headers = std_delivery("m1", {"type": "x"})
        headers["webhook-timestamp"] = "yesterday"
    elif case == "oversized declared":
        data, headers = stripe_delivery({**invoice_paid("evt_bad"), "pad": "x" * 5000})
    elif case == "oversized chunked":
        data_bytes, headers = stripe_delivery({**invoice_paid("evt_bad"), "pad": "x" * 5000})

        async def chunks() -> Any:
            for i in range(0, len(data_bytes), 1000):
                yield data_bytes[i : i + 1000]

        data = chunks()
    elif case == "malformed json":
        t = int(time.time())
        data = b'{"id": "evt_bad", "type": '
        sig = stripe.WebhookSignature._compute_signature(f"{t}.{data.decode()}", STRIPE_SECRET)
        headers = {"stripe-signature": f"t={t},v1={sig}"}
    elif case == "reserialised json":
        data = json.dumps(json.loads(body), indent=2).encode()
    async with http.post(path, data=data, headers=headers) as r:
        assert r.status == expected, await r.text()
        answer = await r.json()
    assert answer["error"] == code
    assert STRIPE_SECRET not in json.dumps(answer)
    assert await inbox_rows(box) == []


def slack_delivery(payload: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
    """Signed as Slack documents it: ``v0=`` HMAC-SHA256 of ``v0:{timestamp}:{body}``."""
    body = json.dumps(payload).encode()
    ts = str(int(time.time()))
    mac = hmac_mod.new(SLACK_SECRET.encode(), b"v0:" + ts.encode() + b":" + body, hashlib.sha256)
    headers = {
        "x-slack-request-timestamp": ts,
        "x-slack-signature": "v0=" + mac.hexdigest(),
        "content-type": "application/json",
    }
    return body, headers


async def test_slack_url_verification_is_answered_with_its_challenge_and_not_stored(
    live: Any,
) -> None:
    """Slack's endpoint handshake wants the challenge echoed in the 200; it is not an
    event. An unsigned handshake is refused like any delivery."""
    box, http = live
    challenge = {
        "token": "t",
        "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P",
        "type": "url_verification",
    }
    body, headers = slack_delivery(challenge)
    status, answer = await post(http, "/slack", body, headers)
    assert (status, answer) == (200, {"challenge": challenge["challenge"]})
    headers["x-slack-signature"] = "v0=" + "0" * 64
    status, answer = await post(http, "/slack", body, headers)
    assert (status, answer["error"]) == (401, "bad_signature")
    assert await inbox_rows(box) == []
    event = {
        "type": "event_callback",
        "team_id": "T1",
        "event_id": "Ev1",
        "event": {"type": "app_mention"},
    }
    body, headers = slack_delivery(event)
    status, answer = await post(http, "/slack", body, headers)
    assert (status, answer["status"]) == (200, "accepted")
    [row] = await inbox_rows(box)
    assert (row["event_id"], row["account"]) == ("Ev1", "T1")


async def test_wrong_method_is_405(live: Any) -> None:
    _, http = live
    async with http.get("/stripe") as r:
        assert r.status == 405
        assert r.headers["allow"] == "POST"
        assert (await r.json())["error"] == "method_not_allowed"


async def test_startup_opens_the_accept_connections_before_the_first_request() -> None:
    """The server's lifespan opens one accept connection per committer (and plans the
    accept statement on each, with an empty batch that stores nothing): the first
    requests under load do not wait for connections opening one by one."""
    url = await create_pg_database()
    box = configure(Relaybox(settings=Settings(database_url=url), clock=SystemClock()))
    try:
        async with Served(box.receiver, lifespan="on") as server:
            backends = await box.store.fetch_all(
                "SELECT count(*) AS n FROM pg_stat_activity"
                " WHERE datname = current_database() AND application_name = 'relaybox'"
                " AND pid <> pg_backend_pid()"
            )
            assert backends[0]["n"] >= box.inbound.acceptor.committers == 3
            assert await box.store.fetch_all("SELECT id FROM relaybox_inbox") == []
            async with aiohttp.ClientSession(server.url) as http:
                body, headers = stripe_delivery(invoice_paid("evt_after_warm"))
                assert (await post(http, "/stripe", body, headers))[1]["status"] == "accepted"
    finally:
        await box.close()
        await drop_pg_database(url)


async def test_startup_with_the_database_down_still_serves_and_answers_503() -> None:
    """Warming is best effort: with nothing listening on the database's port the
    server starts at once and answers 503, never a 2xx."""
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere"  # nobody listens there
    box = configure(Relaybox(settings=Settings(database_url=url), clock=SystemClock()))
    started = time.monotonic()
    try:
        async with (
            Served(box.receiver, lifespan="on") as server,
            aiohttp.ClientSession(server.url) as http,
        ):
            assert time.monotonic() - started < 5
            body, headers = stripe_delivery(invoice_paid("evt_db_down_at_start"))
            status, answer = await post(http, "/stripe", body, headers)
            assert (status, answer["error"]) == (503, "unavailable")
    finally:
        await box.close()


async def test_a_store_error_that_is_not_an_outage_is_still_503_and_never_a_traceback(
    live: Any,
) -> None:
    """The inbox table gone (a schema someone broke, a migration not run): the INSERT
    fails with an error that is not a lost connection. The sender gets 503 and a plain
    message, so it retries; once the table is back, the retry is accepted."""
    box, http = live
    async with box.store.transaction() as conn:
        await conn.exec_driver_sql("ALTER TABLE relaybox_inbox RENAME TO relaybox_inbox_away")
    body, headers = stripe_delivery(invoice_paid("evt_no_table"))
    async with http.post("/stripe", data=body, headers=headers) as r:
        text = await r.text()
        assert r.status == 503, text
        assert r.headers["retry-after"] == "5"
    assert json.loads(text)["error"] == "unavailable"
    assert "Traceback" not in text and "relaybox_inbox" not in text
    async with box.store.transaction() as conn:
        await conn.exec_driver_sql("ALTER TABLE relaybox_inbox_away RENAME TO relaybox_inbox")
    status, answer = await post(http, "/stripe", body, headers)
    assert (status, answer["status"]) == (200, "accepted")
    assert [r["event_id"] for r in await inbox_rows(box)] == ["evt_no_table"]


async def test_database_down_is_503_and_the_retry_is_accepted_once() -> None:
    """Cut a TCP proxy between relaybox and PostgreSQL (never the shared server)."""
    url = await create_pg_database()
    u = make_url(url)
    socket_dir = u.query.get("host")
    if socket_dir:  # the embedded server listens on a unix socket only
        proxy = await TcpProxy(unix=f"{socket_dir}/.s.PGSQL.{u.port or 5432}").start()
    else:
        proxy = await TcpProxy(host=u.host or "127.0.0.1", port=u.port or 5432).start()
    via_proxy = u.set(host="127.0.0.1", port=proxy.port, query={}).render_as_string(
        hide_password=False
    )
    box = configure(
        Relaybox(settings=Settings(database_url=via_proxy, accept_timeout=5), clock=SystemClock())
    )
    try:
        async with Served(box.receiver) as server, aiohttp.ClientSession(server.url) as http:
            body, headers = stripe_delivery(invoice_paid("evt_warm"))
            assert (await post(http, "/stripe", body, headers))[0] == 200

            proxy.cut()
            body, headers = stripe_delivery(invoice_paid("evt_outage"))
            status, answer = await post(http, "/stripe", body, headers)
            assert status == 503
            assert answer["error"] == "unavailable"

            proxy.restore()
            # The sender retries; the first retry may still meet a connection the
            # pool has not yet dropped, and gets 503 again: never a false 2xx.
            for _ in range(20):
                status, answer = await post(http, "/stripe", body, headers)
                if status == 200:
                    break
                assert status == 503
                await asyncio.sleep(0.1)
            assert (status, answer["status"]) == (200, "accepted")
            status, answer = await post(http, "/stripe", body, headers)
            assert (status, answer["status"]) == (200, "duplicate")
        rows = await box.store.fetch_all(
            "SELECT event_id FROM relaybox_inbox WHERE event_id = 'evt_outage'"
        )
        assert len(rows) == 1
    finally:
        await box.close()
        await proxy.close()
        await drop_pg_database(url)
