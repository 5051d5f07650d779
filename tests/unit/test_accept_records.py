"""What the receiver writes for every request besides the row: the headers' JSON and
the accept metrics. Both are hand-written for speed, so both are checked against the
library code they replace."""

from __future__ import annotations

import json
import threading

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from relaybox.inbound.receiver import _headers_json
from relaybox.metrics import (
    _DELIVERY_BUCKETS,
    _LATENCY_BUCKETS,
    AcceptTally,
    Metrics,
    status_class,
)
from tests.support.json_text import mixed, plain

# Header names and values as the receiver has them: latin-1 text, any code point < 256.
latin1 = st.text(alphabet=st.characters(max_codepoint=255), max_size=40)


# Printable ASCII without a quote or a backslash, which the receiver joins as it is;
# and the same with characters JSON escapes common.
clean = plain(40)
plainish = mixed(40)


@given(
    st.dictionaries(latin1, latin1, max_size=12)
    | st.dictionaries(clean, clean, max_size=12)
    | st.dictionaries(plainish, plainish, max_size=12)
)
def test_the_headers_json_is_what_json_dumps_writes(headers: dict[str, str]) -> None:
    kept = {
        k: v
        for k, v in headers.items()
        if k not in ("authorization", "cookie", "proxy-authorization")
    }
    assert _headers_json(headers) == json.dumps(kept)


def _samples(registry: CollectorRegistry) -> set[str]:
    """The exposition's sample lines, without the ``_created`` series that only
    prometheus_client's own metrics have."""
    lines = generate_latest(registry).decode().splitlines()
    return {line for line in lines if not line.startswith("#") and "_created" not in line}


@given(
    st.lists(
        st.tuples(
            st.sampled_from([200, 202, 400, 401, 413, 503]),
            st.floats(min_value=0, max_value=30, allow_nan=False)
            | st.sampled_from(_LATENCY_BUCKETS),  # on a bound: counted in its bucket
        ),
        max_size=30,
    )
)
def test_the_tally_exposes_what_a_prometheus_histogram_and_counter_would(
    observations: list[tuple[int, float]],
) -> None:
    ours = CollectorRegistry()
    tally = AcceptTally()
    ours.register(tally)
    theirs = CollectorRegistry()
    seconds = Histogram(
        "relaybox_accept_seconds",
        "Time to answer an inbound delivery, by HTTP status class.",
        ["status_class"],
        registry=theirs,
        buckets=_LATENCY_BUCKETS,
    )
    statuses = Counter(
        "relaybox_inbound_deliveries",
        "Inbound deliveries by HTTP status.",
        ["status"],
        registry=theirs,
    )
    for status, took in observations:
        tally.observe(status, took)
        seconds.labels(f"{status // 100}xx").observe(took)
        statuses.labels(str(status)).inc()
    assert _samples(ours) == _samples(theirs)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["webhook", "http", "sqs"]),
            st.sampled_from([200, 204, 410, 429, 500, None]),
            st.sampled_from([None, "timeout", "refused"]),
            st.floats(min_value=0, max_value=60, allow_nan=False)
            | st.sampled_from(_DELIVERY_BUCKETS),
        ),
        max_size=30,
    )
)
def test_the_delivery_series_are_what_a_prometheus_histogram_and_counter_would_expose(
    observations: list[tuple[str, int | None, str | None, float]],
) -> None:
    ours = Metrics()
    theirs = CollectorRegistry()
    seconds = Histogram(
        "relaybox_delivery_seconds",
        "Duration of one outbound delivery attempt (request sent to answer read), by channel.",
        ["channel", "status_class"],
        registry=theirs,
        buckets=_DELIVERY_BUCKETS,
    )
    results = Counter(
        "relaybox_delivery_results",
        "Outbound delivery attempts by channel and result (2xx…5xx, timeout, network).",
        ["channel", "status_class"],
        registry=theirs,
    )
    for channel, status, error, took in observations:
        ours.observe_delivery(channel, status, took, error=error)
        cls = status_class(status, error)
        seconds.labels(channel, cls).observe(took)
        results.labels(channel, cls).inc()
    delivery = ("relaybox_delivery_seconds", "relaybox_delivery_results")
    mine = {line for line in _samples(ours.registry) if line.startswith(delivery)}
    assert mine == _samples(theirs)


def test_the_tally_loses_no_count_to_threads() -> None:
    """The Django view observes from several threads at once."""
    tally = AcceptTally()
    switch = threading.Barrier(4)

    def observe() -> None:
        switch.wait()
        for _ in range(20_000):
            tally.observe(200, 0.003)

    threads = [threading.Thread(target=observe) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    registry = CollectorRegistry()
    registry.register(tally)
    assert registry.get_sample_value("relaybox_inbound_deliveries_total", {"status": "200"}) == (
        80_000
    )
    assert registry.get_sample_value("relaybox_accept_seconds_count", {"status_class": "2xx"}) == (
        80_000
    )
