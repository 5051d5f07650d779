"""Real ``relaybox`` processes for fault tests: start, stop, SIGKILL, wait.

Every process runs from the project root (so ``tests.`` and ``examples.`` import),
in its own session, with its output in a log file under the test's ``tmp_path``
(shown when a wait times out). :class:`Procs` remembers what it started; the
fixture that owns it calls :meth:`Procs.cleanup`, which SIGKILLs leftovers by pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import TypeVar

import aiohttp

__all__ = ["FAST_WORKER", "ROOT", "Proc", "Procs", "skewed", "wait_http", "wait_until"]

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]

# Small budgets so a crash, a hold and a retry take a fraction of a second.
FAST_WORKER = {
    "RELAYBOX_WORKER__CLAIM_HOLD": "0.5",
    "RELAYBOX_WORKER__POLL_INTERVAL": "0.1",
    "RELAYBOX_WORKER__MAX_ATTEMPTS": "3",
    "RELAYBOX_WORKER__BACKOFF_BASE": "0.05",
    "RELAYBOX_WORKER__BACKOFF_CAP": "0.2",
    # Several worker processes run at once next to parallel tests: keep each one's
    # connections few, within the server's max_connections (100 by default).
    "RELAYBOX_WORKER__CONCURRENCY": "4",
}


def relaybox_command() -> list[str]:
    script = Path(sys.executable).with_name("relaybox")
    if script.exists():
        return [str(script)]
    found = shutil.which("relaybox")
    if found:
        return [found]
    return [sys.executable, "-c", "from relaybox.cli import main; main()"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """One child process and its log."""

    def __init__(self, name: str, args: list[str], env: Mapping[str, str], log_path: Path) -> None:
        self.name = name
        self.args = args
        self.log_path = log_path
        self.url = ""  # set by Procs.serve
        with log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                args,
                cwd=ROOT,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> int:
        """SIGKILL (no cleanup, no graceful shutdown) and reap."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        return self.popen.wait(10)

    def send_term(self) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)

    def wait(self, within: float) -> int:
        """The exit code; SIGKILL if still running after ``within`` seconds."""
        try:
            return self.popen.wait(within)
        except subprocess.TimeoutExpired:
            return self.kill()

    def terminate(self, within: float = 15.0) -> int:
        """One SIGTERM (the worker finishes what it holds; a second one during its
        shutdown would kill it), then the exit code; SIGKILL after ``within``."""
        self.send_term()
        return self.wait(within)

    async def wait_exit(self, within: float) -> int:
        """The exit code (``-9`` after SIGKILL), waiting at most ``within`` seconds."""
        deadline = time.monotonic() + within
        while self.alive():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} still running after {within} s\n{self.tail()}")
            await asyncio.sleep(0.02)
        return self.popen.wait()

    def output(self) -> str:
        """Everything the process wrote (stdout and stderr) so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def tail(self, lines: int = 30) -> str:
        text = "\n".join(self.output().splitlines()[-lines:])
        return f"--- {self.name} (pid {self.pid}, rc {self.returncode}) ---\n{text}"


class Procs:
    """Starts ``relaybox`` processes for one test; :meth:`cleanup` kills leftovers."""

    def __init__(self, workdir: Path, env: Mapping[str, str] | None = None) -> None:
        self.workdir = workdir
        self.base_env = dict(os.environ if env is None else env)
        # What the test process itself may carry must not reach the children.
        for key in ("FAULT", "FAULT_MARKER", "RELAYBOX_DATABASE_URL", "PYTEST_XDIST_WORKER"):
            self.base_env.pop(key, None)
        self.base_env.update(FAST_WORKER)
        self.base_env["PYTHONUNBUFFERED"] = "1"
        self.started: list[Proc] = []

    def start(self, name: str, args: Iterable[str], env: Mapping[str, str] | None = None) -> Proc:
        full_env = {**self.base_env, **(env or {})}
        n = len(self.started)
        proc = Proc(
            name, [*relaybox_command(), *args], full_env, self.workdir / f"{n:02d}-{name}.log"
        )
        self.started.append(proc)
        return proc

    def worker(
        self,
        database_url: str,
        *,
        app: str = "tests.support.faultapp:box",
        env: Mapping[str, str] | None = None,
        concurrency: int | None = None,
        name: str = "worker",
    ) -> Proc:
        args = ["worker", "--app", app, "--database-url", database_url]
        if concurrency is not None:
            args += ["--concurrency", str(concurrency)]
        return self.start(name, args, env)

    async def serve(
        self,
        database_url: str,
        *,
        roles: str = "receiver,worker",
        app: str = "tests.support.faultapp:box",
        env: Mapping[str, str] | None = None,
        within: float = 20.0,
        name: str = "serve",
    ) -> Proc:
        """``relaybox serve`` on a free port, returned once ``/healthz`` answers 200.
        A port taken between choosing and binding it is retried with another."""
        for _ in range(3):
            port = free_port()
            args = ["serve", "--app", app, "--database-url", database_url]
            args += ["--roles", roles, "--host", "127.0.0.1", "--port", str(port), "--no-migrate"]
            proc = self.start(name, args, env)
            proc.url = f"http://127.0.0.1:{port}"
            try:
                await wait_http(proc.url + "/healthz", within=within, proc=proc)
                return proc
            except ProcessExited:
                if "address already in use" not in proc.tail(200).lower():
                    raise
        raise RuntimeError(f"could not start {name} on a free port")

    @staticmethod
    def stop(*procs: Proc, within: float = 15.0) -> list[int]:
        """SIGTERM to all at once, then their exit codes (SIGKILL after ``within``)."""
        for proc in procs:
            proc.send_term()
        return [proc.wait(within) for proc in procs]

    def cleanup(self) -> None:
        for proc in self.started:
            if proc.alive():
                proc.kill()

    def tails(self) -> str:
        return "\n".join(p.tail() for p in self.started)


class ProcessExited(RuntimeError):
    pass


async def wait_http(url: str, *, within: float = 20.0, proc: Proc | None = None) -> None:
    """Until ``GET url`` answers 200; fails early if ``proc`` exits meanwhile."""
    deadline = time.monotonic() + within
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
        while True:
            if proc is not None and not proc.alive():
                raise ProcessExited(f"{proc.name} exited before {url} answered\n{proc.tail()}")
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, OSError):
                async with http.get(url) as r:
                    if r.status == 200:
                        return
            if time.monotonic() > deadline:
                detail = proc.tail() if proc is not None else ""
                raise TimeoutError(f"{url} not ready after {within} s\n{detail}")
            await asyncio.sleep(0.05)


async def wait_until(
    check: Callable[[], Awaitable[T]],
    *,
    within: float,
    what: str,
    procs: Procs | None = None,
    interval: float = 0.1,
) -> T:
    """Poll ``check()`` until it returns something truthy and return that; on the
    deadline fail with ``what``, the last value and the processes' logs."""
    deadline = time.monotonic() + within
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            logs = procs.tails() if procs is not None else ""
            raise AssertionError(f"timed out after {within} s waiting for {what}\n{logs}")
        await asyncio.sleep(interval)


SKEW_PATH = Path(__file__).resolve().parent / "skewclock"


def skewed(seconds: float, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a process whose host clock is ``seconds`` off
    (``tests/support/skewclock``)."""
    out = dict(env or {})
    path = out.get("PYTHONPATH", os.environ.get("PYTHONPATH"))
    out["PYTHONPATH"] = f"{SKEW_PATH}{os.pathsep}{path}" if path else str(SKEW_PATH)
    out["TEST_CLOCK_SKEW"] = str(seconds)
    return out
