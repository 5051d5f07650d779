"""docs/sending.md's table of the tenant API says each call once, with every field an
endpoint takes, and the limits of ``schedule`` the API enforces (they were only in the
OpenAPI document)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from relaybox.outbound.endpoints import EndpointPatch, EndpointSpec

SENDING = (Path(__file__).resolve().parents[2] / "docs" / "sending.md").read_text()


def _rows() -> list[tuple[str, str]]:
    rows = re.findall(r"^\| (`(?:GET|POST|PUT|PATCH|DELETE)[^|]*) \| (.*) \|$", SENDING, re.M)
    return [(call.strip(), what) for call, what in rows]


def test_each_call_is_listed_once() -> None:
    counted = Counter(call for call, _ in _rows())
    assert [call for call, n in counted.items() if n > 1] == []


def test_the_endpoint_row_names_every_field() -> None:
    [what] = [what for call, what in _rows() if call == "`POST /endpoints`"]
    named = set(re.findall(r"`(\w+)`", what))
    # ``events`` is the simple registration API's name (POST /webhooks, its own row).
    assert set(EndpointSpec.model_fields) - {"events"} <= named
    assert set(EndpointPatch.model_fields) <= named


def test_the_schedule_limits_are_the_apis() -> None:
    [limit] = [m.max_length for m in EndpointSpec.model_fields["schedule"].metadata]
    assert f"at most {limit} delays, each 0 s to 7 days" in SENDING
    too_long = {"url": "https://x.example/h", "schedule": [1.0] * (limit + 1)}
    assert not _valid(too_long) and _valid({**too_long, "schedule": [1.0] * limit})
    assert not _valid({"url": "https://x.example/h", "schedule": [7 * 86400 + 1.0]})


def _valid(fields: dict[str, object]) -> bool:
    try:
        EndpointSpec.model_validate(fields)
    except ValueError:
        return False
    return True
