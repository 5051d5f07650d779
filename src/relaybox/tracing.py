"""OpenTelemetry tracing, optional: ``pip install "relaybox[otel]"``.

The only module of relaybox that imports ``opentelemetry``. Tracing is on when the
OpenTelemetry API is installed and either the application set an SDK tracer provider
of its own (``trace.set_tracer_provider``) or the standard environment variables ask
for an exporter (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``
or ``OTEL_TRACES_EXPORTER=otlp``; relaybox then builds the SDK's provider, which reads
``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``,
``OTEL_BSP_*`` and the exporter's own variables). ``OTEL_SDK_DISABLED=true`` turns it
off. Otherwise every call here is a no-op costing a function call: :func:`span` hands
back one shared object that does nothing.

The context crosses the database as a W3C ``traceparent`` string (:func:`traceparent`,
stored with the inbox row and the message row): the span of a later process (the
handler's, each delivery attempt's) has it as its parent and as a link, so that a
trace backend shows one trace from the request that received an event to the
deliveries its handler published, however many processes, retries and restarts lie
between. Attributes are bounded: names, ids and counts, never a payload or a secret.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

__all__ = [
    "NO_SPAN",
    "TRACEPARENT",
    "child",
    "current_ids",
    "current_span",
    "enabled",
    "inject",
    "now_ns",
    "parse_traceparent",
    "record",
    "reset",
    "span",
    "structlog_processor",
    "traceparent",
    "use_provider",
]

TRACEPARENT = re.compile(r"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
"""A W3C trace context ``traceparent`` of version 00 (55 characters) as relaybox
stores it; other versions and invalid ids are not stored."""

Attributes = Mapping[str, str | bool | int | float]

_UNSET: Any = object()
_tracer: Any = _UNSET  # an opentelemetry Tracer, None when off, _UNSET before first use


class _NoSpan:
    """The span handed out when tracing is off: a context manager doing nothing."""

    __slots__ = ()

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def set_attribute(self, key: str, value: object) -> None:
        return None

    def set_attributes(self, attributes: Attributes) -> None:
        return None

    def is_recording(self) -> bool:
        return False


NO_SPAN = _NoSpan()


def _env_wants_export() -> bool:
    env = os.environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none":
        return False
    return bool(
        exporter
        or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def _resolve() -> Any:
    """The tracer, or ``None``: decided once per process (:func:`reset` for tests)."""
    global _tracer
    try:
        from opentelemetry import trace
    except ImportError:
        _tracer = None
        return None
    provider = trace.get_tracer_provider()
    if not _is_sdk(provider):
        if not _env_wants_export():
            _tracer = None
            return None
        try:
            provider = _sdk_provider()
        except ImportError:  # the API without the SDK and exporter: nothing to export to
            _tracer = None
            return None
        trace.set_tracer_provider(provider)
        provider = trace.get_tracer_provider()
    _tracer = provider.get_tracer("relaybox")
    _kinds()
    return _tracer


def _kinds() -> None:
    from opentelemetry.trace import SpanKind

    _KINDS.update((kind.name.lower(), kind) for kind in SpanKind)


def _is_sdk(provider: Any) -> bool:
    """Whether ``provider`` records spans: the SDK's (or another real one), not the
    API's default proxy or no-op provider."""
    name = type(provider).__name__
    return name not in {"ProxyTracerProvider", "NoOpTracerProvider"}


def _sdk_provider() -> Any:
    """The SDK's provider for the ``OTEL_*`` environment: its resource, sampler and
    batch processor from there, exporting over OTLP/HTTP (protobuf) unless
    ``OTEL_TRACES_EXPORTER`` names ``console``."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

    resource = Resource.create(
        {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "relaybox"}
    )
    provider = TracerProvider(resource=resource)
    exporter: SpanExporter
    if os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        exporter = ConsoleSpanExporter()
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def enabled() -> bool:
    """Whether spans are made in this process."""
    tracer = _tracer if _tracer is not _UNSET else _resolve()
    return tracer is not None


def use_provider(provider: Any) -> None:
    """Trace with ``provider`` (an SDK ``TracerProvider``) rather than the global one,
    from now on; ``None``: decide again from the global provider and the environment."""
    global _tracer
    _tracer = _UNSET if provider is None else provider.get_tracer("relaybox")
    if provider is not None:
        _kinds()


def reset() -> None:
    """Decide again at the next span whether tracing is on (after a test changed the
    environment or the global provider)."""
    global _tracer
    _tracer = _UNSET


def span(
    name: str,
    *,
    kind: str = "internal",
    attributes: Attributes | None = None,
    parent: str | None = None,
    link: bool = True,
    headers: Mapping[str, str] | None = None,
) -> AbstractContextManager[Any]:
    """A span around a ``with`` block, current within it (a span started inside is its
    child). ``kind``: internal, server, client, producer or consumer. ``parent``: a
    stored ``traceparent``: the span is its child and, with ``link``, links to it (a
    context that came through the database: the messaging conventions' creation
    context). ``headers``: a request's headers, whose trace context (the
    configured propagators: ``traceparent`` by default) becomes the parent. Off: one
    shared object doing nothing."""
    tracer = _tracer if _tracer is not _UNSET else _resolve()
    if tracer is None:
        return NO_SPAN
    return _span(tracer, name, kind, attributes, parent, link, headers)


def _span(
    tracer: Any,
    name: str,
    kind: str,
    attributes: Attributes | None,
    parent: str | None,
    link: bool,
    headers: Mapping[str, str] | None,
) -> AbstractContextManager[Any]:
    """The SDK's own context manager for the span (no second layer of ours)."""
    from opentelemetry import propagate, trace

    context = None
    links: Sequence[Any] = ()
    if parent is not None:
        stored = _span_context(parent)
        if stored is not None:
            context = trace.set_span_in_context(trace.NonRecordingSpan(stored))
            if link:
                links = (trace.Link(stored, {"relaybox.link": "stored"}),)
    elif headers is not None and "traceparent" in headers:
        context = propagate.extract(headers)
    manager: AbstractContextManager[Any] = tracer.start_as_current_span(
        name, context=context, kind=_KINDS[kind], attributes=attributes, links=links
    )
    return manager


_KINDS: dict[str, Any] = {}
"""Span kinds by name, filled by :func:`_resolve` when tracing is on."""


def child(
    parent: Any, name: str, attributes: Attributes | None = None
) -> AbstractContextManager[Any]:
    """:func:`span` ``name`` when ``parent`` records (it was sampled), else the no-op:
    a hot path whose span is :data:`NO_SPAN` or was not sampled makes no span object
    below it (its children would not be sampled either)."""
    if isinstance(parent, _NoSpan) or not parent.is_recording():
        return NO_SPAN
    return span(name, attributes=attributes)


def now_ns() -> int:
    """A span's clock (for :func:`record`): nanoseconds since the epoch."""
    return time.time_ns()


def record(
    name: str,
    started_ns: int,
    attributes: Attributes,
    links: Iterable[str | None] = (),
    *,
    most_links: int = 128,
) -> None:
    """A span that began at ``started_ns`` and ends now, made after the fact: for work
    worth a span only when it found something (a claim, a lease that took rows),
    linked to the stored contexts of what it found (at most ``most_links``). A root of
    its own trace: it serves many."""
    tracer = _tracer if _tracer is not _UNSET else _resolve()
    if tracer is None:
        return
    from opentelemetry import context, trace

    found = []
    for text in links:
        stored = _span_context(text) if text else None
        if stored is not None:
            found.append(trace.Link(stored))
            if len(found) >= most_links:
                break
    span = tracer.start_span(
        name,
        context=context.Context(),  # a root, whatever is current
        attributes=attributes,
        links=found,
        start_time=started_ns,
    )
    span.end()


def _span_context(text: str) -> Any:
    """The remote span context a stored ``traceparent`` names, ``None`` if invalid."""
    from opentelemetry import trace

    if not TRACEPARENT.fullmatch(text):
        return None
    _, trace_id, span_id, flags = text.split("-")
    return trace.SpanContext(
        int(trace_id, 16),
        int(span_id, 16),
        is_remote=True,
        trace_flags=trace.TraceFlags(int(flags, 16) & 1),
    )


def parse_traceparent(value: str | None) -> str | None:
    """``value`` if it is a ``traceparent`` relaybox stores (version 00, ids not all
    zero, 55 characters, lower-case hex), else ``None``."""
    if value is None or len(value) != 55 or not TRACEPARENT.fullmatch(value):
        return None
    return value


def traceparent(headers: Mapping[str, str] | None = None) -> str | None:
    """The context to store with a row: the ``traceparent`` a sender sent in
    ``headers`` when valid, else the current span's; ``None`` when tracing is off or
    no span is current."""
    tracer = _tracer if _tracer is not _UNSET else _resolve()
    if tracer is None:
        return None
    if headers is not None:
        sent = parse_traceparent(headers.get("traceparent"))
        if sent is not None:
            return sent
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def current_span() -> Any:
    """The current span (to add attributes to), or a no-op one."""
    tracer = _tracer if _tracer is not _UNSET else _resolve()
    if tracer is None:
        return NO_SPAN
    from opentelemetry import trace

    return trace.get_current_span()


def inject(headers: MutableMapping[str, str]) -> None:
    """Add the current span's context to outgoing request ``headers`` (the configured
    propagators: ``traceparent``, and ``tracestate`` when there is one)."""
    tracer = _tracer if _tracer is not _UNSET else _resolve()
    if tracer is None:
        return
    from opentelemetry import propagate

    propagate.inject(headers)


def current_ids() -> tuple[str, str] | None:
    """The current span's trace id and span id as hex, ``None`` without one."""
    tracer = _tracer if _tracer is not _UNSET else _resolve()
    if tracer is None:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def structlog_processor(
    logger: object, method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """A structlog processor adding ``trace_id`` and ``span_id`` to a log line logged
    while a span is current."""
    ids = current_ids()
    if ids is not None:
        event.setdefault("trace_id", ids[0])
        event.setdefault("span_id", ids[1])
    return event
