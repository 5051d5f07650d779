"""relaybox.tracing without OpenTelemetry: off, and nothing but that module ever
imports it (these tests need no ``otel`` extra)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from relaybox import tracing

SRC = Path(__file__).resolve().parents[2] / "src" / "relaybox"

GOOD = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_only_the_tracing_module_imports_opentelemetry() -> None:
    importers = set()
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n == "opentelemetry" or n.startswith("opentelemetry.") for n in names):
                importers.add(path.relative_to(SRC).as_posix())
    assert importers == {"tracing.py"}


def test_without_opentelemetry_everything_is_a_no_op() -> None:
    """In a process where ``import opentelemetry`` fails (not installed), whatever
    the environment asks for."""
    code = f"""
import sys
sys.modules["opentelemetry"] = None  # as if not installed: its import raises
from relaybox import tracing
assert not tracing.enabled()
span = tracing.span("relaybox.receive", kind="server", parent={GOOD!r})
assert span is tracing.NO_SPAN
with span as entered:
    entered.set_attribute("a", 1)
    assert not entered.is_recording()
assert tracing.child(span, "x") is tracing.NO_SPAN
assert tracing.traceparent({{"traceparent": {GOOD!r}}}) is None
headers = {{}}
tracing.inject(headers)
assert headers == {{}}
assert tracing.current_ids() is None
assert tracing.structlog_processor(None, "info", {{"event": "x"}}) == {{"event": "x"}}
tracing.record("relaybox.claim", tracing.now_ns(), {{"n": 1}}, [{GOOD!r}])
print("ok")
"""
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/v1/traces"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.strip() == "ok", out.stderr


def test_parse_traceparent_keeps_only_a_valid_version_00_context() -> None:
    assert tracing.parse_traceparent(GOOD) == GOOD
    for bad in (
        None,
        "",
        GOOD.upper(),
        GOOD + "-x",
        "01" + GOOD[2:],
        "ff" + GOOD[2:],
        GOOD[:-1],
        "00-" + "0" * 32 + GOOD[35:],  # trace id all zeros
        GOOD[:36] + "0" * 16 + "-01",  # span id all zeros
        GOOD + "x" * 1000,
    ):
        assert tracing.parse_traceparent(bad) is None, bad
