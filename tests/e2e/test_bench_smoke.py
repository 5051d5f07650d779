"""The benchmark harness as a smoke test: ``python -m bench … --quick`` on the suite's
throwaway PostgreSQL (``BENCH_PG``) exits 0, prints every goal row, and leaves none of
its databases behind. ``bench all --quick`` runs when ``wrk`` is installed; without it
the parts that need no wrk run, and the accept benchmark must say that wrk is missing
(the bench installs nothing)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest
from sqlalchemy.engine import make_url

pytest.importorskip("hookrelay", reason="the bench needs its extra: pip install -e '.[bench]'")
pytest.importorskip("procrastinate", reason="the bench needs its extra: pip install -e '.[bench]'")

ROOT = Path(__file__).resolve().parents[2]


def _admin() -> str:
    url = make_url(os.environ["RELAYBOX_TEST_DATABASE_URL"])
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def _bench(
    args: list[str], env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BENCH_")}
    env["BENCH_PG"] = _admin()
    env.update(extra)
    return env


async def _bench_databases() -> list[str]:
    conn = await asyncpg.connect(_admin())
    try:
        rows = await conn.fetch("SELECT datname FROM pg_database WHERE left(datname, 6) = 'bench_'")
    finally:
        await conn.close()
    return [r[0] for r in rows]


@pytest.mark.timeout(900)  # every bench at its smallest size: ~4 min on two cores
async def test_bench_quick_prints_its_goals_and_leaves_no_databases() -> None:
    before = set(await _bench_databases())
    if shutil.which("wrk"):
        runs = [["all", "--quick"]]
        # accept (2 backends), process (2), dispatch (1), latency (4), slow (3 verdicts)
        goals = 11
    else:
        runs = [[which, "--quick"] for which in ("process", "dispatch", "size", "latency", "slow")]
        goals = 10  # process (2), dispatch (1), latency (4), slow (3 verdicts)
    shown = 0
    for args in runs:
        # 1,000 deliveries (the quick default is 2,000): the suite's time, not a figure.
        done = _bench(args, _env(BENCH_DISPATCH_N="1000"), timeout=600)
        assert done.returncode == 0, (args, done.stdout[-4000:], done.stderr[-4000:])
        shown += done.stdout.count(": met") + done.stdout.count(": MISSED")
        assert "dropped" in done.stdout, done.stdout[-2000:]
        # The VM's speed stamped before and after (times and rates read beside it).
        assert done.stdout.count("CPU reference: 1,000,000 additions") == 2, done.stdout[:500]
        if args[0] == "all":  # the durable floor ran on both databases
            assert done.stdout.count("floor-durable") >= 4, done.stdout[-4000:]
        if args[0] in ("size", "all"):
            assert "all relaybox tables" in done.stdout, done.stdout[-2000:]
    assert shown >= goals, shown
    assert set(await _bench_databases()) == before


async def test_bench_accept_without_wrk_says_so_and_installs_nothing(tmp_path: Path) -> None:
    before = set(await _bench_databases())
    done = _bench(["accept", "--quick"], _env(PATH=str(tmp_path)), timeout=120)
    assert done.returncode != 0
    assert "`wrk` not found" in done.stderr, done.stderr
    assert "apt-get install wrk" in done.stderr
    assert "nothing was measured" in done.stderr
    assert "installing" not in done.stdout + done.stderr
    assert set(await _bench_databases()) == before
