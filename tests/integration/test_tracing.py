"""Tracing in one process (relaybox.tracing): spans exported over OTLP/HTTP to a
receiver in the test (tests/support/otlp.py), the context kept with the rows, the
outbound ``traceparent`` and the per-endpoint switch, log lines, and nothing at all
while tracing is off. Across processes, with a SIGKILL: tests/e2e/test_tracing.py."""

from __future__ import annotations

import io
import json
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import redirect_stderr

import httpx
import pytest
import structlog
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from relaybox import Context, FrozenClock, Relaybox, sources, tracing
from relaybox.log import configure_logging
from relaybox.outbound.signing import sign
from tests.support.otlp import OtlpReceiver, SpanData, render
from tests.support.outbound_app import endpoint, local
from tests.support.receivers import HttpReceiver

SECRET = "whsec_dHJhY2luZy10ZXN0LXNlY3JldC0zMi1ieXRlcyE="


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture
def traced(otlp: OtlpReceiver) -> Iterator[TracerProvider]:
    """relaybox traces with a provider of the test's own, exporting each span as it
    ends over OTLP/HTTP to ``otlp`` (not the process's global provider)."""
    provider = TracerProvider(resource=Resource.create({"service.name": "test"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=otlp.endpoint)))
    tracing.use_provider(provider)
    yield provider
    tracing.use_provider(None)
    provider.shutdown()


@pytest.fixture
async def orders(box: Relaybox, clock: FrozenClock) -> AsyncIterator[Relaybox]:
    """``box`` with an ``orders`` source whose ``order.paid`` handler publishes
    ``order.confirmed`` to tenant t1."""
    clock.set(time.time())
    local(box)
    box.source("orders", sources.standard(secrets=[SECRET]))

    @box.handler("orders", "order.paid")
    async def confirm(ctx: Context) -> None:
        structlog.get_logger("test").info("confirming")
        await box.publish(ctx.conn, "order.confirmed", {"order": 1}, tenant="t1")

    yield box


async def post(box: Relaybox, event_id: str, extra: dict[str, str] | None = None) -> httpx.Response:
    body = json.dumps({"type": "order.paid", "data": {"order": 1}}).encode()
    headers = sign(msg_id=event_id, timestamp=int(box.clock.now()), body=body, secrets=[SECRET])
    headers.update(extra or {})
    transport = httpx.ASGITransport(app=box.receiver)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        return await http.post("/orders", content=body, headers=headers)


async def stored(box: Relaybox) -> tuple[str | None, str | None]:
    [inbox] = await box.store.fetch_all("SELECT traceparent FROM relaybox_inbox")
    [message] = await box.store.fetch_all("SELECT traceparent FROM relaybox_messages")
    return inbox["traceparent"], message["traceparent"]


def context_of(span: SpanData) -> str:
    """The ``traceparent`` naming ``span`` (its flags: sampled, and "random" where the
    SDK sets that bit)."""
    return f"00-{span.trace_id}-{span.span_id}-"


def named(spans: list[SpanData], name: str) -> SpanData:
    [found] = [s for s in spans if s.name == name]
    return found


async def run_through(box: Relaybox, hooks: HttpReceiver) -> None:
    assert await box.worker().run_once() == 1
    dispatcher = box.dispatcher()
    try:
        assert await dispatcher.run_once() == 1
    finally:
        await dispatcher.close()
    await hooks.wait_for(1)


async def test_without_a_sender_traceparent_the_receive_span_is_kept_and_joins_the_trace(
    orders: Relaybox, traced: TracerProvider, otlp: OtlpReceiver
) -> None:
    box = orders
    async with HttpReceiver() as hooks:
        await endpoint(box, hooks.url)
        response = await post(box, "evt_1")
        assert response.json()["status"] == "accepted"
        await run_through(box, hooks)
    spans = otlp.spans
    receive = named(spans, "relaybox.receive")
    assert receive.parent_span_id == ""  # a root: the sender sent no context
    inbox_context, message_context = await stored(box)
    assert inbox_context is not None and inbox_context.startswith(context_of(receive))
    process = named(spans, "relaybox.process")
    assert process.parent_span_id == receive.span_id
    assert process.links == [(receive.trace_id, receive.span_id)]
    publish = named(spans, "relaybox.publish")
    assert message_context is not None and message_context.startswith(context_of(publish))
    deliver = named(spans, "relaybox.deliver")
    assert deliver.links == [(publish.trace_id, publish.span_id)]
    post_span = named(spans, "POST")
    assert hooks.requests[0].headers["traceparent"].startswith(context_of(post_span))
    apart = {"relaybox.claim", "relaybox.lease"}  # roots, linked to what they took
    assert {s.trace_id for s in spans if s.name not in apart} == {receive.trace_id}
    assert named(spans, "relaybox.claim").links == [(receive.trace_id, receive.span_id)]
    assert named(spans, "relaybox.lease").links == [(publish.trace_id, publish.span_id)]
    text = render(spans, receive.trace_id)
    assert text.splitlines()[0].startswith("relaybox.receive [server]")
    assert "relaybox.process [consumer]" in text and "-> linked to relaybox.receive" in text


async def test_attributes_carry_no_payload_no_secret_no_query(
    orders: Relaybox, traced: TracerProvider, otlp: OtlpReceiver
) -> None:
    box = orders
    async with HttpReceiver() as hooks:
        _, secret = await endpoint(box, hooks.url + "?token=hunter2")
        await post(box, "evt_1", {"authorization": "Bearer sender-secret"})
        await run_through(box, hooks)
    wire = json.dumps([[s.name, s.attributes] for s in otlp.spans], default=str)
    for leaked in ("hunter2", "sender-secret", secret, '"order": 1', SECRET):
        assert leaked not in wire
    assert named(otlp.spans, "POST").attributes["url.full"] == hooks.url


@pytest.mark.parametrize(
    "sent",
    [
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",  # upper case
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # zero trace id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" + "x" * 5000,
    ],
)
async def test_a_bad_sender_traceparent_is_not_stored(
    orders: Relaybox, traced: TracerProvider, otlp: OtlpReceiver, sent: str
) -> None:
    response = await post(orders, "evt_1", {"traceparent": sent})
    assert response.status_code == 200
    receive = named(otlp.spans, "relaybox.receive")
    [row] = await orders.store.fetch_all("SELECT traceparent FROM relaybox_inbox")
    assert row["traceparent"].startswith(context_of(receive))


async def test_an_endpoint_may_be_sent_no_traceparent(
    orders: Relaybox, traced: TracerProvider, otlp: OtlpReceiver
) -> None:
    box = orders
    async with HttpReceiver() as hooks:
        await endpoint(box, hooks.url, trace_context=False)
        await post(box, "evt_1")
        await run_through(box, hooks)
    assert "traceparent" not in hooks.requests[0].headers
    assert named(otlp.spans, "POST").attributes["http.response.status_code"] == 200


async def test_log_lines_carry_the_span_they_were_logged_in(
    orders: Relaybox, traced: TracerProvider, otlp: OtlpReceiver
) -> None:
    box = orders
    err = io.StringIO()
    with redirect_stderr(err):
        configure_logging("info", follow_stderr=True)
        try:
            async with HttpReceiver() as hooks:
                await endpoint(box, hooks.url)
                await post(box, "evt_1")
                await run_through(box, hooks)
        finally:
            structlog.reset_defaults()
    [line] = [json.loads(x) for x in err.getvalue().splitlines() if '"confirming"' in x]
    process = named(otlp.spans, "relaybox.process")
    assert (line["trace_id"], line["span_id"]) == (process.trace_id, process.span_id)


async def test_off_nothing_is_exported_stored_or_sent(
    orders: Relaybox, otlp: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No provider of relaybox's or the application's, no OTEL_* asking for one: no
    span, no context stored, no traceparent sent (the sender's stays in the headers
    kept with the row, as every header does)."""
    for key in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    tracing.reset()
    assert not tracing.enabled()
    box = orders
    async with HttpReceiver() as hooks:
        await endpoint(box, hooks.url)
        sent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        await post(box, "evt_1", {"traceparent": sent})
        await run_through(box, hooks)
    assert await stored(box) == (None, None)
    assert "traceparent" not in hooks.requests[0].headers
    assert otlp.requests == 0
    assert tracing.span("x") is tracing.NO_SPAN


def test_the_environment_turns_tracing_on_with_an_otlp_exporter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` alone turns it on (in a child process:
    the global provider can be set once per process)."""
    import subprocess
    import sys

    with OtlpReceiver() as otlp:
        code = (
            "from relaybox import tracing\n"
            "assert tracing.enabled()\n"
            "with tracing.span('relaybox.hello', attributes={'n': 1}): pass\n"
        )
        env = {
            "PATH": "/usr/bin:/bin",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": otlp.endpoint,
            "OTEL_SERVICE_NAME": "from-env",
        }
        subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
        [span] = otlp.spans  # flushed at exit by the batch processor
    assert (span.name, span.service, span.attributes) == ("relaybox.hello", "from-env", {"n": 1})
    assert otlp.content_types == {"application/x-protobuf"}
