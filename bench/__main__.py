"""python -m bench accept|process|dispatch|growth|size|latency|slow|filters|replay|erase|otel|
retention|partitions|
all [--quick]
[--seconds N]"""

from __future__ import annotations

import argparse
import datetime
import platform
import time


def cpu_reference(additions: int = 10_000_000) -> float:
    """Seconds a plain Python loop takes for ``additions`` additions: the VM's speed of
    the moment. This VM has run the same code three times slower for hours (a floor of
    6,500/s where it had run 20,000/s); a table's ratios hold within a run, its times
    and rates only beside runs of about the same reference."""
    started = time.perf_counter()
    total = 0
    for i in range(additions):
        total += i
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument(
        "which",
        choices=(
            "accept process dispatch growth size latency slow filters replay erase otel "
            "retention partitions all"
        ).split(),
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternating rounds of accept and growth"
    )
    parser.add_argument(
        "--rows",
        type=int,
        default=None,
        help="erase: inbox rows to fill (default 1,000,000); partitions: events to expire",
    )
    parser.add_argument(
        "--migrate",
        action="store_true",
        help="partitions: the live migration of --rows events under load (default 1,000,000)",
    )
    parser.add_argument(
        "--sending",
        action="store_true",
        help="partitions: expire --rows sent messages (the sending side) instead of events",
    )
    args = parser.parse_args()
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"relaybox bench, {stamp}, {platform.node()}, {platform.python_version()}")
    additions = 1_000_000 if args.quick else 10_000_000
    before = cpu_reference(additions)
    print(f"CPU reference: {additions:,} additions in a Python loop: {before:.2f} s", flush=True)
    from bench.common import RUN_ID, MissingTool, drop_databases

    skipped = ""
    if args.which == "all":
        from bench.accept import ensure_wrk

        try:
            ensure_wrk()
        except MissingTool as exc:
            # Everything else still runs; the run then ends with status 3, not 0.
            skipped = f"{exc} (accept and growth skipped)"
            print(skipped, flush=True)
    tables = []
    if args.which == "accept" or (args.which == "all" and not skipped):
        from bench import accept

        tables.append(accept.main(seconds=args.seconds, rounds=args.rounds, quick=args.quick))
    if args.which in ("process", "all"):
        from bench import process

        tables.append(process.main(quick=args.quick))
    if args.which in ("dispatch", "all"):
        from bench import dispatch

        tables.append(dispatch.main(quick=args.quick))
    if args.which == "growth" or (args.which == "all" and not skipped):
        from bench import growth

        tables.append(growth.main(quick=args.quick, rounds=args.rounds))
    if args.which in ("size", "all"):
        from bench import size

        tables.append(size.main(quick=args.quick))
    if args.which in ("latency", "all"):
        from bench import latency

        tables.append(latency.main(quick=args.quick))
    if args.which in ("slow", "all"):
        from bench import slow

        tables.append(slow.main(quick=args.quick))
    if args.which in ("filters", "all"):
        from bench import filters

        tables.append(filters.main(quick=args.quick, seconds=args.seconds))
    if args.which in ("replay", "all"):
        from bench import replay

        tables.append(replay.main(messages=100 if args.quick else 1003))
    if args.which in ("erase", "all"):
        from bench import erase

        tables.append(erase.main(quick=args.quick, rows=args.rows))
    if args.which == "retention":  # not in `all`: the purge with ages per tenant
        from bench import retention

        tables.append(retention.main(quick=args.quick, rounds=args.rounds))
    if args.which == "partitions":  # not in `all`: partition drop against the purge
        from bench import partitions

        if args.migrate:
            tables.append(partitions.migrate_main(rows=args.rows))
        else:
            tables.append(
                partitions.main(
                    quick=args.quick, rounds=args.rounds, rows=args.rows, sending=args.sending
                )
            )
    if args.which == "otel":  # not in `all`: the cost of tracing, on demand
        from bench import otel

        tables.append(otel.main(seconds=args.seconds, rounds=args.rounds, quick=args.quick))
    print()
    print("\n\n".join(tables))
    after = cpu_reference(additions)
    print(
        f"\nCPU reference: {additions:,} additions in a Python loop, {before:.2f} s before"
        f" the run and {after:.2f} s after"
    )
    dropped = drop_databases()
    print(f"\nbench: dropped {len(dropped)} database(s) bench_{RUN_ID}_*")
    if skipped:
        print(f"\n{skipped}")
        raise SystemExit(3)


if __name__ == "__main__":
    main()
