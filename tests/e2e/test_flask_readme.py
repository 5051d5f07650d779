"""examples/flask_shop/README.md, walked as a reader walks it: its four shell blocks,
run as they are written, each in a shell of its own (no variable carried from one to
the next), on PostgreSQL. Only the ports (free ones instead of 5000, 8000 and 9000)
and the database URL (a fresh PostgreSQL database for the README's
``sqlite:///flask_shop.db``) are replaced. The Stripe delivery grants the credits the
README shows, and the completed order's webhook reaches the receiver on loopback."""

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
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from tests.conftest import create_pg_database, drop_pg_database
from tests.support.procs import free_port

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "examples" / "flask_shop" / "README.md"
DEFAULT_URL = "sqlite:///flask_shop.db"

pytestmark = pytest.mark.slow


def shell_blocks() -> list[str]:
    return re.findall(r"```sh\n(.*?)```", README.read_text(), flags=re.S)


@pytest.fixture
async def pg() -> AsyncIterator[str]:
    url = await create_pg_database()
    yield url
    await drop_pg_database(url)


def _wait(check: Callable[[], bool], within: float, what: str, logs: Callable[[], str]) -> None:
    deadline = time.monotonic() + within
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} within {within} s\n{logs()}")
        time.sleep(0.2)


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return str(answer.read().decode())
    except OSError:
        return ""


async def test_the_readme_runs_verbatim_on_postgresql(pg: str, tmp_path: Path) -> None:
    blocks = shell_blocks()
    assert len(blocks) == 4, blocks
    ports = {"5000": free_port(), "8000": free_port(), "9000": free_port()}

    def adapt(block: str) -> str:
        block = block.replace(DEFAULT_URL, pg)
        for default, port in ports.items():
            block = re.sub(rf"\b{default}\b", str(port), block)
        return block

    # A reader's shell: the venv's commands first, the project importable, no
    # relaybox or shop variable set beforehand.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RELAYBOX_", "SHOP_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(name: str, block: str) -> Path:
        log = tmp_path / f"{name}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                ["bash", "-c", "set -e\n" + adapt(block)],
                cwd=tmp_path,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started.append((proc, log))
        return log

    def logs() -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}"
                         for _, log in started)  # fmt: skip

    try:
        start("shop", blocks[0])
        _wait(lambda: _listening(ports["5000"]), 60, "the shop listens", logs)
        serve_log = start("serve", blocks[1])
        _wait(lambda: "ok" in _get(f"http://127.0.0.1:{ports['8000']}/healthz").lower()
              or _listening(ports["8000"]), 60, "relaybox serve listens", logs)  # fmt: skip
        banner = serve_log.read_text()
        assert "Development mode (--dev): allowed plain http to loopback" in banner, banner
        assert "relaybox_t_" in banner  # the shell's database, not sqlite:///flask_shop.db
        receiver_log = start("receiver", blocks[2])
        _wait(lambda: _listening(ports["9000"]), 30, "the receiver listens", logs)

        # The fourth shell, one command at a time (after its own exports).
        lines = adapt(blocks[3]).replace("\\\n", " ").splitlines()
        exports = [line for line in lines if line.startswith("export ")]
        for line in lines:
            if line.startswith("export ") or not line.strip():
                continue
            command = "\n".join([*exports, line.split("  #")[0]])

            def run(command: str = command) -> subprocess.CompletedProcess[str]:
                return subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env,
                                      capture_output=True, text=True, timeout=60)  # fmt: skip

            done = run()
            assert done.returncode == 0, (line, done.stdout, done.stderr, logs())
            expected = line.partition("  # ")[2].strip()
            if expected.startswith("{"):  # what the README says it prints, once handled
                _wait(lambda run=run, expected=expected:
                      json.loads(run().stdout or "null") == json.loads(expected),
                      30, f"{line!r} prints {expected}", logs)  # fmt: skip
        _wait(lambda: "type=order.completed" in receiver_log.read_text(), 30,
              "the receiver gets order.completed", logs)  # fmt: skip
        assert "POST /hook webhook-id=msg_" in receiver_log.read_text()
    finally:
        for proc, _ in started:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc, _ in started:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
