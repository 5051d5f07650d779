"""``python -m tests.sim``: run seeds, replay one, shrink a failure, run for hours.

    python -m tests.sim --seed 7 --steps 120 --backend postgres
    python -m tests.sim --seed 7 --steps 120 --replay 5      # the failure rate under replay
    python -m tests.sim --seed 7 --steps 120 --no-shrink
    python -m tests.sim --hours 0.75 --backend sqlite --out sim-sqlite.json

A failing run prints its seed, the step where a checker failed, the shortest prefix of
the schedule that still fails (bisection over the number of steps, each probe a fresh
run) and that prefix's steps. PostgreSQL runs need ``RELAYBOX_TEST_DATABASE_URL`` (a
server on which the run may create and drop a database of its own).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from relaybox.outbound.vault import new_key

# The relaybox processes and this one seal endpoint secrets with the same key.
os.environ.setdefault("RELAYBOX_TEST_SECRETS_KEY", new_key())

from tests.sim.run import Report, simulate
from tests.sim.schedule import describe, schedule

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/postgres"


def _admin(backend: str) -> str | None:
    if backend != "postgres":
        return None
    return os.environ.get("RELAYBOX_TEST_DATABASE_URL", DEFAULT_PG)


async def run_once(seed: int, steps: int, backend: str, *, keep: bool = False) -> Report:
    return await simulate(
        seed, steps, backend=backend, admin_url=_admin(backend), keep=keep, settle_within=45.0
    )


async def shrink(
    seed: int,
    steps: int,
    backend: str,
    checker: str,
    *,
    tries: int = 2,
    say: Callable[[str], None] = print,
) -> int:
    """The smallest ``k`` (by bisection) such that ``schedule(seed, k)`` still breaks
    ``checker``. A probe counts as failing if any of ``tries`` runs fails (the timing
    of real processes varies between runs)."""
    lo, hi = 0, steps  # schedule(seed, hi) fails; assume schedule(seed, lo) passes
    while hi - lo > 1:
        mid = (lo + hi) // 2
        failed = False
        for _ in range(tries):
            report = await run_once(seed, mid, backend)
            if any(v.checker == checker for v in report.violations):
                failed = True
                break
        say(f"  shrink: {mid} steps {'fail' if failed else 'pass'}")
        if failed:
            hi = mid
        else:
            lo = mid
    return hi


def summary(report: Report) -> str:
    faults = ", ".join(f"{k} {v}" for k, v in sorted(report.faults.items())) or "none"
    lines = [
        f"seed {report.seed} ({report.backend}): {report.ran}/{report.steps} steps in"
        f" {report.seconds:.1f} s, {report.events} events, {report.deliveries} deliveries"
        f" ({report.acked} 2xx), {report.webhooks} webhooks received, settled {report.settled}",
        f"  faults: {faults}",
        f"  checks: {sum(report.checks.values())} ({len(report.checks)} checkers)",
        "  observed: " + ", ".join(f"{k} {v}" for k, v in sorted(report.observed.items())),
    ]
    for v in report.violations:
        lines.append(f"  VIOLATION {v.text()}")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> int:
    if args.hours:
        return await long_run(args)
    report = await run_once(args.seed, args.steps, args.backend, keep=True)
    print(summary(report))
    if not report.failed:
        return 0
    first = report.violations[0]
    print(f"FAILED: seed {args.seed}, step {first.step}, checker {first.checker}")
    print(f"  processes' logs: {report.workdir}")
    print(
        f"  replay: python -m tests.sim --seed {args.seed} --steps {args.steps}"
        f" --backend {args.backend}"
    )
    if args.replay:
        fails = 0
        for _ in range(args.replay):
            again = await run_once(args.seed, args.steps, args.backend)
            fails += any(v.checker == first.checker for v in again.violations)
        print(f"  replayed {args.replay} times: {first.checker} failed {fails}/{args.replay}")
    if args.shrink:
        k = await shrink(args.seed, min(args.steps, first.step + 1), args.backend, first.checker)
        print(
            f"  shortest failing prefix: {k} steps (python -m tests.sim --seed {args.seed}"
            f" --steps {k} --backend {args.backend})"
        )
        print(describe(schedule(args.seed, k)))
    return 1


async def long_run(args: argparse.Namespace) -> int:
    """Seeds one after another (from ``--seed``) until ``--hours`` have passed; the
    totals go to ``--out`` as JSON after every run."""
    deadline = time.monotonic() + args.hours * 3600
    totals: dict[str, object] = {}
    faults: Counter[str] = Counter()
    checks: Counter[str] = Counter()
    observed: Counter[str] = Counter()
    runs, steps, events, deliveries, webhooks = 0, 0, 0, 0, 0
    failures: list[dict[str, object]] = []
    seed = args.seed
    began = time.monotonic()
    aborted: list[dict[str, object]] = []
    while time.monotonic() < deadline:
        try:
            report = await run_once(seed, args.steps, args.backend, keep=True)
        except Exception as exc:  # the run could not start (a process not up in time)
            print(f"seed {seed} ({args.backend}): aborted: {type(exc).__name__}: {exc}"[:500])
            aborted.append({"seed": seed, "error": f"{type(exc).__name__}: {exc}"[:500]})
            seed += 1
            continue
        runs += 1
        steps += report.ran
        events += report.events
        deliveries += report.deliveries
        webhooks += report.webhooks
        faults.update(report.faults)
        checks.update(report.checks)
        observed.update(report.observed)
        print(summary(report), flush=True)
        if report.failed:
            failures.append(report.as_dict())
        totals = {
            "backend": args.backend,
            "hours": round((time.monotonic() - began) / 3600, 3),
            "runs": runs,
            "seeds": [args.seed, seed],
            "steps": steps,
            "events": events,
            "deliveries": deliveries,
            "webhooks": webhooks,
            "faults": dict(faults),
            "checks": dict(checks),
            "check_total": sum(checks.values()),
            "observed": dict(observed),
            "violations": sum(len(f["violations"]) for f in failures),  # type: ignore[arg-type,misc]
            "aborted": aborted,
            "failures": failures,
        }
        if args.out:
            await asyncio.to_thread(Path(args.out).write_text, json.dumps(totals, indent=1))
        seed += 1
    print(json.dumps({k: v for k, v in totals.items() if k != "failures"}, indent=1))
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument(
        "--replay", type=int, default=0, help="on failure, run the seed again N times"
    )
    parser.add_argument("--shrink", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--hours", type=float, default=0.0, help="seeds from --seed on, this long")
    parser.add_argument("--out", default="", help="--hours: where the totals go (JSON)")
    args = parser.parse_args(argv)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
