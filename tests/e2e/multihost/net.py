"""Hosts for the multi-host tests, made with network namespaces.

:class:`Network` makes a bridge in this (the test's) namespace with an address on a
private /24 of its own, and for each host a network namespace joined to the bridge by
a veth pair. The test's namespace is the *database host*: PostgreSQL is reached
through a :class:`~tests.support.proxy.TcpProxy` listening on the bridge's address
(the shared server is never reconfigured), and the sink that counts the outbox's
deliveries listens there too. Each :class:`Host` runs real ``relaybox`` processes
inside its namespace (``ip netns exec``): ``serve`` (receiver and worker) and
``dispatch``. Cutting a host off is its veth's link going down on the bridge's side.

Needs root and ``ip`` (iproute2): :func:`make_network` raises :class:`NoNamespaces`
with the reason where namespaces cannot be made, and the tests skip with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from sqlalchemy.engine import make_url

from tests.support.procs import FAST_WORKER, ROOT, Proc, relaybox_command, wait_http
from tests.support.proxy import TcpProxy

__all__ = ["Host", "Network", "NoNamespaces", "Sink", "make_network"]

APP = "tests.e2e.multihost.hostapp:box"
PORT = 8080  # the receiver's port in every host (each namespace has its own ports)


class NoNamespaces(RuntimeError):
    """Network namespaces cannot be made here (not root, no ``ip``, no permission)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def _free_subnet() -> int:
    """A third octet ``n`` of 10.213.n.0/24 with no address or route on this machine."""
    used = _ip("-o", "addr").stdout + _ip("route").stdout
    for _ in range(200):
        n = random.randint(1, 254)
        if f"10.213.{n}." not in used:
            return n
    raise NoNamespaces("no free 10.213.x.0/24 subnet")


@dataclass
class Host:
    """One namespace and the ``relaybox`` processes it runs."""

    name: str
    netns: str
    address: str
    veth: str  # the bridge's end of its link
    env: dict[str, str]
    logs: Path
    procs: list[Proc] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.address}:{PORT}"

    def start(self, name: str, args: list[str], env: Mapping[str, str] | None = None) -> Proc:
        command = ["ip", "netns", "exec", self.netns, *relaybox_command(), *args]
        log = self.logs / f"{self.name}-{name}-{len(self.procs):02d}.log"
        proc = Proc(f"{self.name}/{name}", command, {**self.env, **(env or {})}, log)
        self.procs.append(proc)
        return proc

    def forward(self, listen_port: int, host: str, port: int) -> Proc:
        """This host's ``127.0.0.1:listen_port`` to ``host:port`` (a receiver on the
        test's namespace): see :mod:`tests.e2e.multihost.forward`."""
        module = "tests.e2e.multihost.forward"
        command = ["ip", "netns", "exec", self.netns, sys.executable, "-m", module]
        command += [str(listen_port), host, str(port)]
        log = self.logs / f"{self.name}-forward-{len(self.procs):02d}.log"
        proc = Proc(f"{self.name}/forward", command, self.env, log)
        self.procs.append(proc)
        return proc

    async def run(self, database_url: str, *, workers: int = 1) -> None:
        """``serve`` (receiver and worker) and ``dispatch``; returns once the receiver
        answers ``/healthz``."""
        db = ["--app", APP, "--database-url", database_url]
        listen = ["--host", self.address, "--port", str(PORT)]
        serve = self.start(
            "serve", ["serve", *db, "--roles", "receiver,worker", *listen, "--no-migrate"]
        )
        for _ in range(workers - 1):
            self.start("worker", ["worker", *db])
        self.start("dispatch", ["dispatch", *db])
        await wait_http(self.url + "/healthz", within=60, proc=serve)

    def kill(self) -> None:
        """SIGKILL every process of the host at once (the machine lost its power)."""
        for proc in self.procs:
            if proc.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, 9)
        for proc in self.procs:
            proc.popen.wait(10)

    def link(self, up: bool) -> None:
        """The host's network link on the bridge's side: down cuts it off from the
        database, the sink and the other hosts, mid-transaction or not."""
        _ip("link", "set", self.veth, "up" if up else "down")

    def stop(self) -> None:
        for proc in self.procs:
            proc.send_term()
        for proc in self.procs:
            proc.wait(20)

    def tails(self) -> str:
        return "\n".join(p.tail(15) for p in self.procs)


class Sink:
    """The outbox's destination, on the database's host: counts every POST by its
    idempotency key (a key seen twice is a duplicate)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.port = 0
        self.seen: Counter[str] = Counter()
        self.by_host: Counter[str] = Counter()
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}/sink"

    async def _handle(self, request: web.Request) -> web.Response:
        await request.read()
        await asyncio.sleep(0.1)  # a real endpoint's time: leases are live when a host dies
        self.seen[request.headers.get("idempotency-key", "")] += 1
        self.by_host[request.headers.get("x-host", "")] += 1
        return web.json_response({"ok": True})

    async def start(self) -> Sink:
        app = web.Application()
        app.router.add_post("/sink", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.address, 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


class Network:
    """A bridge, one namespace per host, the database's proxy and the sink."""

    def __init__(self, tag: str, subnet: int, logs: Path) -> None:
        self.tag, self.subnet, self.logs = tag, subnet, logs
        self.bridge = f"rbb{tag}"
        self.gateway = f"10.213.{subnet}.1"
        self.hosts: list[Host] = []
        self.proxy: TcpProxy | None = None
        self.sink: Sink | None = None
        self.database_url = ""

    def _setup_bridge(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def add_host(self, name: str, env: Mapping[str, str]) -> Host:
        n = len(self.hosts) + 1
        netns, veth = f"rbh{self.tag}-{n}", f"rbv{self.tag}{n}"
        address = f"10.213.{self.subnet}.{10 + n}"
        _ip("netns", "add", netns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns)
        _ip("link", "set", veth, "master", self.bridge, "up")
        _ip("-n", netns, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", netns, "link", "set", "eth0", "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        host = Host(name, netns, address, veth, dict(env), self.logs)
        self.hosts.append(host)
        return host

    async def start(self, admin_url: str, database: str) -> None:
        """The proxy to PostgreSQL on the bridge's address, the URL hosts use, and the
        sink."""
        u = make_url(admin_url)
        socket_dir = u.query.get("host")
        if isinstance(socket_dir, str) and socket_dir.startswith("/"):
            unix = f"{socket_dir}/.s.PGSQL.{u.port or 5432}"
            self.proxy = TcpProxy(unix=unix, listen=self.gateway)
        else:
            target = u.host or "127.0.0.1"
            self.proxy = TcpProxy(host=target, port=u.port or 5432, listen=self.gateway)
        await self.proxy.start()
        hosts_url = u.set(host=self.gateway, port=self.proxy.port, database=database)
        hosts_url = hosts_url.difference_update_query(["host"])
        self.database_url = hosts_url.render_as_string(hide_password=False)
        self.sink = await Sink(self.gateway).start()

    async def close(self) -> None:
        for host in self.hosts:
            host.kill()
        if self.sink is not None:
            await self.sink.close()
        if self.proxy is not None:
            await self.proxy.close()
            # Its pipes see the aborted connections and close their writers before the
            # loop ends (a writer left open warns, and warnings fail the suite).
            for _ in range(20):
                await asyncio.sleep(0.05)
                if not self.proxy._conns:
                    break
        for host in self.hosts:
            _ip("link", "del", host.veth, check=False)
            _ip("netns", "del", host.netns, check=False)
        _ip("link", "del", self.bridge, check=False)

    def tails(self) -> str:
        return "\n".join(h.tails() for h in self.hosts)


def make_network(logs: Path) -> Network:
    """A bridge on a free subnet; raises :class:`NoNamespaces` where it cannot be."""
    if os.geteuid() != 0:
        raise NoNamespaces("network namespaces need root (ip netns add)")
    if shutil.which("ip") is None:
        raise NoNamespaces("no `ip` command (iproute2)")
    tag = f"{os.getpid() % 100000:05d}"
    probe = f"rbprobe{tag}"
    done = _ip("netns", "add", probe, check=False)
    if done.returncode != 0:
        raise NoNamespaces(f"ip netns add failed: {done.stderr.strip()}")
    _ip("netns", "del", probe, check=False)
    net = Network(tag, _free_subnet(), logs)
    net._setup_bridge()
    return net


def host_env(**extra: str) -> dict[str, str]:
    """The environment of a host's processes: the test's, with small holds and leases."""
    env = dict(os.environ)
    for key in ("RELAYBOX_DATABASE_URL", "PYTEST_XDIST_WORKER", "PYTEST_CURRENT_TEST"):
        env.pop(key, None)
    env.update(FAST_WORKER)
    env.update(
        {
            "PYTHONUNBUFFERED": "1",
            "PYTHONPATH": str(ROOT),
            "RELAYBOX_WORKER__CLAIM_HOLD": "2",
            "RELAYBOX_WORKER__MAX_ATTEMPTS": "20",
            "RELAYBOX_WORKER__BACKOFF_CAP": "0.5",
            "RELAYBOX_WORKER__CONCURRENCY": "2",
            "MH_LEASE_TTL": "8",
        }
    )
    env.update(extra)
    return env


async def post_all(urls: list[str], bodies: list[tuple[str, bytes, dict[str, str]]]) -> list[Any]:
    """POST each body to the receivers in turn (round robin), 16 at a time; the
    status of each (``None``: no answer)."""
    statuses: list[Any] = [None] * len(bodies)
    sem = asyncio.Semaphore(16)
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(timeout=timeout) as http:

        async def one(i: int) -> None:
            _, body, headers = bodies[i]
            url = urls[i % len(urls)] + "/webhooks/stripe"
            async with sem:
                with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError):
                    async with http.post(url, data=body, headers=headers) as r:
                        statuses[i] = r.status

        await asyncio.gather(*(one(i) for i in range(len(bodies))))
    return statuses


def monotonic() -> float:
    return time.monotonic()
