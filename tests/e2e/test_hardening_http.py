"""The HTTP server of ``relaybox serve`` under hostile clients: request heads bounded in
size and header count (431), slow heads cut (header timeout), idle keep-alive
connections closed, open connections capped, and everything else served meanwhile.

Every test talks over raw sockets to a real ``relaybox serve`` process (the demo app,
SQLite), whose limits come from ``RELAYBOX_SERVER__*`` as an operator would set them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from relaybox.config import load_settings
from relaybox.errors import ConfigurationError
from relaybox.store import open_store
from tests.support.procs import Proc, Procs

pytestmark = pytest.mark.slow

ROLES = "receiver,api,admin,worker,dispatcher"
MiB = 1024 * 1024


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    yield p
    p.cleanup()


@pytest.fixture
def many_fds() -> Iterator[None]:
    """Room for ~1,000 sockets in this process (the server raises its own limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def serve(procs: Procs, tmp_path: Path, **server: object) -> Proc:
    """``relaybox serve`` (the demo app) on a migrated SQLite file, with ``[server]``
    settings from the environment."""
    url = f"sqlite:///{tmp_path / 'relaybox.db'}"
    store = open_store(url)
    await store.migrate()
    await store.close()
    env = {f"RELAYBOX_SERVER__{k.upper()}": str(v) for k, v in server.items()}
    env["RELAYBOX_LOG_LEVEL"] = "warning"
    return await procs.serve(url, app="relaybox.demo:box", roles=ROLES, env=env)


def address(proc: Proc) -> tuple[str, int]:
    host, port = proc.url.removeprefix("http://").split(":")
    return host, int(port)


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def read_response(reader: asyncio.StreamReader, within: float = 5.0) -> Response:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), within)
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    size = int(headers.get("content-length", "0"))
    body = await asyncio.wait_for(reader.readexactly(size), within)
    return Response(int(status_line.split()[1]), headers, body)


async def closed_by_server(reader: asyncio.StreamReader, within: float) -> bool:
    """Whether the server ends the connection (EOF or reset) within ``within`` s."""
    try:
        while await asyncio.wait_for(reader.read(65536), within):
            pass
    except TimeoutError:  # before OSError, its base class
        return False
    except OSError:
        return True
    return True


def request(
    method: str, path: str, headers: list[tuple[str, str]] | None = None, body: bytes = b""
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{name}: {value}" for name, value in headers or []]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


_open: list[asyncio.StreamWriter] = []


@pytest.fixture(autouse=True)
async def _close_connections() -> AsyncIterator[None]:
    """Closes the connections a test opened with :func:`connect`."""
    yield
    while _open:
        _open.pop().close()


async def connect(proc: Proc) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(*address(proc))
    _open.append(writer)
    return reader, writer


async def exchange(proc: Proc, raw: bytes) -> tuple[Response, asyncio.StreamReader]:
    """``raw`` on a new connection (left open) and the answer."""
    reader, writer = await connect(proc)
    writer.write(raw)
    return await read_response(reader), reader


def signed_delivery(event_id: str) -> tuple[bytes, list[tuple[str, str]]]:
    """A Stripe delivery signed for the demo app, with the headers a provider sends."""
    from relaybox.demo import box

    event = {"id": event_id, "type": "customer.created", "data": {"object": {"id": "cus_1"}}}
    body = json.dumps(event).encode()
    signature = box.sources["stripe"].sign(
        body, event_id=event_id, event_type="customer.created", now=time.time()
    )
    headers = [(k, v) for k, v in signature.items()]
    headers += [
        ("Content-Type", "application/json; charset=utf-8"),
        ("User-Agent", "Stripe/1.0 (+https://stripe.com/docs/webhooks)"),
        ("Accept", "*/*; q=0.5, application/xml"),
        ("Cache-Control", "no-cache"),
        ("X-Forwarded-For", "203.0.113.7"),
        ("X-Request-Id", "req_" + "0" * 24),
    ]
    return body, headers


@dataclass
class Probe:
    """``GET /healthz`` over one keep-alive connection, again and again, recording
    each answer's status and latency, and the server's peak memory."""

    proc: Proc
    latencies: list[float] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    peak_rss: int = 0
    answering: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self, stop: asyncio.Event) -> None:
        server = psutil.Process(self.proc.pid)
        reader, writer = await asyncio.open_connection(*address(self.proc))
        try:
            while not stop.is_set():
                started = time.perf_counter()
                writer.write(request("GET", "/healthz"))
                try:
                    answer = await read_response(reader, within=10.0)
                except TimeoutError:
                    self.latencies.append(10.0)
                    self.statuses.append(0)
                    return
                self.latencies.append(time.perf_counter() - started)
                self.statuses.append(answer.status)
                self.answering.set()
                self.peak_rss = max(self.peak_rss, server.memory_info().rss)
                await asyncio.sleep(0.01)
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def probing(proc: Proc) -> AsyncIterator[Probe]:
    probe = Probe(proc)
    stop = asyncio.Event()
    task = asyncio.create_task(probe.run(stop))
    answering = asyncio.create_task(probe.answering.wait())
    await asyncio.wait([answering, task], return_when=asyncio.FIRST_COMPLETED)
    answering.cancel()
    try:
        yield probe
    finally:
        stop.set()
        await task


def flood(host: str, port: int, header: int) -> tuple[bytes, float]:
    """Send a request whose one header is ``header`` bytes long, in 1 MiB writes, while
    another thread reads; the answer (b"" on a close or reset) and when it came."""
    sock = socket.create_connection((host, port))
    sock.settimeout(15)
    started = time.monotonic()
    answer: list[tuple[bytes, float]] = []

    def read() -> None:
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except OSError:
            pass
        answer.append((data, time.monotonic() - started))

    import threading

    reader = threading.Thread(target=read)
    reader.start()
    try:
        sock.sendall(b"POST /webhooks/stripe HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
        chunk = b"a" * MiB
        for _ in range(header // MiB):
            sock.sendall(chunk)
        sock.sendall(b"\r\n\r\n")
    except OSError:
        pass  # the server refused and closed: the rest is not wanted
    reader.join(30)
    sock.close()
    return answer[0] if answer else (b"", float("inf"))


def test_server_settings_come_from_the_environment_and_are_bounded() -> None:
    env = {"RELAYBOX_SERVER__MAX_HEADER_BYTES": "16384", "RELAYBOX_SERVER__HEADER_TIMEOUT": "2.5"}
    settings = load_settings(env=env).server
    assert (settings.max_header_bytes, settings.header_timeout) == (16384, 2.5)
    assert (settings.max_headers, settings.max_connections) == (100, 1000)
    with pytest.raises(ConfigurationError, match=r"server\.max_header_bytes"):
        load_settings(env={"RELAYBOX_SERVER__MAX_HEADER_BYTES": "10"})
    with pytest.raises(ConfigurationError, match=r"server\.header_timeout"):
        load_settings(env={"RELAYBOX_SERVER__HEADER_TIMEOUT": "0"})


# -- header size -------------------------------------------------------------------------


async def test_an_80_mib_header_is_refused_at_once_and_healthz_keeps_answering(
    procs: Procs, tmp_path: Path
) -> None:
    proc = await serve(procs, tmp_path)
    server = psutil.Process(proc.pid)
    baseline = server.memory_info().rss
    async with probing(proc) as probe:
        answer, took = await asyncio.to_thread(flood, *address(proc), 80 * MiB)
        await asyncio.sleep(0.2)  # a few more probes after the flood
    assert answer == b"" or answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert took < 1.0, f"the 80 MiB header was answered after {took:.2f} s"
    assert len(probe.latencies) >= 5 and set(probe.statuses) == {200}, probe.statuses
    assert max(probe.latencies) < 0.1, f"/healthz took {max(probe.latencies):.3f} s"
    grown = max(probe.peak_rss, server.memory_info().rss) - baseline
    assert grown < 32 * MiB, f"the server grew by {grown / MiB:.0f} MiB"


async def test_a_64_kib_header_answers_431_and_one_within_the_limit_is_served(
    procs: Procs, tmp_path: Path
) -> None:
    proc = await serve(procs, tmp_path)
    answer, reader = await exchange(proc, request("GET", "/healthz", [("X-Big", "a" * 65536)]))
    assert answer.status == 431
    assert answer.headers["content-type"] == "application/json"
    assert answer.json()["error"] == "header_too_large"
    assert await closed_by_server(reader, within=5)

    answer, _ = await exchange(proc, request("GET", "/healthz", [("X-Big", "a" * 30_000)]))
    assert answer.status == 200, answer

    # The request line counts too.
    answer, reader = await exchange(proc, request("GET", "/healthz?q=" + "a" * 65536))
    assert answer.status == 431
    assert await closed_by_server(reader, within=5)


async def test_a_header_sent_in_many_small_pieces_is_counted_across_them(
    procs: Procs, tmp_path: Path
) -> None:
    proc = await serve(procs, tmp_path, max_header_bytes=4096)
    reader, writer = await connect(proc)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
    for _ in range(20):
        writer.write(b"a" * 300)
        await writer.drain()
        await asyncio.sleep(0.005)
    writer.write(b"\r\n\r\n")
    answer = await read_response(reader)
    assert answer.status == 431
    assert await closed_by_server(reader, within=5)
    writer.close()


# -- header count ------------------------------------------------------------------------


async def test_too_many_headers_answer_431(procs: Procs, tmp_path: Path) -> None:
    proc = await serve(procs, tmp_path, max_headers=100)
    # Host plus 99: 100 header fields, the limit.
    at_limit = [(f"X-H{i}", "1") for i in range(99)]
    answer, _ = await exchange(proc, request("GET", "/healthz", at_limit))
    assert answer.status == 200

    answer, reader = await exchange(proc, request("GET", "/healthz", [*at_limit, ("X-One", "1")]))
    assert answer.status == 431
    assert answer.json()["error"] == "too_many_headers"
    assert await closed_by_server(reader, within=5)


# -- slow heads, idle connections --------------------------------------------------------


async def test_800_slow_header_senders_are_cut_after_the_header_timeout(
    procs: Procs, tmp_path: Path, many_fds: None
) -> None:
    timeout = 1.0
    proc = await serve(procs, tmp_path, header_timeout=timeout)
    head = request("POST", "/webhooks/stripe", [("X-Slow", "x" * 200)])
    cut_after: list[float] = []

    async def slow_sender() -> None:
        opened = time.monotonic()  # no later than the server's accept
        reader, writer = await asyncio.open_connection(*address(proc))
        try:
            for i in range(len(head)):
                if time.monotonic() - opened > timeout + 4:
                    return  # not cut
                writer.write(head[i : i + 1])
                try:
                    got = await asyncio.wait_for(reader.read(65536), 0.2)
                except TimeoutError:
                    continue
                except OSError:
                    got = b""
                if not got or got.startswith(b"HTTP/1.1 408 "):
                    assert got == b"" or await closed_by_server(reader, within=5)
                    cut_after.append(time.monotonic() - opened)
                    return
        finally:
            writer.close()

    async with probing(proc) as probe:
        senders = [asyncio.create_task(slow_sender()) for _ in range(800)]
        await asyncio.wait_for(asyncio.gather(*senders), 30)
    assert len(cut_after) == 800, f"only {len(cut_after)} of 800 were cut"
    # Not before the timeout: the server's timer runs on uvloop's clock, which counts
    # whole milliseconds read at the start of a loop iteration, so it may fire up to a
    # millisecond or two before the client's own clock says the second is over (CI saw
    # 0.99990 s).
    assert min(cut_after) >= timeout - 0.005, min(cut_after)
    assert max(cut_after) < timeout + 3.0, max(cut_after)
    assert set(probe.statuses) == {200}, probe.statuses
    assert max(probe.latencies) < 0.5, f"/healthz took {max(probe.latencies):.3f} s"


async def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(
    procs: Procs, tmp_path: Path
) -> None:
    proc = await serve(procs, tmp_path, header_timeout=0.5)
    reader, writer = await connect(proc)
    started = time.monotonic()
    assert await closed_by_server(reader, within=5)
    assert 0.4 <= time.monotonic() - started < 3
    writer.close()


async def test_an_idle_keep_alive_connection_is_closed_after_the_keep_alive_timeout(
    procs: Procs, tmp_path: Path
) -> None:
    proc = await serve(procs, tmp_path, keep_alive_timeout=0.5)
    answer, reader = await exchange(proc, request("GET", "/healthz"))
    assert answer.status == 200
    started = time.monotonic()
    assert await closed_by_server(reader, within=3)
    assert time.monotonic() - started < 3


async def test_a_pipelined_head_that_stalls_is_cut_after_the_header_timeout(
    procs: Procs, tmp_path: Path
) -> None:
    """A whole request, then the start of the next one in the same write: the first is
    answered, the second's head must still arrive within the header timeout."""
    proc = await serve(procs, tmp_path, header_timeout=0.5)
    reader, writer = await connect(proc)
    writer.write(request("GET", "/healthz") + b"GET /healthz HTTP/1.1\r\nHo")
    assert (await read_response(reader)).status == 200
    started = time.monotonic()
    answer = await read_response(reader)
    assert answer.status == 408
    assert answer.json()["error"] == "header_timeout"
    assert time.monotonic() - started < 3
    assert await closed_by_server(reader, within=5)


async def test_an_answer_before_the_body_still_ends_in_the_keep_alive_timeout(
    procs: Procs, tmp_path: Path
) -> None:
    """413 is answered from Content-Length, before the body arrives; the body that
    follows must not leave the connection open with no timer."""
    proc = await serve(procs, tmp_path, keep_alive_timeout=0.5)
    reader, writer = await connect(proc)
    size = 2 * MiB  # over the source's max_body (1 MiB)
    writer.write(
        b"POST /webhooks/stripe HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        + f"Content-Length: {size}\r\n\r\n".encode()
    )
    answer = await read_response(reader)
    assert answer.status == 413
    writer.write(b"{" * size)
    await writer.drain()
    started = time.monotonic()
    assert await closed_by_server(reader, within=5)
    assert time.monotonic() - started < 3


# -- normal traffic ----------------------------------------------------------------------


async def test_normal_requests_are_served_on_a_kept_alive_connection(
    procs: Procs, tmp_path: Path
) -> None:
    proc = await serve(procs, tmp_path)
    reader, writer = await connect(proc)
    try:
        for n in range(3):
            body, headers = signed_delivery(f"evt_normal_{n}")
            writer.write(request("POST", "/webhooks/stripe", headers, body))
            answer = await read_response(reader)
            assert answer.status == 200, answer
            assert answer.json()["event_id"] == f"evt_normal_{n}"
            assert answer.headers.get("connection") != "close"

            writer.write(request("GET", "/healthz"))
            assert (await read_response(reader)).status == 200
            writer.write(request("GET", "/admin/api/v1/events"))
            assert (await read_response(reader)).status == 401
            writer.write(request("GET", "/api/v1/endpoints"))
            assert (await read_response(reader)).status in (401, 403)
        # Two requests in one write (pipelined) are both answered, in order.
        body, headers = signed_delivery("evt_pipelined")
        pipelined = request("POST", "/webhooks/stripe", headers, body) + request("GET", "/healthz")
        writer.write(pipelined)
        first, second = await read_response(reader), await read_response(reader)
        assert (first.status, second.status) == (200, 200)
        assert first.json()["event_id"] == "evt_pipelined"
    finally:
        writer.close()


# -- connection cap ----------------------------------------------------------------------


async def test_connections_over_the_cap_answer_503_and_others_are_served(
    procs: Procs, tmp_path: Path
) -> None:
    cap = 20
    proc = await serve(
        procs, tmp_path, max_connections=cap, header_timeout=60, keep_alive_timeout=60
    )
    held: list[asyncio.StreamWriter] = []
    refused: Response | None = None
    try:
        for _ in range(cap + 5):
            answer, reader = await exchange_held(proc, held)
            if answer.status == 503:
                refused = answer
                assert await closed_by_server(reader, within=5)
                held.pop().close()
                break
            assert answer.status == 200
        assert refused is not None, f"{len(held)} connections open, none refused"
        assert refused.json()["error"] == "too_many_connections"
        # The server may still count a connection its own readiness check closed.
        assert cap - 2 <= len(held) <= cap, len(held)

        held.pop(0).close()
        for _ in range(100):
            answer, _ = await exchange_held(proc, held)
            if answer.status == 200:
                break
            held.pop().close()
            await asyncio.sleep(0.02)
        assert answer.status == 200
    finally:
        for writer in held:
            writer.close()


async def exchange_held(
    proc: Proc, held: list[asyncio.StreamWriter]
) -> tuple[Response, asyncio.StreamReader]:
    reader, writer = await connect(proc)
    held.append(writer)
    writer.write(request("GET", "/healthz"))
    return await read_response(reader), reader
