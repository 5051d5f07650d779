"""The attempt log's headers text (``record_headers``), written without ``json.dumps``
for speed, is exactly what ``json.dumps`` made of the same fields, cut at the same
byte limit (UTF-8 bytes, not characters). What an attempt records holds no credential:
the headers that carry one show ``[redacted]``, and an answer that echoes one has it
cut out (``credential_header``, ``scrub``, the client and the plain HTTP channel
against a real receiver)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relaybox import Relaybox
from relaybox.config import Settings
from relaybox.outbound.channels.http import (
    REDACTED,
    HttpChannel,
    HttpClient,
    credential_header,
    record_headers,
    scrub,
)
from relaybox.outbound.ssrf import Guard
from relaybox.store.outbox_rows import Delivery
from tests.support.json_text import mixed, plain
from tests.support.outbound_app import local
from tests.support.receivers import HttpReceiver, Reply, Seen


def reference(request: list[tuple[str, str]], response: list[tuple[str, str]], limit: int) -> str:
    """The former implementation: fields while their UTF-8 bytes + 4 fit, json.dumps."""

    def bounded(pairs: list[tuple[str, str]]) -> list[list[str]]:
        kept, size = [], 0
        for name, value in pairs:
            size += len(name.encode()) + len(value.encode()) + 4
            if size > limit:
                break
            kept.append([name, value])
        return kept

    return json.dumps({"request": bounded(request), "response": bounded(response)})


REQUEST = [
    ("User-Agent", "relaybox-webhooks/1"),
    ("webhook-id", "msg_1a2b"),
    ("webhook-signature", "v1,K5oZfzN95Z9UVu1E/H+pI4="),
    ("X-Team", 'bl"ue\\ \t\n\x01'),
    ("X-Name", "Zoë → 東京 🚀"),
    ("Content-Type", "application/json"),
]
RESPONSE = [("date", "Fri, 04 Dec 2026 20:00:00 GMT"), ("server", "uvicorn"), ("x-é", "ü")]


@pytest.mark.parametrize("limit", [0, 1, 33, 60, 95, 96, 97, 120, 160, 4096])
def test_the_text_is_json_dumps_of_the_fields_within_the_byte_limit(limit: int) -> None:
    text = record_headers(REQUEST, RESPONSE, limit)
    assert text == reference(REQUEST, RESPONSE, limit)
    parsed = json.loads(text)
    assert set(parsed) == {"request", "response"}


# Fields as attempts have them: lists of printable ASCII without a quote or a
# backslash (joined as they are when the list fits), and lists where characters JSON
# escapes and characters of several UTF-8 bytes are common.
clean = plain(30)
escaped = mixed(30, '"\\\x7f\t\x00é🚀')
fields = st.lists(st.tuples(clean, clean), max_size=8) | st.lists(
    st.tuples(escaped, escaped), max_size=8
)


@given(fields, fields, st.integers(min_value=0, max_value=400), st.integers(-3, 3))
def test_any_fields_at_any_limit_are_json_dumps_within_the_limit(
    request: list[tuple[str, str]], response: list[tuple[str, str]], limit: int, edge: int
) -> None:
    assert record_headers(request, response, limit) == reference(request, response, limit)
    # And a limit at the request's own size, or a few bytes either side.
    size = sum(len(name.encode()) + len(value.encode()) + 4 for name, value in request)
    limit = max(size + edge, 0)
    assert record_headers(request, response, limit) == reference(request, response, limit)


def test_a_multibyte_field_is_counted_in_bytes() -> None:
    # 4 + 1 + 4 bytes ("X", "🚀") = 9: it fits 9, not 8 (as characters it would be 6).
    assert json.loads(record_headers([("X", "🚀")], [], 9))["request"] == [["X", "🚀"]]
    assert json.loads(record_headers([("X", "🚀")], [], 8))["request"] == []


# -- credentials -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["Authorization", "proxy-authorization", "Cookie", "X-Api-Key", "X-API-KEY", "Api_Key",
     "apikey", "X-Auth-Token", "Private-Token", "X-Client-Secret", "X-Password",
     "X-Session-Id", "X-Credentials"],
)  # fmt: skip
def test_a_header_named_as_a_credential_is_one(name: str) -> None:
    assert credential_header(name)


@pytest.mark.parametrize(
    "name",
    ["webhook-id", "webhook-timestamp", "webhook-signature", "webhook-sequence",
     "X-Webhook-Signature", "Content-Type", "Idempotency-Key", "User-Agent", "X-Team",
     "Accept", "X-Key-Id"],
)  # fmt: skip
def test_other_headers_and_the_signatures_are_not(name: str) -> None:
    # A signature is an HMAC (or Ed25519 signature) of one body: no key, it signs
    # nothing else, and it is what a receiver's failed check is debugged with.
    assert not credential_header(name)


TOKEN = "tk_live_0123456789abcdef"


def test_scrub_cuts_a_credential_and_its_part_after_the_scheme() -> None:
    echoed = json.dumps({"authorization": f"Bearer {TOKEN}", "also": TOKEN}).encode()
    cleaned = scrub(echoed, [f"Bearer {TOKEN}"], cut=False)
    assert TOKEN.encode() not in cleaned
    assert json.loads(cleaned) == {"authorization": REDACTED, "also": REDACTED}
    # A short value would cut ordinary words out of the answer: left as it is.
    assert scrub(b'{"mode": "on"}', ["on"], cut=False) == b'{"mode": "on"}'
    assert scrub(b"Basic abc; abc", ["Basic abc"], cut=False) == b"[redacted]; abc"


@pytest.mark.parametrize("kept", [4, 9, len(TOKEN) - 1])
def test_scrub_cuts_the_start_of_a_credential_a_cut_answer_ends_with(kept: int) -> None:
    snippet = b'{"echo": "' + TOKEN[:kept].encode()
    assert scrub(snippet, [TOKEN], cut=True) == b'{"echo": "' + REDACTED.encode()
    # The whole answer (not cut): its end is no start of anything.
    assert scrub(snippet, [TOKEN], cut=False) == snippet


def test_scrub_leaves_a_start_of_under_4_bytes() -> None:
    snippet = b'{"echo": "' + TOKEN[:3].encode()
    assert scrub(snippet, [TOKEN], cut=True) == snippet


def _echo(seen: Seen) -> Reply:
    return Reply(200, json.dumps(seen.headers).encode(), {"Set-Cookie": "sid=s3ss10n-value"})


def _recorded(headers: str | None) -> tuple[dict[str, str], dict[str, str]]:
    assert headers is not None
    found = json.loads(headers)
    return dict(found["request"]), dict(found["response"])


async def test_the_client_redacts_credential_headers_unless_told_which() -> None:
    """Without ``hidden`` the client redacts every header named as a credential; a
    caller that names them (the webhook channel: none of its own) is taken at its
    word. A receiver's Set-Cookie is redacted either way."""
    guard = Guard(allow_insecure_loopback=True, allow_networks=["127.0.0.0/8"])
    client = HttpClient(guard, connect_timeout=1, response_bytes=1024, headers_bytes=4096)
    headers = {"Authorization": f"Bearer {TOKEN}", "X-Api-Key": "ak-0123456789", "X-Team": "b"}
    async with HttpReceiver(_echo) as receiver:
        try:
            found = await client.post(receiver.url, b"{}", headers, seconds=5)
            told = await client.post(receiver.url, b"{}", headers, seconds=5, hidden=["X-Team"])
        finally:
            await client.close()
    assert [seen.headers["authorization"] for seen in receiver.requests] == [f"Bearer {TOKEN}"] * 2
    request, response = _recorded(found.headers)
    assert (request["Authorization"], request["X-Api-Key"]) == (REDACTED, REDACTED)
    assert request["X-Team"] == "b" and response["Set-Cookie"] == REDACTED
    assert found.response is not None
    assert TOKEN not in found.response and "ak-0123456789" not in found.response
    assert json.loads(found.response)["authorization"] == REDACTED
    request, response = _recorded(told.headers)
    assert request == {"User-Agent": "relaybox-webhooks/1", **headers, "X-Team": REDACTED}
    assert response["Set-Cookie"] == REDACTED


async def test_the_http_channel_redacts_the_operator_s_credential_headers(
    tmp_path: Path,
) -> None:
    box = Relaybox(settings=Settings(database_url=f"sqlite:///{tmp_path / 'unused.db'}"))
    channel = HttpChannel(headers={"Authorization": f"Bearer {TOKEN}", "X-Team": "blue"})
    local(box).channel("crm", channel)
    try:
        async with HttpReceiver(_echo) as receiver:
            payload = {"url": receiver.url, "body": {"note": "hello"}}
            delivery = Delivery(1, "crm", "k1", payload, None, 1, 1, False, 5.0)
            result = await channel.deliver(delivery)
            [seen] = receiver.requests
    finally:
        await channel.close()
        await box.close()
    assert seen.headers["authorization"] == f"Bearer {TOKEN}"
    request, _ = _recorded(result.headers)
    assert request["Authorization"] == REDACTED and request["X-Team"] == "blue"
    assert result.response is not None and TOKEN not in result.response
