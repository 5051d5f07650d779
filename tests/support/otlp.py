"""An OTLP/HTTP trace receiver for tests: a real HTTP server on a free port that
decodes what exporters send (``POST /v1/traces``, protobuf) with the protocol's own
definitions (``opentelemetry-proto``), and keeps the spans.

It runs in a thread of its own, not on the test's event loop: an exporter in the test
process flushes from a thread while the loop may be waiting for it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

__all__ = ["OtlpReceiver", "SpanData", "render"]

_KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass(frozen=True)
class SpanData:
    """One span as the wire carried it (ids as hex)."""

    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    links: list[tuple[str, str]]  # (trace id, span id)
    service: str
    start: int
    end: int
    status: int = 0
    events: list[str] = field(default_factory=list)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def decode(body: bytes) -> list[SpanData]:
    """The spans of an ``ExportTraceServiceRequest`` in protobuf."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                spans.append(
                    SpanData(
                        name=s.name,
                        kind=_KINDS[s.kind],
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex(),
                        attributes={a.key: _value(a.value) for a in s.attributes},
                        links=[(link.trace_id.hex(), link.span_id.hex()) for link in s.links],
                        service=str(resource.get("service.name", "")),
                        start=s.start_time_unix_nano,
                        end=s.end_time_unix_nano,
                        status=s.status.code,
                        events=[e.name for e in s.events],
                    )
                )
    return spans


class OtlpReceiver:
    """``with OtlpReceiver() as otlp``: ``otlp.endpoint`` is the traces URL to give an
    exporter (``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``); ``otlp.spans`` what arrived."""

    def __init__(self) -> None:
        self.spans: list[SpanData] = []
        self.requests = 0
        self.content_types: set[str] = set()
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                spans = decode(body)
                with receiver._lock:
                    receiver.spans.extend(spans)
                    receiver.requests += 1
                    receiver.content_types.add(self.headers.get("content-type", ""))
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def named(self, name: str) -> list[SpanData]:
        with self._lock:
            return [s for s in self.spans if s.name == name]

    async def wait_for(
        self, check: Callable[[list[SpanData]], bool], *, within: float, what: str
    ) -> list[SpanData]:
        """Until ``check(spans)`` holds; the spans then."""
        deadline = time.monotonic() + within
        while True:
            with self._lock:
                spans = list(self.spans)
            if check(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted(s.name for s in spans)
                raise TimeoutError(f"{what}: not after {within} s; spans so far: {names}")
            await asyncio.sleep(0.05)


def render(spans: list[SpanData], trace_id: str) -> str:
    """One trace as indented text: each span under its parent (or, for a span whose
    parent is not among them, at the top), in start order, with its kind, service and
    a few attributes; a link shown as ``-> linked to <span name>``."""
    mine = sorted((s for s in spans if s.trace_id == trace_id), key=lambda s: s.start)
    by_id = {s.span_id: s for s in mine}
    children: dict[str, list[SpanData]] = {}
    for s in mine:
        parent = s.parent_span_id if s.parent_span_id in by_id else ""
        children.setdefault(parent, []).append(s)
    shown = (
        "relaybox.source",
        "relaybox.accept.status",
        "relaybox.attempt",
        "relaybox.outcome",
        "relaybox.retry.delay",
        "relaybox.fan_out",
        "relaybox.decision",
        "http.response.status_code",
    )
    lines: list[str] = []

    def walk(parent: str, depth: int) -> None:
        for s in children.get(parent, []):
            attrs = " ".join(
                f"{k.split('.', 1)[1]}={s.attributes[k]}" for k in shown if k in s.attributes
            )
            line = f"{'  ' * depth}{s.name} [{s.kind}] {attrs}".rstrip()
            linked = [by_id[span].name for _, span in s.links if span in by_id]
            if linked:
                line += f"  -> linked to {', '.join(linked)}"
            lines.append(line)
            walk(s.span_id, depth + 1)

    walk("", 0)
    return "\n".join(lines)
