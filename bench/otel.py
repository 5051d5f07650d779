"""The cost of tracing (relaybox.tracing, docs/tracing.md): relaybox's accept (wrk, as
``bench accept`` runs it) and ``relaybox dispatch`` (as ``bench dispatch`` runs it),
each with tracing off (the OpenTelemetry packages installed, no ``OTEL_*``
configuration) and configured to export over OTLP/HTTP with the sampler at 0 %, 1 %
and 100 % (``parentbased_traceidratio``), alternating within each round; medians. The
exporter sends to bench/otlp_sink.py on core 1 (the load generator's and the sink's
core), which answers 200 without decoding. Rates on this shared VM swing with its
load; the server's (the dispatcher's) CPU per 2xx (per delivery), its exporter thread
included, is the steadier figure. First, what a span costs where tracing is off:
``tracing.span()`` entered and left, in a loop."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

from bench.accept import (
    RESIGN_AFTER,
    distinct_sent,
    ensure_wrk,
    make_requests,
    run_wrk,
    setup_peer,
)
from bench.common import ROOT, free_port, median, serve, table
from bench.dispatch import cpu_seconds, run_child

BASE = os.environ.get("BENCH_OTEL_BASE", "")
"""The ``src`` folder of a relaybox without tracing (``git archive <commit> src | tar
-x -C /tmp/base``): adds a mode running it, the same way, against which "off" shows
what the tracing code costs while off. Its databases are migrated by this relaybox
(the columns it adds are nullable: the older code never sees them)."""

MODES: tuple[tuple[str, str | None], ...] = (
    ("off", None),
    ("sampled 0 %", "0"),
    ("sampled 1 %", "0.01"),
    ("sampled 100 %", "1"),
) + ((("before tracing", "base"),) if BASE else ())
if os.environ.get("BENCH_OTEL_ONLY"):  # e.g. "off,before tracing"
    MODES = tuple(m for m in MODES if m[0] in os.environ["BENCH_OTEL_ONLY"].split(","))


def otel_env(ratio: str | None, endpoint: str) -> dict[str, str]:
    """The ``OTEL_*`` environment of a mode; none when off (and for the code before
    tracing, its ``src`` first on the path)."""
    if ratio is None:
        return {}
    if ratio == "base":
        return {"PYTHONPATH": BASE}
    return {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint,
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": ratio,
        "OTEL_SERVICE_NAME": "relaybox-bench",
    }


def span_cost_off() -> float:
    """Nanoseconds for one ``with tracing.span(...)`` where tracing is off."""
    from relaybox import tracing

    for key in [k for k in os.environ if k.startswith("OTEL_")]:
        del os.environ[key]
    tracing.reset()
    assert not tracing.enabled()
    n = 1_000_000
    took = min(
        timeit.repeat(
            "with span('relaybox.accept'): pass", globals={"span": tracing.span}, number=n, repeat=5
        )
    )
    return took / n * 1e9


def main(*, seconds: int = 10, rounds: int = 3, quick: bool = False) -> str:
    if quick:
        seconds, rounds = 2, 1
    ensure_wrk()
    off_ns = span_cost_off()
    print(f"  a span where tracing is off: {off_ns:.0f} ns", flush=True)
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}/v1/traces"
    sink = subprocess.Popen(
        ["taskset", "-c", "1", sys.executable, "-m", "bench.otlp_sink", str(port)], cwd=ROOT
    )
    accept: dict[tuple[str, str], list[dict[str, Any]]] = {}
    dispatch: dict[str, list[dict[str, Any]]] = {}
    n = 2_000 if quick else 20_000
    # "none": the dispatcher alone.
    backends = [
        b
        for b in os.environ.get("BENCH_OTEL_BACKENDS", "postgres,sqlite").split(",")
        if b != "none"
    ]
    try:
        with tempfile.TemporaryDirectory(prefix="relaybox-bench-otel-") as tmpdir:
            tmp = Path(tmpdir)
            reqfile = tmp / "requests.tsv"
            ids = make_requests(reqfile, 30_000 * seconds if not quick else 20_000)
            for run in range(rounds):
                order = MODES if run % 2 == 0 else MODES[::-1]
                signed_at = 0.0
                for backend in backends:
                    for mode, ratio in order:
                        if time.time() - signed_at > RESIGN_AFTER:  # within the tolerance
                            make_requests(reqfile, len(ids))  # the same ids, signed now
                            signed_at = time.time()
                        # A database of its own per run and mode (an SQLite file named
                        # by the run alone would carry one mode's rows into the next).
                        slot = run * len(MODES) + [m for m, _ in MODES].index(mode)
                        env, count_rows = setup_peer("relaybox", backend, tmp, slot)
                        env.update(otel_env(ratio, endpoint))
                        pids: list[int] = []
                        with serve(env, port=free_port(), pids=pids) as url:
                            before = cpu_seconds(pids[0])
                            r = run_wrk(url, reqfile, seconds, 64)
                            spent = cpu_seconds(pids[0]) - before
                        r["cpu_us"] = spent / max(r["ok"], 1) * 1e6
                        r["rows"] = count_rows()
                        r["distinct"] = distinct_sent(ids, r["per_thread"])
                        accept.setdefault((backend, mode), []).append(r)
                        print(
                            f"  accept {backend:8} {mode:13} {r['rate']:8.0f} 2xx/s"
                            f"  {r['cpu_us']:.0f} µs CPU/2xx"
                            f"  p50 {r['p50_ms']:.1f} ms  p99 {r['p99_ms']:.1f} ms"
                            f"  bad {r['bad']}  rows {r['rows']}  distinct {r['distinct']}",
                            flush=True,
                        )
                for mode, ratio in order:
                    options = {"otel": otel_env(ratio, endpoint)}
                    d = run_child("relaybox_run", n, options, "asyncio", "uvicorn")
                    dispatch.setdefault(mode, []).append(d)
                    print(f"  dispatch {mode:13} {d['rate']:8.0f}/s  {d['note']}", flush=True)
    finally:
        sink.kill()
        sink.wait(10)
    rows: list[list[Any]] = []
    for backend in backends:
        if (backend, "off") not in accept:
            continue
        base = median([r["rate"] for r in accept[(backend, "off")]])
        base_cpu = median([r["cpu_us"] for r in accept[(backend, "off")]])
        for mode, _ in MODES:
            runs = accept[(backend, mode)]
            rate, cpu = median([r["rate"] for r in runs]), median([r["cpu_us"] for r in runs])
            rows.append(
                [
                    f"accept, {backend}",
                    mode,
                    " / ".join(f"{r['rate']:.0f}" for r in runs),
                    f"{rate / base:.3f}",
                    " / ".join(f"{r['cpu_us']:.0f}" for r in runs),
                    f"{cpu / base_cpu:.3f}",
                    f"{median([r['p99_ms'] for r in runs]):.1f}",
                ]
            )
    base = median([d["rate"] for d in dispatch["off"]])
    base_cpu = median([d["cpu_us"] for d in dispatch["off"]])
    for mode, _ in MODES if dispatch else ():
        runs = dispatch[mode]
        rate, cpu = median([d["rate"] for d in runs]), median([d["cpu_us"] for d in runs])
        rows.append(
            [
                "dispatch, postgres",
                mode,
                " / ".join(f"{d['rate']:.0f}" for d in runs),
                f"{rate / base:.3f}",
                " / ".join(f"{d['cpu_us']:.0f}" for d in runs),
                f"{cpu / base_cpu:.3f}",
                "",
            ]
        )
    stamp = time.strftime("%H:%M", time.gmtime())
    return table(
        f"tracing: accept (wrk, 64 connections, {seconds} s) and dispatch ({n:,} deliveries),"
        f" {rounds} round(s) alternating, medians (ended {stamp} UTC); a span where"
        f" tracing is off: {off_ns:.0f} ns",
        [
            "path",
            "tracing",
            "rate per run (/s)",
            "rate x off",
            "CPU µs per request or delivery, per run",
            "CPU x off",
            "p99 ms",
        ],
        rows,
    )
