"""Shared bench plumbing: databases, server processes, tables of ratios."""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg  # procrastinate's driver, installed with the bench extra

ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pg_url(name: str) -> str:
    base, _, _ = PG_ADMIN.rpartition("/")
    return f"{base}/{name}"


def fresh_pg_database(name: str, template: str | None = None) -> str:
    """An empty database ``name``, or a copy of database ``template`` (its files:
    seconds for a million rows), replacing any database of that name."""
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if template is None:
            conn.execute(f'CREATE DATABASE "{name}"')
        else:
            try:
                conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}" STRATEGY FILE_COPY')
            except psycopg.errors.SyntaxError:  # PostgreSQL before 15 copies files anyway
                conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return pg_url(name)


def pg_scalar(url: str, sql: str) -> Any:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(sql)
        if cur.description is None:
            return None
        row = cur.fetchone()
        return row[0] if row else None


@contextmanager
def serve(env: dict[str, str], *, port: int, cpu: int | None = 0) -> Iterator[str]:
    """uvicorn (httptools + uvloop, one process) serving ``bench.apps:app``."""
    cmd = [
        sys.executable,
        "-m",
        "uvicorn",
        "bench.apps:app",
        "--factory",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--no-access-log",
        "--http",
        "httptools",
        "--loop",
        "uvloop",
    ]
    if cpu is not None:
        cmd = ["taskset", "-c", str(cpu), *cmd]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **env})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 30
        while True:
            try:
                urllib.request.urlopen(url + "/webhooks/bench", timeout=1)
            except urllib.error.HTTPError:
                break  # it answered (405/401): up
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"server {env.get('BENCH_APP')} did not start") from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def fsync_probe(directory: Path, every: float = 0.02) -> Iterator[dict[str, float]]:
    """The disk's own flush latency while the body runs: a thread writes 8 KiB to a file
    in ``directory`` and times ``fdatasync`` every ``every`` seconds. The result (filled
    on exit) holds the p50, p99 and max in ms. A durable accept waits for a flush, so
    its tail can be no better than the disk's (this VM's disk stalled flushes for up
    to 345 ms under the accept's write load, 2026-12-01)."""
    stats: dict[str, float] = {}
    times: list[float] = []
    stop = threading.Event()
    path = directory / "fsync-probe"

    def probe() -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            while not stop.wait(every):
                os.pwrite(fd, b"x" * 8192, 0)
                started = time.perf_counter()
                os.fdatasync(fd)
                times.append((time.perf_counter() - started) * 1000)
        finally:
            os.close(fd)
            path.unlink(missing_ok=True)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    try:
        yield stats
    finally:
        stop.set()
        thread.join()
        if times:
            times.sort()
            stats.update(p50=times[len(times) // 2], p99=times[int(len(times) * 0.99)],
                         max=times[-1])  # fmt: skip


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [list(map(str, header))] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = [title, "  ".join(h.ljust(w) for h, w in zip(cells[0], widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    for r in cells[1:]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}" if value < 100 else f"{value:,.0f}"
    return str(value)


def merged(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Rounds of one runner as one row: the median rate, the last round's note and, when
    there were several, every round's rate."""
    rate = statistics.median(r["rate"] for r in runs)
    note = runs[-1]["note"]
    if len(runs) > 1:
        note += " (rounds: " + ", ".join(f"{r['rate']:,.0f}" for r in runs) + "/s)"
    return {"rate": rate, "note": note}
