"""docs/operating.md, "Bounded work per request": every limit it quotes is a setting
whose default is the one the code has, and the limits a tenant or a client controls are
all there."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from relaybox.config import Settings
from relaybox.sources import base as source_base

DOC = Path(__file__).resolve().parents[2] / "docs" / "operating.md"
SECTION = "### Bounded work per request"
ROW = re.compile(r"^\| `([a-z_.*]+)` \| ([^|]+) \|")

REQUIRED = {
    "outbound.filter_max_bytes",
    "outbound.filter_max_depth",
    "outbound.filter_max_cost",
    "outbound.filter_tenant_max_cost",
    "outbound.filter_tenant_max_bytes",
    "server.header_timeout",
    "server.body_grace",
    "server.body_min_rate",
    "server.body_timeout",
    "server.max_connections",
    "server.max_connections_per_address",
    "outbound.replay_scan_max",
    "outbound.replay_max",
    "outbound.max_payload",
    "outbound.max_endpoints",
    "outbound.publish_rate",
    "pool_timeout",
    "worker.handler_timeout",
    "idle_in_transaction_timeout",
}


def quoted() -> dict[str, str]:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.index("\n### ", start + len(SECTION))
    rows = {}
    for line in text[start:end].splitlines():
        match = ROW.match(line)
        if match:
            rows[match.group(1)] = match.group(2).strip()
    return rows


def default_of(path: str) -> Any:
    if path.startswith("sources.*."):  # a source option: its default in sources.base
        return getattr(source_base, "DEFAULT_" + path.rsplit(".", 1)[1].upper())
    value: Any = Settings()
    for part in path.split("."):
        value = getattr(value, part)
    return value


def test_the_quoted_defaults_are_the_codes() -> None:
    rows = quoted()
    assert len(rows) >= len(REQUIRED)
    wrong = {
        path: (doc, default_of(path))
        for path, doc in rows.items()
        if float(doc) != float(default_of(path))
    }
    assert not wrong, f"docs/operating.md quotes other defaults than the code: {wrong}"


def test_the_limits_a_tenant_or_client_controls_are_listed() -> None:
    missing = REQUIRED - set(quoted())
    assert not missing, f"docs/operating.md, {SECTION!r}, lacks {sorted(missing)}"
