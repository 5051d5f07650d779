"""Shared bench plumbing: databases, server processes, tables of ratios."""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
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
from sqlalchemy.engine import make_url

ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN = os.environ.get("BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pg_url(name: str) -> str:
    """``BENCH_PG`` with database ``name`` (its host, port and query kept: a Unix
    socket's ``?host=`` too)."""
    return make_url(PG_ADMIN).set(database=name).render_as_string(hide_password=False)


_OWNER = "BENCH_RUN_ID" not in os.environ
RUN_ID = os.environ.setdefault("BENCH_RUN_ID", f"{os.getpid()}_{secrets.token_hex(3)}")
"""This run's mark: every database it creates is named ``bench_<RUN_ID>_<name>``, so
two runs at once never touch each other's, and :func:`drop_databases` removes exactly
this run's at its end. Child processes inherit it (``BENCH_RUN_ID``); the process that
chose it drops, at its end, every database carrying it, its children's too."""
DB_PREFIX = "bench_"
_created: list[str] = []
_children = False


def children_create_databases() -> None:
    """Note that child processes of this run create databases: the sweep at the end
    looks for theirs too."""
    global _children
    _children = True


def db_name(name: str) -> str:
    """The run-unique name of the database the bench calls ``name``."""
    full = f"{DB_PREFIX}{RUN_ID}_{name.removeprefix(DB_PREFIX)}"
    if len(full) > 63:  # PostgreSQL's identifier limit: a longer name would be cut
        raise ValueError(f"database name too long: {full}")
    return full


def fresh_pg_database(name: str, template: str | None = None) -> str:
    """A new empty database for ``name`` in this run, or a copy of this run's database
    ``template`` (its files: seconds for a million rows). Dropped by
    :func:`drop_databases` (at exit at the latest)."""
    full = db_name(name)
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        if full in _created:  # this run's own earlier copy: a fresh one replaces it
            conn.execute(f'DROP DATABASE IF EXISTS "{full}" WITH (FORCE)')
            _created.remove(full)
        if template is None:
            conn.execute(f'CREATE DATABASE "{full}"')
        else:
            source = db_name(template)
            try:
                conn.execute(f'CREATE DATABASE "{full}" TEMPLATE "{source}" STRATEGY FILE_COPY')
            except psycopg.errors.SyntaxError:  # PostgreSQL before 15 copies files anyway
                conn.execute(f'CREATE DATABASE "{full}" TEMPLATE "{source}"')
        _created.append(full)
    return pg_url(full)


def keep_database(name: str) -> str:
    """Leave this run's database ``name`` in place at exit (its full name)."""
    full = db_name(name)
    if full in _created:
        _created.remove(full)
    return full


def adopt_database(name: str) -> str:
    """A database ``name`` that an earlier run with the same ``BENCH_RUN_ID`` left
    (:func:`keep_database`): its URL, dropped by this run at its end. Raises
    ``SystemExit`` when it is not there."""
    full = db_name(name)
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (full,)).fetchone() is None:
            raise SystemExit(f"bench: no database {full}: seed it first")
    if full not in _created:
        _created.append(full)
    return pg_url(full)


def drop_databases() -> list[str]:
    """Drop every database this run created (its own names only); return them."""
    if not _created and not (_OWNER and _children):
        return []
    prefix = f"{DB_PREFIX}{RUN_ID}_"
    dropped: list[str] = []
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        names = list(reversed(_created))  # copies before their templates
        if _OWNER:  # and those the children left (a child killed before its exit)
            for (name,) in conn.execute(
                "SELECT datname FROM pg_database WHERE left(datname, length(%s)) = %s",
                (prefix, prefix),
            ).fetchall():
                if name not in names:
                    names.append(name)
        for full in names:
            conn.execute(f'DROP DATABASE IF EXISTS "{full}" WITH (FORCE)')
            dropped.append(full)
    _created.clear()
    return dropped


def _drop_at_exit() -> None:
    try:
        dropped = drop_databases()
    except psycopg.OperationalError as exc:  # the server is gone: say what may be left
        print(f"bench: could not drop databases bench_{RUN_ID}_*: {exc}", file=sys.stderr)
        return
    if dropped and _OWNER:
        print(f"bench: dropped {len(dropped)} database(s) bench_{RUN_ID}_*", flush=True)


atexit.register(_drop_at_exit)


class MissingTool(SystemExit):
    """A program the bench runs is not installed: the message says which and how."""


def require_tool(name: str, purpose: str, install: str) -> str:
    """The path of ``name``, or :class:`MissingTool` saying what needs it and how to
    install it. The bench installs nothing itself."""
    path = shutil.which(name)
    if path is None:
        raise MissingTool(
            f"bench: `{name}` not found on PATH; {purpose} needs it. Install it ({install})"
            " and run again; nothing was measured."
        )
    return path


def pg_scalar(url: str, sql: str) -> Any:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(sql)
        if cur.description is None:
            return None
        row = cur.fetchone()
        return row[0] if row else None


@contextmanager
def serve(
    env: dict[str, str], *, port: int, cpu: int | None = 0, pids: list[int] | None = None
) -> Iterator[str]:
    """uvicorn (httptools + uvloop, one process) serving ``bench.apps:app``; its pid
    appended to ``pids`` when given (taskset execs it: the same process)."""
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
    if pids is not None:
        pids.append(proc.pid)
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
def pinned(cpu: int) -> Iterator[None]:
    """Every thread of this process on core ``cpu`` for the block, then back where it
    was: a load generator kept off the core of the server it measures (as ``wrk`` is in
    ``bench accept``), so that where the scheduler puts it does not vary between runs.
    One-process latency, three interleaved pairs: peak 3,653-4,295/s unpinned against
    4,104-4,883/s pinned, p50 alike (bench/README.md)."""
    threads = [int(t) for t in os.listdir("/proc/self/task")]
    before = {t: os.sched_getaffinity(t) for t in threads}
    for t in threads:
        os.sched_setaffinity(t, {cpu})
    try:
        yield
    finally:
        for t, cpus in before.items():
            try:
                os.sched_setaffinity(t, cpus)
            except OSError:  # the thread has ended
                pass


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


def verdict(ratio: float, goal: float, unit: str) -> str:
    """A row's ratio against its goal, e.g. ``0.91 x floor >= 0.85: met``."""
    met = "met" if ratio >= goal else "MISSED"
    return f"{ratio:.2f} {unit} >= {goal:g}: {met}"
