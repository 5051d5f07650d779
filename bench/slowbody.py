"""Slow request bodies against ``relaybox serve``: can an unauthenticated client hold the
server's connections, and does ``/healthz`` keep answering while it tries?

The attack: ``--connections`` sockets (1,000), each sending a complete head of
``POST /webhooks/stripe`` with ``Content-Length: 1000000`` (under the source's 1 MiB
``max_body``, so no 413), then one byte of body every ``--every`` seconds (5). The
sockets come from ``--addresses`` source addresses (127.0.0.2, 127.0.0.3, …: the whole
127.0.0.0/8 is routed on ``lo``, no setup needed; ``--addresses 1`` uses 127.0.0.1
alone). A cut connection is opened again after ``--pause`` seconds (0.5), as a
determined attacker would: the attack holds as many connections as the server lets it,
for the whole run. They are opened at ``--open-rate`` a second (500).

The attack runs in a process of its own (``--attack-only``, pinned to core 1), so that
its sockets never delay the probes: each second, this process opens a NEW connection
from ``--probe-from`` (127.0.0.254: not an attacking address; ``--probe-from
127.0.0.1`` shares the one-address attack's) for ``GET /healthz``, and posts a signed
Stripe delivery of the demo app from 127.0.0.253, each with a 10 s timeout. The rows
give each one's answers, p50 and max latency: ``before`` the attack (``--before``, 5
s), while it opens its sockets (``ramp``: 2 s at the default rate, longer when the
attacking process is busy reconnecting refused ones), and for the rest of its
``--seconds`` (45, ``during``); then the server's CPU over the attack.

The server is ``relaybox serve --app relaybox.demo:box`` with every role, on a migrated
SQLite file or a fresh PostgreSQL database (``BENCH_PG``), pinned to core 0.
``RELAYBOX_SERVER__*`` in the environment reach the server (its limits); ``--url``
probes and attacks a server already running instead.

    python -m bench.slowbody --backend sqlite
    python -m bench.slowbody --backend postgres --addresses 49
    python -m bench.slowbody --url http://127.0.0.1:8000 --attack-only --seconds 30

``--attack-only`` runs the attack alone against ``--url`` and prints one JSON line
when it ends: how many connections it opened and how they ended (``answers``: the
status the server answered, ``closed`` without one; ``open``: still open at the end).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 10.0

# -- the attack (its own process; the standard library only) ---------------------------


@dataclass
class Attack:
    """What the attacking sockets saw."""

    opened: int = 0
    connect_failures: int = 0
    answers: Counter[str] = field(default_factory=Counter)  # status, or "closed", when cut
    lives: list[float] = field(default_factory=list)  # seconds each cut one was open
    open_since: dict[int, float] = field(default_factory=dict)

    def summary(self) -> dict[str, object]:
        now = time.monotonic()
        ages = [now - t for t in self.open_since.values()]
        return {
            "opened": self.opened,
            "connect_failures": self.connect_failures,
            "answers": dict(self.answers),
            "open": len(ages),
            "oldest_open": round(max(ages, default=0.0), 1),
            "median_life": round(statistics.median(self.lives), 1) if self.lives else None,
        }


def post_head(extra: list[tuple[str, str]], length: int) -> bytes:
    lines = ["POST /webhooks/stripe HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {length}"]
    lines += [f"{name}: {value}" for name, value in extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def status_of(reader: asyncio.StreamReader, within: float) -> str:
    """The status of the answer the server sent, ``closed`` when it closed or reset
    without one, ``timeout`` when nothing came."""
    try:
        line = await asyncio.wait_for(reader.readline(), within)
    except TimeoutError:
        return "timeout"
    except OSError:
        return "closed"
    parts = line.split()
    return parts[1].decode() if len(parts) > 1 and line.startswith(b"HTTP/") else "closed"


async def attacker(
    n: int, host: str, port: int, source: str, args: argparse.Namespace, attack: Attack,
    stop: asyncio.Event,
) -> None:  # fmt: skip
    """One attacking socket, opened again each time the server cuts it."""
    head = post_head([("Content-Type", "application/json")], 1_000_000)
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
        except OSError:
            attack.connect_failures += 1
            await asyncio.sleep(args.pause)
            continue
        attack.opened += 1
        opened = attack.open_since[n] = time.monotonic()
        answer = ""
        try:
            writer.write(head)
            while not stop.is_set():
                # Wait up to `every` s for the server to answer or close; then a byte.
                status = await status_of(reader, args.every)
                if status != "timeout":
                    answer = status
                    break
                writer.write(b"{")
        except OSError:
            answer = "closed"
        finally:
            if answer:  # cut by the server (else stopped by us: still open)
                attack.open_since.pop(n, None)
            writer.close()
        if answer:
            attack.answers[answer] += 1
            attack.lives.append(time.monotonic() - opened)
            await asyncio.sleep(args.pause)


def sources(count: int) -> list[str]:
    if count == 1:
        return ["127.0.0.1"]
    return [f"127.0.0.{2 + i}" for i in range(count)]


def split_url(url: str) -> tuple[str, int]:
    host, _, port = url.removeprefix("http://").rstrip("/").partition(":")
    return host, int(port or 80)


async def attack_main(args: argparse.Namespace) -> dict[str, object]:
    """The attack alone, for ``--seconds``: prints ``ramped`` once every socket was
    opened once (or when the time is up first), and returns the summary."""
    host, port = split_url(args.url)
    attack, stop = Attack(), asyncio.Event()
    addresses = sources(args.addresses)
    tasks: list[asyncio.Task[None]] = []

    async def ramp() -> None:
        # A tenth of a second's worth at a time: one sleep per socket took far longer
        # than its 2 ms on a busy machine (a loop iteration each).
        batch = max(1, round(args.open_rate / 10))
        for n in range(args.connections):
            if stop.is_set():
                break
            source = addresses[n % len(addresses)]
            tasks.append(asyncio.create_task(attacker(n, host, port, source, args, attack, stop)))
            if n % batch == batch - 1:
                await asyncio.sleep(0.1)
        print("ramped", flush=True)

    ramping = asyncio.create_task(ramp())
    await asyncio.sleep(args.seconds)
    summary = attack.summary()  # before stopping: what is open now
    stop.set()
    await ramping
    await asyncio.gather(*tasks, return_exceptions=True)
    return summary


# -- the probes and the server (this process) ------------------------------------------


@dataclass
class Probes:
    """One kind of probe's answers: (status or 0, seconds, phase)."""

    results: list[tuple[int, float, str]] = field(default_factory=list)

    def row(self, *phases: str) -> tuple[str, str, str, Counter[int]]:
        mine = [(s, t) for s, t, p in self.results if p in phases]
        ok = [t for s, t in mine if 200 <= s < 300]
        p50 = f"{statistics.median(ok) * 1000:.1f}" if ok else "-"
        top = f"{max(t for _, t in mine) * 1000:.1f}" if mine else "-"
        return f"{len(ok)}/{len(mine)}", p50, top, Counter(s for s, _ in mine)


async def exchange(host: str, port: int, source: str, raw: bytes) -> tuple[int, float]:
    """``raw`` on a new connection from ``source``: the status (0: none) and the time."""
    started = time.perf_counter()
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, local_addr=(source, 0)), TIMEOUT
        )
    except (OSError, TimeoutError):
        return 0, time.perf_counter() - started
    try:
        writer.write(raw)
        status = await status_of(reader, TIMEOUT - (time.perf_counter() - started))
    finally:
        writer.close()
    return (int(status) if status.isdigit() else 0), time.perf_counter() - started


def signed_delivery(n: int) -> bytes:
    """A signed Stripe delivery of the demo app (what a provider would send)."""
    from relaybox.demo import box

    event_id = f"evt_slowbody_{os.getpid()}_{n}"
    body = json.dumps(
        {"id": event_id, "type": "customer.created", "data": {"object": {"id": "cus_1"}}}
    ).encode()
    signature = box.sources["stripe"].sign(
        body, event_id=event_id, event_type="customer.created", now=time.time()
    )
    extra = [*signature.items(), ("Content-Type", "application/json"), ("Connection", "close")]
    return post_head(extra, len(body)) + body


HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"


async def prober(
    kind: str, host: str, port: int, source: str, out: Probes, phase: list[str],
    stop: asyncio.Event,
) -> None:  # fmt: skip
    """One probe a second, each on its own task (a slow answer does not delay the next)."""
    tasks = []

    async def one(n: int, at: str) -> None:
        raw = HEALTHZ if kind == "healthz" else signed_delivery(n)
        out.results.append((*await exchange(host, port, source, raw), at))

    n = 0
    while not stop.is_set():
        tasks.append(asyncio.create_task(one(n, phase[0])))
        n += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
    await asyncio.gather(*tasks)


def cpu_seconds(pid: int | None) -> float:
    """User and system CPU seconds ``pid`` has used (0 without a pid)."""
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def attack_command(url: str, args: argparse.Namespace) -> list[str]:
    return [
        "taskset", "-c", "1", sys.executable, "-m", "bench.slowbody", "--url", url,
        "--attack-only", "--connections", str(args.connections), "--addresses",
        str(args.addresses), "--seconds", str(args.seconds), "--every", str(args.every),
        "--pause", str(args.pause), "--open-rate", str(args.open_rate),
    ]  # fmt: skip


async def run(
    url: str, args: argparse.Namespace, pid: int | None
) -> tuple[dict[str, object], Probes, Probes, float]:
    host, port = split_url(url)
    health, deliveries = Probes(), Probes()
    stop = asyncio.Event()
    phase = ["before"]
    probes = [
        asyncio.create_task(prober("healthz", host, port, args.probe_from, health, phase, stop)),
        asyncio.create_task(prober("delivery", host, port, "127.0.0.253", deliveries, phase, stop)),
    ]
    await asyncio.sleep(args.before)
    phase[0] = "ramp"
    cpu, started = cpu_seconds(pid), time.monotonic()
    attack = await asyncio.create_subprocess_exec(
        *attack_command(url, args), cwd=ROOT, stdout=asyncio.subprocess.PIPE
    )
    assert attack.stdout is not None
    ramped = await attack.stdout.readline()
    if ramped.strip() != b"ramped":
        sys.exit(f"the attack did not start: {ramped!r}")
    phase[0] = "during"
    summary = json.loads(await attack.stdout.readline())
    server_cpu = (cpu_seconds(pid) - cpu) / (time.monotonic() - started)
    stop.set()
    await asyncio.gather(*probes)
    await attack.wait()
    return summary, health, deliveries, server_cpu


def raise_fd_limit(wanted: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        limit = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))


@contextlib.contextmanager
def relaybox_serve(backend: str) -> Iterator[tuple[str, int]]:
    """``relaybox serve`` (the demo app, every role) on core 0: its URL and pid."""
    from bench.common import free_port, fresh_pg_database
    from relaybox.outbound.vault import new_key

    with tempfile.TemporaryDirectory(prefix="bench-slowbody-") as tmp:
        if backend == "sqlite":
            url = f"sqlite:///{Path(tmp) / 'relaybox.db'}"
        else:
            url = fresh_pg_database("slowbody")
        env = {
            **os.environ,
            "RELAYBOX_LOG_LEVEL": "warning",
            "RELAYBOX_OUTBOUND__SECRETS_KEY": os.environ.get(
                "RELAYBOX_OUTBOUND__SECRETS_KEY", new_key()
            ),
        }
        relaybox = [sys.executable, "-m", "relaybox"]
        subprocess.run([*relaybox, "migrate", "--database-url", url], check=True, cwd=ROOT,
                       env=env, capture_output=True)  # fmt: skip
        port = free_port()
        roles = "receiver,api,admin,worker,dispatcher"
        command = [*relaybox, "serve", "--app", "relaybox.demo:box", "--database-url", url,
                   "--roles", roles, "--host", "127.0.0.1", "--port", str(port),
                   "--no-migrate"]  # fmt: skip
        log_path = Path(tmp) / "serve.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(["taskset", "-c", "0", *command], cwd=ROOT, env=env,
                                    stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
            try:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
                        break
                    except OSError:
                        if proc.poll() is not None or time.monotonic() > deadline:
                            tail = log_path.read_text(errors="replace")[-3000:]
                            sys.exit(f"relaybox serve did not start:\n{tail}")
                        time.sleep(0.2)
                yield f"http://127.0.0.1:{port}", proc.pid
            finally:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        errors = [line for line in log_path.read_text(errors="replace").splitlines()
                  if '"level": "error"' in line or "Traceback" in line]  # fmt: skip
        if errors:
            print(f"server log: {len(errors)} error line(s), the first: {errors[0][:300]}")


def report(
    title: str, attack: dict[str, object], health: Probes, deliveries: Probes, server_cpu: float
) -> str:
    from bench.common import table

    rows = []
    phases = [("before", ("before",)), ("ramp", ("ramp",)), ("during", ("during",))]
    for title, phase in [*phases, ("whole attack", ("ramp", "during"))]:
        for name, probes in (("GET /healthz", health), ("signed delivery", deliveries)):
            ok, p50, top, statuses = probes.row(*phase)
            seen = ", ".join(f"{s or 'none'}: {c}" for s, c in sorted(statuses.items()))
            rows.append((title, name, ok, p50, top, seen))
    out = table(title, ("phase", "probe", "2xx", "p50 ms", "max ms", "answers"), rows)
    answers = attack["answers"]
    assert isinstance(answers, dict)
    ended = ", ".join(f"{k}: {v}" for k, v in sorted(answers.items())) or "none cut"
    out += (
        f"\nattack: {attack['opened']} connections opened ({attack['connect_failures']} "
        f"connect failures); cut by the server: {ended} (median life "
        f"{attack['median_life']} s); open at the end: {attack['open']}, the oldest for "
        f"{attack['oldest_open']} s\nserver CPU during the attack: {server_cpu:.0%} of a core"
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.slowbody",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--url", help="a server already running (http://host:port)")
    parser.add_argument("--attack-only", action="store_true", help="no probes, no server")
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--addresses", type=int, default=1, help="source addresses (max 250)")
    parser.add_argument("--seconds", type=float, default=45.0, help="length of the attack")
    parser.add_argument("--before", type=float, default=5.0, help="probes without attack first")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between body bytes")
    parser.add_argument("--pause", type=float, default=0.5, help="seconds before reconnecting")
    parser.add_argument("--open-rate", type=float, default=500.0, help="connections a second")
    parser.add_argument("--probe-from", default="127.0.0.254")
    args = parser.parse_args()
    if not 1 <= args.addresses <= 250:
        parser.error("--addresses: 1 to 250")
    raise_fd_limit(args.connections * 2 + 1024)
    if args.attack_only:
        if not args.url:
            parser.error("--attack-only needs --url")
        print(json.dumps(asyncio.run(attack_main(args))), flush=True)
        return
    settings = {k: v for k, v in os.environ.items() if k.startswith("RELAYBOX_SERVER__")}
    title = (
        f"slow bodies: {args.connections} connections from {args.addresses} address(es), "
        f"1 byte / {args.every:g} s, {args.seconds:g} s; probes from {args.probe_from}; "
        + (f"server {args.url}" if args.url else f"relaybox serve on {args.backend}")
        + (f"; {settings}" if settings else "")
    )
    if args.url:
        print(report(title, *asyncio.run(run(args.url, args, None))))
        return
    with relaybox_serve(args.backend) as (url, pid):
        result = asyncio.run(run(url, args, pid))
    print(report(title, *result))


if __name__ == "__main__":
    main()
