"""The attempt log's headers text (``record_headers``), written without ``json.dumps``
for speed, is exactly what ``json.dumps`` made of the same fields, cut at the same
byte limit (UTF-8 bytes, not characters)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relaybox.outbound.channels.http import record_headers
from tests.support.json_text import mixed, plain


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
