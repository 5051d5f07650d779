"""One event traced from receive to delivered across real processes, exported over
OTLP/HTTP (protobuf) to a receiver in the test that decodes the wire format: the
request that received it, the handler's attempts (the first fails; the process
running the second is SIGKILLed; a new process runs the third), the message it
published, and each delivery attempt (the first answered 500, then 200), joined in one
trace by the ``traceparent`` kept with the inbox row and the message row."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from relaybox import FrozenClock, Relaybox
from relaybox.outbound.signing import sign
from tests.support.otlp import OtlpReceiver, SpanData, render
from tests.support.outbound_app import endpoint, local
from tests.support.procs import Procs, wait_until
from tests.support.receivers import HttpReceiver, Reply
from tests.support.traceapp import SECRET

pytestmark = pytest.mark.slow

SENDER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SENDER_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    yield p
    p.cleanup()


def one(spans: list[SpanData], name: str, **attributes: object) -> SpanData:
    found = [
        s
        for s in spans
        if s.name == name and all(s.attributes.get(k) == v for k, v in attributes.items())
    ]
    assert len(found) == 1, (name, attributes, [(s.name, s.attributes) for s in spans])
    return found[0]


async def test_one_event_is_one_trace_from_receive_to_delivered(
    box: Relaybox, clock: FrozenClock, database_url: str, procs: Procs
) -> None:
    local(box)
    clock.set(time.time())
    with OtlpReceiver() as otlp:
        async with HttpReceiver([Reply(500), Reply(200)]) as hooks:
            await endpoint(box, hooks.url)
            env = {
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": otlp.endpoint,
                "OTEL_SERVICE_NAME": "orders-service",
                "OTEL_BSP_SCHEDULE_DELAY": "50",
                "RELAYBOX_LOG_LEVEL": "info",
            }
            first = await procs.serve(
                database_url,
                app="tests.support.traceapp:box",
                roles="receiver,worker,dispatcher",
                env={**env, "TRACE_HANDLER": "hang"},
                name="serve-1",
                within=60,
            )
            body = json.dumps({"type": "order.paid", "data": {"order": "o1"}}).encode()
            headers = sign(msg_id="evt_1", timestamp=int(time.time()), body=body, secrets=[SECRET])
            headers["content-type"] = "application/json"
            headers["traceparent"] = f"00-{SENDER_TRACE}-{SENDER_SPAN}-01"
            async with (
                aiohttp.ClientSession() as http,
                http.post(first.url + "/webhooks/orders", data=body, headers=headers) as r,
            ):
                assert r.status == 200, await r.text()
                assert (await r.json())["status"] == "accepted"

            # The first attempt failed and its spans went out; the second started (its
            # log line) and hangs: the process dies in the middle of it.
            await otlp.wait_for(
                lambda spans: any(s.attributes.get("relaybox.outcome") == "retry" for s in spans),
                within=60,
                what="the first attempt's outcome",
            )

            async def second_started() -> bool:
                return '"attempt": 2' in first.output()

            await wait_until(second_started, within=60, what="attempt 2", procs=procs)
            first.kill()
            assert first.returncode == -signal.SIGKILL

            await procs.serve(
                database_url,
                app="tests.support.traceapp:box",
                roles="receiver,worker,dispatcher",
                env=env,
                name="serve-2",
                within=60,
            )
            await hooks.wait_for(2, within=60)
            spans = await otlp.wait_for(
                lambda spans: (
                    sum(s.name == "relaybox.deliver" for s in spans) == 2
                    and sum(s.name == "POST" for s in spans) == 2
                ),
                within=60,
                what="both delivery attempts",
            )
    print(render(spans, SENDER_TRACE))
    assert otlp.content_types == {"application/x-protobuf"}
    # One trace, the sender's; but the claims and leases that took rows, each a root
    # linked to the contexts of the rows it took.
    apart = {"relaybox.claim", "relaybox.lease"}
    assert {s.trace_id for s in spans if s.name not in apart} == {SENDER_TRACE}
    claims = [s for s in spans if s.name == "relaybox.claim"]
    assert claims and all(s.links == [(SENDER_TRACE, SENDER_SPAN)] for s in claims)
    assert all(s.trace_id != SENDER_TRACE and s.parent_span_id == "" for s in claims)
    assert {s.service for s in spans} == {"orders-service"}

    # Receive: a server span under the sender's span; verification and the commit
    # under it; the inbox row keeps the sender's context.
    receive = one(spans, "relaybox.receive")
    assert (receive.kind, receive.parent_span_id) == ("server", SENDER_SPAN)
    assert receive.attributes["relaybox.accept.status"] == "accepted"
    assert receive.attributes["relaybox.event_id"] == "evt_1"
    assert receive.attributes["http.response.status_code"] == 200
    assert one(spans, "relaybox.verify").parent_span_id == receive.span_id
    assert one(spans, "relaybox.accept").parent_span_id == receive.span_id

    # Process: attempt 1 (retry, with its delay) in the first process; attempt 2 died
    # with it (its span never ended); attempt 3 in the second process. Each is a child
    # of, and linked to, the context stored with the row.
    process = sorted(
        (s for s in spans if s.name == "relaybox.process"),
        key=lambda s: s.attributes["relaybox.attempt"],
    )
    assert [s.attributes["relaybox.attempt"] for s in process] == [1, 3]
    assert [s.attributes["relaybox.outcome"] for s in process] == ["retry", "done"]
    for s in process:
        assert s.kind == "consumer"
        assert s.parent_span_id == SENDER_SPAN
        assert s.links == [(SENDER_TRACE, SENDER_SPAN)]
    outcomes = {s.parent_span_id: s for s in spans if s.name == "relaybox.outcome"}
    retry = outcomes[process[0].span_id]
    assert retry.attributes["relaybox.outcome"] == "retry"
    assert 0 < retry.attributes["relaybox.retry.delay"] < 10
    assert outcomes[process[1].span_id].attributes["relaybox.outcome"] == "done"

    # Publish: inside the handler's span, one endpoint.
    publish = one(spans, "relaybox.publish")
    assert (publish.kind, publish.parent_span_id) == ("producer", process[1].span_id)
    assert publish.attributes["relaybox.fan_out"] == 1

    # Deliver: each attempt a child of (and linked to) the publish, with its decision;
    # its HTTP request a client span whose context the request carried.
    deliver = sorted(
        (s for s in spans if s.name == "relaybox.deliver"),
        key=lambda s: s.attributes["relaybox.attempt"],
    )
    assert [s.attributes["relaybox.decision"] for s in deliver] == ["retry", "sent"]
    assert deliver[0].attributes["relaybox.retry.delay"] > 0
    for s in deliver:
        assert s.parent_span_id == publish.span_id
        assert s.links == [(SENDER_TRACE, publish.span_id)]
    posts = {s.parent_span_id: s for s in spans if s.name == "POST"}
    for attempt, status, seen in zip(deliver, (500, 200), hooks.requests, strict=True):
        post = posts[attempt.span_id]
        assert post.kind == "client"
        assert post.attributes["http.response.status_code"] == status
        assert post.attributes["url.full"] == hooks.url
        assert seen.headers["traceparent"] == f"00-{SENDER_TRACE}-{post.span_id}-01"
    assert posts[deliver[0].span_id].attributes["error.type"] == "500"
    leases = [s for s in spans if s.name == "relaybox.lease"]
    # One per attempt at least (the retry is leased again; a row leased ahead and
    # given back unstarted is leased once more).
    assert len(leases) >= 2
    assert all(s.links == [(SENDER_TRACE, publish.span_id)] for s in leases)

    # The handler's log lines carry the trace: both processes logged one per attempt.
    lines = [
        json.loads(line)
        for proc in procs.started
        for line in proc.output().splitlines()
        if '"order_paid_handling"' in line
    ]
    by_attempt = {line["attempt"]: line for line in lines}
    assert by_attempt[1]["span_id"] == process[0].span_id
    assert by_attempt[3]["span_id"] == process[1].span_id
    assert {line["trace_id"] for line in lines} == {SENDER_TRACE}
    assert os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") is None  # the test's own: off
