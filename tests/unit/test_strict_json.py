"""Strict JSON (``relaybox.wire``): what Python's ``json`` reads and writes beyond
RFC 8259 (NaN, Infinity, -Infinity, 1e999) is refused both ways, everything else is
what ``json`` gives; text earlier versions stored with those words still reads."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relaybox.wire import NotJsonNumber, parse_json, stored_json, write_json


@pytest.mark.parametrize(
    "text",
    ["NaN", "Infinity", "-Infinity", "1e999", "-1e999", "1.5e400", '{"a": [1, {"b": NaN}]}',
     b'{"v": Infinity}'],
)  # fmt: skip
def test_parse_json_refuses_numbers_json_has_not(text: str | bytes) -> None:
    with pytest.raises(NotJsonNumber):
        parse_json(text)
    json.loads(text)  # which Python's json reads


@pytest.mark.parametrize(
    "text", ['{"v": 1e308}', "1e-999", "-0.0", "12345678901234567890", '[1.5, "NaN", true]']
)
def test_parse_json_reads_every_json_number_as_json_does(text: str) -> None:
    assert parse_json(text) == json.loads(text)
    assert parse_json(text.encode()) == json.loads(text)


@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")])
def test_write_json_refuses_a_float_json_has_not(number: float) -> None:
    for options in ({}, {"separators": (",", ":"), "ensure_ascii": False}):
        with pytest.raises(NotJsonNumber, match="not JSON numbers"):
            write_json({"v": [1, {"w": number}]}, **options)


def test_write_json_still_raises_what_json_raises_for_the_rest() -> None:
    looped: list[Any] = []
    looped.append(looped)
    with pytest.raises(ValueError, match="Circular") as raised:
        write_json(looped)
    assert not isinstance(raised.value, NotJsonNumber)
    with pytest.raises(TypeError):
        write_json({"v": object()})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)  # fmt: skip


@given(json_values)
def test_any_json_value_is_written_and_read_as_json_does(value: Any) -> None:
    assert write_json(value) == json.dumps(value)
    compact = {"separators": (",", ":"), "ensure_ascii": False}
    assert write_json(value, **compact) == json.dumps(value, **compact)
    assert parse_json(write_json(value)) == json.loads(json.dumps(value))


def test_stored_text_with_nan_reads_as_null() -> None:
    text = '{"data": {"v": NaN, "w": [Infinity, -Infinity, 1.5]}}'
    assert stored_json(text) == {"data": {"v": None, "w": [None, None, 1.5]}}
