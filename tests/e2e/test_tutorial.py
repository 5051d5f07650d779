"""The tutorial (docs/tutorial/) as a reader follows it, in real processes: the first
page's ``app.py`` served by its ``uvicorn`` line, then every ``relaybox`` command of
the first and third pages in order, with the third page's handler added to ``app.py``
and the app restarted where the page says so. Each command must exit 0, and the
database must end as the pages say (one invoice recorded, nothing dead). The second
page is Python only: tests/integration/test_docs.py runs it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shlex
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port
from tests.e2e.test_embedding import BIN, _is, clean_env, http_status, server, wait_for
from tests.support.procs import ROOT

TUTORIAL = ROOT / "docs" / "tutorial"


def fenced(page: str) -> list[tuple[str, str]]:
    """The page's fenced blocks, in order: (language, text)."""
    body = (TUTORIAL / page).read_text(encoding="utf-8")
    return re.findall(r"^```(\w+)\n(.*?)^```$", body, flags=re.S | re.M)


def lines(block: str) -> list[str]:
    return [ln for ln in block.splitlines() if ln.strip() and not ln.startswith("#")]


def command(line: str, port: int) -> list[str]:
    """A command line of the page as the shell splits it, run from the venv (as an
    activated venv would) on ``port`` instead of 8000; a trailing comment dropped."""
    words = shlex.split(line.split("  #", 1)[0].replace("8000", str(port)))
    return [str(BIN / words[0]), *words[1:]]


async def run(line: str, port: int, cwd: Path) -> str:
    done = await asyncio.to_thread(
        subprocess.run,
        command(line, port),
        cwd=cwd,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, f"{line}\n{done.stdout}{done.stderr}"
    return done.stdout


@pytest.mark.slow
async def test_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    receive, operate = fenced("receive.md"), fenced("operate.md")
    [app_code] = [text for lang, text in receive if lang == "python"]
    (tmp_path / "app.py").write_text(app_code, encoding="utf-8")
    port = free_port()
    outputs: list[str] = []
    with contextlib.ExitStack() as stack:  # the app's server, while it runs

        async def start(line: str) -> None:
            args = command(line, port)
            proc = stack.enter_context(server(args, tmp_path, clean_env(), tmp_path / "app.log"))
            await wait_for(
                lambda: _is(http_status(f"http://127.0.0.1:{port}/docs"), 200),
                within=30,
                what="uvicorn serving app:app",
                proc=proc,
            )

        async def settled() -> dict[str, Any] | None:  # the worker ran what is pending
            out = await run("relaybox stats --json --app app:box", port, tmp_path)
            found: dict[str, Any] = json.loads(out)
            return found if found["pending"] == 0 else None

        async def stop() -> None:
            await asyncio.to_thread(stack.close)  # SIGTERM, and wait for its exit

        for lang, text in receive + operate:
            if lang == "python" and text != app_code:  # the page's addition to app.py
                with (tmp_path / "app.py").open("a", encoding="utf-8") as app:
                    app.write("\n\n" + text)
                continue
            if lang != "sh":
                continue
            for line in lines(text):
                if line.startswith("uvicorn "):
                    await stop()
                    await start(line)
                elif line.startswith("relaybox "):
                    outputs.append(await run(line, port, tmp_path))
                    if line.startswith("relaybox send-test"):
                        assert '"status": "accepted"' in outputs[-1], outputs[-1]
                        await wait_for(settled, within=30, what="the handler of that event")
        stats = await wait_for(settled, within=30, what="the replayed events to finish")
        await stop()
    assert len(outputs) >= 8, outputs  # the pages' commands all ran
    assert stats["done"] == 2 and stats["dead"] == 0 and stats["pending"] == 0, stats
    with contextlib.closing(sqlite3.connect(tmp_path / "app.db")) as db:
        assert db.execute("SELECT count(*) FROM paid").fetchone() == (1,)  # replayed: still one
    log = (tmp_path / "app.log").read_text(errors="replace")
    assert "new customer" in log, log[-3000:]  # the added handler ran in the restarted app
    assert "Traceback" not in log, log[-3000:]
