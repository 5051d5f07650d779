"""The receiving edge under hostile or broken input, over real HTTP (uvicorn on a free
port): CPU-heavy signature lists, values the databases cannot store, deep JSON, absurd
timestamps, and a source whose code fails. Database items run on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac as std_hmac
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from relaybox import Relaybox, Secret, SystemClock, sources
from relaybox.config import Settings
from relaybox.errors import ConfigurationError, RejectedDelivery, StoreUnavailable
from relaybox.inbound.receiver import _read_body, check_length
from relaybox.sources.base import Headers, Identity, Source
from relaybox.store import NewDelivery
from tests.conftest import Served

STRIPE_SECRET = "whsec_hardening_stripe"
HMAC_SECRET = "hardening-hmac-secret"
SLACK_SECRET = "hardening-slack-secret"
STD_KEY = b"hardening-standard-hmac-key-0123"
STD_SECRET = "whsec_" + base64.b64encode(STD_KEY).decode()
ED_PRIVATE = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
ED_PUBLIC = "whpk_" + base64.b64encode(ED_PRIVATE.public_key().public_bytes_raw()).decode()
HUGE_TIMESTAMP = "9" * 400
TIMEOUT = aiohttp.ClientTimeout(total=10)


def configure(box: Relaybox) -> Relaybox:
    box.source("stripe", sources.stripe(secrets=[STRIPE_SECRET]))
    box.source("ed", sources.standard(secrets=[ED_PUBLIC]))
    box.source("std", sources.standard(secrets=[STD_SECRET]))
    box.source("slack", sources.slack(secrets=[SLACK_SECRET]))
    box.source(
        "generic",
        sources.hmac(
            secrets=[HMAC_SECRET],
            header="X-Signature",
            signed="{timestamp}.{body}",
            timestamp_header="X-Timestamp",
            id_path="id",
        ),
    )
    return box


def stripe_signed(
    body: bytes, timestamp: str | None = None, secret: str = STRIPE_SECRET
) -> dict[str, str]:
    t = timestamp if timestamp is not None else str(int(time.time()))
    mac = std_hmac.new(secret.encode(), t.encode() + b"." + body, hashlib.sha256)
    return {"stripe-signature": f"t={t},v1={mac.hexdigest()}", "content-type": "application/json"}


def stripe_event(event_id: str, **fields: Any) -> bytes:
    return json.dumps({"id": event_id, "type": "invoice.paid", **fields}).encode()


def ed_signed(msg_id: str, body: bytes, timestamp: int) -> str:
    return (
        "v1a,"
        + base64.b64encode(ED_PRIVATE.sign(f"{msg_id}.{timestamp}.".encode() + body)).decode()
    )


@pytest.fixture
async def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'relaybox.db'}"


async def serve(database_url: str) -> tuple[Relaybox, Served]:
    box = configure(Relaybox(settings=Settings(database_url=database_url), clock=SystemClock()))
    await box.migrate()
    return box, Served(box.asgi(roles=("receiver",)), lifespan="on")


async def post(
    http: aiohttp.ClientSession, url: str, body: bytes, headers: dict[str, str]
) -> tuple[int, dict[str, Any], float]:
    started = time.perf_counter()
    async with http.post(url, data=body, headers=headers) as response:
        answer = await response.read()
        elapsed = time.perf_counter() - started
        assert response.content_type == "application/json", answer[:200]
        return response.status, json.loads(answer), elapsed


# -- CPU-heavy signatures -------------------------------------------------------------


async def test_ed25519_signature_flood_is_refused_at_once(sqlite_url: str) -> None:
    """4,000 well-formed ``v1a`` entries on a 1 MB body: refused before any verification
    (it took 16 s of the event loop), while /healthz answers as usual meanwhile."""
    box, server = await serve(sqlite_url)
    body = json.dumps({"type": "x", "pad": "a" * 999_970}).encode()
    assert 999_000 < len(body) <= 1_000_000
    signer = Ed25519PrivateKey.from_private_bytes(bytes(range(1, 33)))
    flood = " ".join(
        "v1a," + base64.b64encode(signer.sign(b"%d" % i)).decode() for i in range(4000)
    )
    now = int(time.time())
    headers = {"webhook-id": "msg_flood", "webhook-timestamp": str(now), "webhook-signature": flood}
    async with server, aiohttp.ClientSession(timeout=TIMEOUT) as http:
        url = f"{server.url}/webhooks/ed"
        health_times: list[float] = []
        done = asyncio.Event()

        async def poll_health() -> None:
            while not done.is_set():
                started = time.perf_counter()
                async with http.get(f"{server.url}/healthz") as response:
                    assert response.status == 200, await response.text()
                health_times.append(time.perf_counter() - started)

        poller = asyncio.create_task(poll_health())
        try:
            floods = [await post(http, url, body, headers) for _ in range(3)]
            done.set()
            await poller
        finally:
            done.set()
            poller.cancel()
        for status, answer, _ in floods:
            assert (status, answer["error"]) == (401, "too_many_signatures"), answer
        # Best of three: the refusal itself costs microseconds; the rest is the upload.
        assert min(elapsed for _, _, elapsed in floods) < 0.05, floods
        assert health_times and max(health_times) < 1.0, health_times

        # The right signature still counts among 16 entries, and not among 17.
        msg_id = "msg_good"
        good = ed_signed(msg_id, body, now)
        decoys = flood.split()[:16]
        for entries, expected in ((decoys[:15], 200), (decoys, 401)):
            signature = " ".join([*entries, good])
            status, answer, _ = await post(
                http,
                url,
                body,
                {
                    "webhook-id": msg_id,
                    "webhook-timestamp": str(now),
                    "webhook-signature": signature,
                },
            )
            assert status == expected, answer
    await box.close()


# -- values the databases cannot store ---------------------------------------------


POISON = {
    "nul id": stripe_event("evt_nul\x00"),
    "surrogate type": json.dumps({"id": "evt_type", "type": "invoice.\ud800"}).encode(),
    "surrogate account": stripe_event("evt_account", account="acct_\ud800"),
    "surrogate version": stripe_event("evt_version", api_version="2024-\udfff"),
    "long account": stripe_event("evt_long_account", account="a" * 10_000),
}


async def test_poison_delivery_fails_alone(database_url: str) -> None:
    """A correctly signed event whose id, type, account or version no database can store
    gets 400 for itself; the 200 deliveries sent at the same time are all accepted."""
    box, server = await serve(database_url)
    async with server, aiohttp.ClientSession(timeout=TIMEOUT) as http:
        url = f"{server.url}/webhooks/stripe"
        good = [stripe_event(f"evt_good_{i}") for i in range(200)]
        bodies = good[:100] + list(POISON.values()) + good[100:]
        answers = await asyncio.gather(*(post(http, url, b, stripe_signed(b)) for b in bodies))
        poisoned = answers[100 : 100 + len(POISON)]
        fine = answers[:100] + answers[100 + len(POISON) :]
        for name, (status, answer, _) in zip(POISON, poisoned, strict=True):
            assert (status, answer["error"]) == (400, "malformed_payload"), (name, answer)
        assert [(s, a["status"]) for s, a, _ in fine] == [(200, "accepted")] * 200
    await box.close()


async def test_an_account_no_database_stores_is_refused_when_the_secret_names_one_too(
    database_url: str,
) -> None:
    """The secret names the account, so the payload's own ``account`` is not the one
    stored: a lone surrogate or a NUL in it is still a 400 (every identity field the
    pipeline reads is checked, for every provider), and nothing is stored."""
    pinned = "whsec_hardening_pinned"
    box = configure(Relaybox(settings=Settings(database_url=database_url), clock=SystemClock()))
    box.source("pinned", sources.stripe(secrets=[Secret(pinned, account="acct_pinned")]))
    await box.migrate()
    async with (
        Served(box.asgi(roles=("receiver",)), lifespan="on") as server,
        aiohttp.ClientSession(timeout=TIMEOUT) as http,
    ):
        url = f"{server.url}/webhooks/pinned"
        for n, account in enumerate(["acct_\ud800", "acct_\x00", "a" * 200]):
            body = stripe_event(f"evt_pinned_{n}", account=account)
            status, answer, _ = await post(http, url, body, stripe_signed(body, secret=pinned))
            assert (status, answer["error"]) == (400, "malformed_payload"), (account, answer)
            assert "account" in answer["message"]
        body = stripe_event("evt_pinned_ok", account="acct_other")
        status, answer, _ = await post(http, url, body, stripe_signed(body, secret=pinned))
        assert (status, answer["status"]) == (200, "accepted"), answer
    rows = await box.store.fetch_all("SELECT event_id, account FROM relaybox_inbox")
    assert [(r["event_id"], r["account"]) for r in rows] == [("evt_pinned_ok", "acct_pinned")]
    await box.close()


async def test_acceptor_isolates_a_row_the_database_refuses(database_url: str) -> None:
    """Defence in depth below the edge: a row the database refuses, committed in one
    group with 60 good ones, fails alone; the others are committed and answered."""
    box = Relaybox(settings=Settings(database_url=database_url), clock=SystemClock())

    def delivery(event_id: str, event_type: str = "t") -> NewDelivery:
        return NewDelivery(
            source="direct",
            account="default",
            event_id=event_id,
            event_type=event_type,
            tenant=None,
            fingerprint=hashlib.sha256(event_id.encode()).digest(),
            payload=b"{}",
            headers=None,
            version=None,
            received_at=time.time(),
        )

    try:
        rows = [delivery(f"evt_{i}") for i in range(60)]
        rows.insert(30, delivery("evt_bad", "type-\ud800"))
        results = await asyncio.gather(
            *(box.inbound.acceptor.accept(row) for row in rows), return_exceptions=True
        )
        bad = results.pop(30)
        assert isinstance(bad, StoreUnavailable), bad
        assert [getattr(r, "status", r) for r in results] == ["accepted"] * 60
        again = await box.inbound.acceptor.accept(delivery("evt_7"))
        assert again.status == "duplicate"
    finally:
        await box.close()


# -- deep JSON and absurd timestamps -------------------------------------------------


@pytest.mark.parametrize(("depth", "expected"), [(1000, 400), (5000, 400), (257, 400), (200, 200)])
async def test_deeply_nested_json_is_refused(sqlite_url: str, depth: int, expected: int) -> None:
    box, server = await serve(sqlite_url)
    body = (
        f'{{"id":"evt_deep_{depth}","type":"x","data":' + "[" * depth + "]" * depth + "}"
    ).encode()
    async with server, aiohttp.ClientSession(timeout=TIMEOUT) as http:
        status, answer, _ = await post(
            http, f"{server.url}/webhooks/stripe", body, stripe_signed(body)
        )
    await box.close()
    assert status == expected, answer
    if expected == 400:
        assert answer["error"] == "json_too_deep"


def _std_huge(body: bytes) -> dict[str, str]:
    mac = std_hmac.new(STD_KEY, f"msg_1.{HUGE_TIMESTAMP}.".encode() + body, hashlib.sha256)
    return {
        "webhook-id": "msg_1",
        "webhook-timestamp": HUGE_TIMESTAMP,
        "webhook-signature": "v1," + base64.b64encode(mac.digest()).decode(),
    }


def _slack_huge(body: bytes) -> dict[str, str]:
    mac = std_hmac.new(SLACK_SECRET.encode(), f"v0:{HUGE_TIMESTAMP}:".encode() + body, "sha256")
    return {
        "x-slack-signature": "v0=" + mac.hexdigest(),
        "x-slack-request-timestamp": HUGE_TIMESTAMP,
    }


def _hmac_huge(body: bytes, timestamp: str = HUGE_TIMESTAMP) -> dict[str, str]:
    mac = std_hmac.new(HMAC_SECRET.encode(), timestamp.encode() + b"." + body, "sha256")
    return {"x-signature": mac.hexdigest(), "x-timestamp": timestamp}


@pytest.mark.parametrize(
    ("source", "sign"),
    [
        ("generic", _hmac_huge),
        ("generic", lambda body: _hmac_huge(body, "1e400")),
        ("generic", lambda body: _hmac_huge(body, "inf")),
        ("generic", lambda body: _hmac_huge(body, "NaN")),
        ("stripe", lambda body: stripe_signed(body, HUGE_TIMESTAMP)),
        ("std", _std_huge),
        ("slack", _slack_huge),
    ],
    ids=["hmac-400-digits", "hmac-1e400", "hmac-inf", "hmac-nan", "stripe", "standard", "slack"],
)
async def test_absurd_timestamp_is_refused(sqlite_url: str, source: str, sign: Any) -> None:
    """A 400-digit (or non-numeric) timestamp, even correctly signed, is a 400, never a
    500 from OverflowError."""
    box, server = await serve(sqlite_url)
    body = json.dumps(
        {"id": "evt_ts", "type": "x", "event_id": "Ev1", "event": {"type": "message"}}
    ).encode()
    async with server, aiohttp.ClientSession(timeout=TIMEOUT) as http:
        status, answer, _ = await post(http, f"{server.url}/webhooks/{source}", body, sign(body))
    await box.close()
    assert (status, answer["error"]) == (400, "malformed_headers"), answer


# -- a failing source ------------------------------------------------------------------


class _BrokenSource(Source):
    """A provider module with a bug: identify() raises an unexpected exception."""

    provider = "broken"

    def authenticate(
        self, headers: Headers, body: bytes, now: float, check_time: bool
    ) -> tuple[Secret, float | None]:
        return self.secrets[0], None

    def identify(self, headers: Headers, payload: Any) -> Identity:
        return Identity(event_id=payload["items"][3], event_type="x")


async def test_a_bug_in_a_source_answers_503_without_traceback(sqlite_url: str) -> None:
    box, server = await serve(sqlite_url)
    box.source("broken", _BrokenSource(secrets=["s"]))
    async with server, aiohttp.ClientSession(timeout=TIMEOUT) as http:
        status, answer, _ = await post(http, f"{server.url}/webhooks/broken", b'{"items":[]}', {})
    await box.close()
    assert status == 503, answer
    assert answer == {"error": "internal_error", "message": "the delivery could not be verified"}


# -- the limits as settings ------------------------------------------------------------


def test_limits_are_source_options_from_config() -> None:
    source = sources.from_config(
        "standard", {"secrets": [ED_PUBLIC], "max_signatures": "4", "max_json_depth": 32}
    )
    assert (source.max_signatures, source.max_json_depth) == (4, 32)
    assert source.describe()["max_signatures"] == 4
    assert sources.stripe(secrets=["s"]).max_signatures == 16
    for bad in ({"max_signatures": 0}, {"max_signatures": "x"}, {"max_json_depth": 5000}):
        with pytest.raises(ConfigurationError):
            sources.from_config("stripe", {"secrets": ["s"], **bad})
    with pytest.raises(ConfigurationError):
        sources.stripe(secrets=[Secret("s", tenant="t\x00")])


def test_only_heavy_ed25519_work_leaves_the_event_loop() -> None:
    """The thread hop is for public-key work on large bodies (or many keys): HMAC
    sources never ask, one ``v1a`` entry on a small body stays on the loop."""
    assert not sources.standard(secrets=[STD_SECRET]).may_offload
    assert not sources.stripe(secrets=["s"]).may_offload
    ed = sources.standard(secrets=[ED_PUBLIC])
    small = b'{"type":"x"}'
    large = b"x" * 1_000_000
    headers = {"webhook-signature": ed_signed("m", small, 1)}
    assert ed.may_offload and not ed.offload(headers, small)
    assert ed.offload(headers, large)
    many = {"webhook-signature": " ".join([headers["webhook-signature"]] * 16)}
    assert ed.offload(many, small)


def test_repeated_keys_are_checked_once() -> None:
    """Two secrets with one key (per-account entries of one signing key) cost one
    verification per signature entry, and the first of them is the one that matched."""
    source = sources.standard(
        secrets=[Secret(ED_PUBLIC, account="a"), Secret(ED_PUBLIC, account="b")]
    )
    body = b'{"type":"x"}'
    now = int(time.time())
    headers = {
        "webhook-id": "m",
        "webhook-timestamp": str(now),
        "webhook-signature": ed_signed("m", body, now),
    }
    verified = source.verify(headers, body, now)
    assert verified.account == "a"
    assert source._ed25519_keys == 1
    twice = sources.standard(secrets=[ED_PUBLIC, ED_PUBLIC])
    assert twice.verify(headers, body, now).event_id == "m"


def test_fingerprint_path_over_an_unpaired_surrogate() -> None:
    source = sources.stripe(secrets=[STRIPE_SECRET], fingerprint_path="data")
    body = json.dumps({"id": "evt_fp", "type": "x", "data": {"note": "\ud800"}}).encode()
    headers = stripe_signed(body)
    now = float(headers["stripe-signature"].split(",")[0][2:])
    assert len(source.verify(headers, body, now).fingerprint) == 32


async def test_heavy_ed25519_verification_leaves_the_loop_free(sqlite_url: str) -> None:
    """16 well-formed ``v1a`` entries (the cap) against 8 keys on a 1 MB body: 128
    verifications, a legitimate but heavy request. They run off the event loop: /healthz
    answers meanwhile in a fraction of the time the heavy requests take."""
    keys = [Ed25519PrivateKey.from_private_bytes(bytes([i]) * 32) for i in range(1, 9)]
    public = ["whpk_" + base64.b64encode(k.public_key().public_bytes_raw()).decode() for k in keys]
    box = Relaybox(settings=Settings(database_url=sqlite_url), clock=SystemClock())
    box.source("many", sources.standard(secrets=public))
    await box.migrate()
    body = json.dumps({"type": "x", "pad": "a" * 999_970}).encode()
    signer = Ed25519PrivateKey.from_private_bytes(bytes(range(1, 33)))
    decoys = " ".join("v1a," + base64.b64encode(signer.sign(b"%d" % i)).decode() for i in range(16))
    headers = {
        "webhook-id": "msg_heavy",
        "webhook-timestamp": str(int(time.time())),
        "webhook-signature": decoys,
    }
    async with Served(box.asgi(roles=("receiver",)), lifespan="on") as server:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
            url = f"{server.url}/webhooks/many"
            health_times: list[float] = []
            done = asyncio.Event()

            async def poll_health() -> None:
                while not done.is_set():
                    started = time.perf_counter()
                    async with http.get(f"{server.url}/healthz") as response:
                        assert response.status == 200, await response.text()
                    health_times.append(time.perf_counter() - started)

            poller = asyncio.create_task(poll_health())
            try:
                heavy = await asyncio.gather(*(post(http, url, body, headers) for _ in range(2)))
            finally:
                done.set()
                await poller
    for status, answer, _ in heavy:
        assert (status, answer["error"]) == (401, "bad_signature"), answer
    fastest = min(elapsed for _, _, elapsed in heavy)
    assert len(health_times) >= 3, (fastest, health_times)
    assert max(health_times) < fastest / 2, (fastest, health_times)


@pytest.mark.parametrize(
    ("declared", "status"),
    [
        ("0" * 5000 + "1", None),
        ("9" * 5000, 413),
        ("\u00b2", 400),
        ("100", None),
        ("101", 413),
        ("0" * 18 + "100", None),  # 21 digits, 3 once the zeros are gone
        ("0" * 18 + "101", 413),
        ("1" + "0" * 18, 413),  # 19 digits
        ("0" * 19, None),
    ],
)
async def test_content_length_is_read_without_exceptions(declared: str, status: int | None) -> None:
    """The HTTP servers in front check Content-Length too; the receiver, mountable in
    any ASGI server, does not rely on it (a 5,000-digit int() is a ValueError)."""

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"x", "more_body": False}

    headers = {"content-length": declared}
    if status is None:
        check_length(headers, 100)
        assert await _read_body(receive, headers, 100) == b"x"
        return
    with pytest.raises(RejectedDelivery) as info:
        check_length(headers, 100)  # what Receiver.open does before the body is read
    assert info.value.status == status


def test_a_long_content_length_is_measured_against_the_limit_itself() -> None:
    """Past 18 digits the length is compared by its digits, against a limit of any size."""
    check_length({"content-length": "000" + "1" + "0" * 19}, 10**21)  # 10**19: under
    with pytest.raises(RejectedDelivery) as info:
        check_length({"content-length": "1" + "0" * 20 + "1"}, 10**21)  # one over
    assert info.value.status == 413


def test_a_bad_value_from_a_header_is_malformed_headers() -> None:
    """Where the value came from decides the code: a header (GitHub's delivery id,
    Shopify's topic) is ``malformed_headers``, a payload field ``malformed_payload``."""
    now = 1_800_000_000.0
    github = sources.github(secrets=["s"])
    body = b'{"action":"opened"}'
    headers = github.sign(body, event_id="d" * 513, event_type="issues", now=now)
    with pytest.raises(RejectedDelivery) as info:
        github.verify(headers, body, now)
    assert (info.value.code, info.value.message) == (
        "malformed_headers",
        "event id is longer than 512 characters",
    )
    body = json.dumps({"action": "opened\ud800"}).encode()
    headers = github.sign(body, event_id="d1", event_type="issues", now=now)
    with pytest.raises(RejectedDelivery) as info:
        github.verify(headers, body, now)
    assert info.value.code == "malformed_payload"
    shopify = sources.shopify(secrets=["s"])
    headers = shopify.sign(b"{}", event_id="e1", event_type="orders/" + "x" * 300, now=now)
    with pytest.raises(RejectedDelivery) as info:
        shopify.verify(headers, b"{}", now)
    assert (info.value.code, info.value.status) == ("malformed_headers", 400)
