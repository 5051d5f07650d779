"""Walking an example's README as a reader does: its ``sh`` blocks run as written, each
in a shell of its own (no variable carried from one to the next), with only ports and
the database URL replaced (tests/e2e/test_flask_readme.py, test_fastapi_readme.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

__all__ = ["Shells", "listening", "shell_blocks", "wait_for"]

ROOT = Path(__file__).resolve().parents[2]


def shell_blocks(readme: Path) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", readme.read_text(), flags=re.S)


def wait_for(check: Callable[[], bool], within: float, what: str, logs: Callable[[], str]) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {within} s\n{logs()}")
        time.sleep(0.2)


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return str(answer.read().decode())
    except OSError:
        return ""


class Shells:
    """A reader's shells in ``cwd``: the venv's commands first on ``PATH``, the project
    importable, no relaybox or shop variable set beforehand. ``replace`` maps what the
    README says (a port, a database URL) to what the test uses."""

    def __init__(self, cwd: Path, replace: dict[str, str]) -> None:
        self.cwd = cwd
        self.replace = replace
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RELAYBOX_", "SHOP_"))}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env["PYTHONPATH"] = str(ROOT)
        env["PYTHONUNBUFFERED"] = "1"
        self.env = env
        self.started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def adapt(self, block: str) -> str:
        for said, used in self.replace.items():
            block = re.sub(rf"(?<![\w.]){re.escape(said)}(?![\w])", used, block)
        return block

    def start(self, name: str, block: str) -> Path:
        """A long-running block (a server) in a shell of its own; its output's file."""
        log = self.cwd / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                ["bash", "-c", "set -e\n" + self.adapt(block)],
                cwd=self.cwd,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started.append((proc, log))
        return log

    def logs(self) -> str:
        return "\n".join(
            f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}" for _, log in self.started
        )

    def run_lines(self, block: str) -> None:
        """A block of commands, one at a time, each after the block's own ``export``
        lines: each must succeed, and a command whose comment shows JSON must print it
        (once the work behind it is done: tried again for up to 30 s)."""
        lines = self.adapt(block).replace("\\\n", " ").splitlines()
        exports = [line for line in lines if line.startswith("export ")]
        for line in lines:
            if line.startswith(("export ", "#")) or not line.strip():
                continue
            command = "\n".join([*exports, line.split("  #")[0]])

            def run(command: str = command) -> subprocess.CompletedProcess[str]:
                return subprocess.run(
                    ["bash", "-c", command],
                    cwd=self.cwd,
                    env=self.env,
                    capture_output=True,
                    text=True,
                    timeout=60,
                )

            done = run()
            assert done.returncode == 0, (line, done.stdout, done.stderr, self.logs())
            expected = line.partition("  # ")[2].strip()
            if expected.startswith("{"):  # what the README says it prints, once handled
                wait_for(
                    lambda run=run, expected=expected: (
                        json.loads(run().stdout or "null") == json.loads(expected)
                    ),
                    30,
                    f"{line!r} prints {expected}",
                    self.logs,
                )

    def stop(self) -> None:
        for proc, _ in self.started:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc, _ in self.started:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
