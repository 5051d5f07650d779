"""The HTTP server that ``relaybox serve`` runs: uvicorn on httptools, every request
head bounded in size, header count and time, every request body bounded in time and
rate, and the open connections capped, in all and per client address.

httptools (llhttp) has no limit of its own on a request head: it hands header values
to Python piece by piece, concatenating each piece onto what came before, so without
a bound one request with an 80 MiB header would hold the event loop (which the
receiver, the worker and the dispatcher share) for tens of seconds and grow the
process by the header's size. :class:`BoundedHttpToolsProtocol` counts the bytes of
a head before they reach the parser and never feeds it more than
``server.max_header_bytes`` of one head; what is over a limit is answered ``431``
and the connection closed. Heads that arrive slowly are answered ``408`` and closed
after ``server.header_timeout``. Requests within the limits take httptools' path
unchanged.

A body is timed as Apache's mod_reqtimeout times it (``body=5,MinRate=500`` with a
ceiling): it has ``body_grace`` seconds from the end of its head, each byte received
extends that by ``1 / body_min_rate`` s, and ``body_timeout`` is the most it ever gets.
nginx's ``client_body_timeout`` only times the gap between two reads, which a client
sending a byte every few seconds never exceeds; Go's ``ReadTimeout`` (one deadline
for the whole request) leaves a byte every few seconds for the whole deadline. A
late body is answered ``408`` and its request's handler sees the client gone
(``http.disconnect``), never a body cut short as if it were whole.

When every connection the server may hold is open, a new one is not refused while
some connection is waiting on its client (a head or a body still arriving, or idle
between requests): the one that has waited longest is closed to make room
(:class:`relaybox.connections.Room`). So slow clients, however many, cannot lock out
``/healthz``, the dashboard or a provider's next delivery; the newcomer is refused
(503) only when the server is working on every open connection. One client address
may hold at most ``max_connections_per_address`` connections (429 beyond).
"""

from __future__ import annotations

import asyncio
import json
import resource
import socket
from typing import Any, ClassVar

import httptools
import structlog
import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from relaybox.config import ServerSettings
from relaybox.connections import address_key, room_of

__all__ = [
    "STARTUP_FAILURE",
    "BindError",
    "BoundedHttpToolsProtocol",
    "bind",
    "protocol_class",
    "run",
    "uvicorn_config",
]

log = structlog.get_logger("relaybox.server")

# After a refusal the answer is written, the sending side shut down, and what the
# client still sends is read and dropped (not parsed) for at most this long or this
# many bytes before the socket is closed: a close with unread input makes the kernel
# send a reset, which can destroy the answer before the client has read it.
LINGER_SECONDS = 2.0
LINGER_BYTES = 1024 * 1024

# File descriptors kept beyond max_connections for the database pool, outbound
# connections and files.
_FD_HEADROOM = 256


class _HeadRefused(Exception):
    """Raised in a parser callback to stop parsing a head that is refused."""


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with bounded request heads, bodies and connections.

    ``limits`` is set on the subclass :func:`protocol_class` makes. A head is
    "pending" from the connection's start, and again from the end of each request,
    until its headers are complete; bytes received while a head is pending are
    counted and fed to the parser at most up to ``max_header_bytes``. A head that
    begins inside a piece of input already being parsed (a pipelined request after a
    body) is counted from the next piece on, so what is parsed of it uncounted is at
    most that one socket read.

    A body is "pending" from the end of its head to the end of its request. Its timer
    is armed only when a piece of input leaves it unfinished, so the common request,
    whose head and body come in one read, arms none. The body's clock stops while the
    server itself has stopped reading (the app has not taken what came, or a
    pipelined request waits for the answer before it): then the client is not late.
    """

    limits: ClassVar[ServerSettings] = ServerSettings()

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        limits = self.limits
        self._room = room_of(server_state)
        self._address: str | None = None
        self._evicted = False
        self._max_head = limits.max_header_bytes
        self._max_headers = limits.max_headers
        self._head_timeout = limits.header_timeout
        self._head_pending = True
        self._head_begun = False
        self._head_bytes = 0
        self._heads_done = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_pending = False
        self._body_started = 0.0
        self._body_bytes = 0
        self._body_timer: asyncio.TimerHandle | None = None
        self._refusal: tuple[int, str, str] | None = None
        self._discarding = False
        self._discarded = 0
        self._linger_timer: asyncio.TimerHandle | None = None

    # -- connection ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limits, room = self.limits, self._room
        per_address = limits.max_connections_per_address
        if per_address:
            key = address_key(self.client)
            if key is not None:
                self._address = key
                count = room.per_address[key] = room.per_address.get(key, 0) + 1
                if count > per_address:
                    self._refuse(
                        429,
                        "too_many_connections_from_address",
                        f"more than {per_address} connections are open from this address",
                    )
                    return
        if len(self.connections) - room.closing > limits.max_connections and not room.make_room():
            self._refuse(503, "too_many_connections", "the server has too many connections open")
            return
        room.waiting[self] = None
        # Armed at once: a connection that never sends a complete head is closed too.
        self._head_timer = self.loop.call_later(self._head_timeout, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._leave()
        super().connection_lost(exc)

    def handle_websocket_upgrade(self) -> None:
        # The connection is the WebSocket protocol's from now on (uvicorn stops
        # counting it here too): this one's connection_lost will not come.
        self._leave()
        super().handle_websocket_upgrade()

    def _leave(self) -> None:
        """Stop this protocol's timers and take it out of what the room counts."""
        self._cancel_head_timer()
        self._cancel_body_timer()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        room = self._room
        room.waiting.pop(self, None)
        room.lingering.pop(self, None)
        if self._evicted:
            self._evicted = False
            room.closing -= 1
        if self._address is not None:
            left = room.per_address[self._address] - 1
            if left:
                room.per_address[self._address] = left
            else:
                del room.per_address[self._address]
            self._address = None

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            self._discard(len(data))
            return
        self._unset_keepalive_if_required()
        if self._head_pending:
            if len(data) > self._max_head - self._head_bytes:
                self._receive_long_head(data)
            else:
                self._head_bytes += len(data)
                try:
                    self.parser.feed_data(data)
                except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
                    self._parse_stopped(exc)
            if (
                self._head_pending
                and (self._head_bytes or self._head_begun)
                and self._head_timer is None
            ):
                # Part of a head arrived (a whole request and nothing more leaves
                # none): the rest must follow within header_timeout.
                self._arm_head_timer()
        else:
            if self._body_pending:
                # Counted as it comes (chunk framing too: a byte is a byte of progress).
                self._body_bytes += len(data)
            try:
                self.parser.feed_data(data)
            except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
                self._parse_stopped(exc)
            if self._head_pending and self._head_begun and self._head_timer is None:
                # A pipelined request began after this piece's body.
                self._arm_head_timer()
        if self._body_pending and self._body_timer is None:
            # A body began in this piece and did not end in it.
            self._body_bytes = 0
            self._arm_body_timer()

    def _receive_long_head(self, data: bytes | memoryview) -> None:
        """Feed ``data``, more than the room left for the pending head, letting at most
        ``max_header_bytes`` of one head reach the parser."""
        while True:
            room = self._max_head - self._head_bytes
            if len(data) <= room:
                self._head_bytes += len(data)
                self._feed(data)
                return
            heads_done = self._heads_done
            view = memoryview(data)
            self._head_bytes = self._max_head
            self._feed(view[:room])
            if self._discarding or self.transport.is_closing():
                return
            if self._heads_done == heads_done:
                self._refuse(
                    431,
                    "header_too_large",
                    f"the request head is larger than {self._max_head} bytes",
                )
                return
            data = view[room:]
            if not self._head_pending:
                self._feed(data)
                return

    def _feed(self, data: bytes | memoryview) -> None:
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            self._parse_stopped(exc)

    def _parse_stopped(self, exc: Exception) -> None:
        """What uvicorn's protocol does when the parser stops, and 431 for a refusal."""
        if isinstance(exc, httptools.HttpParserUpgrade):
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        elif self._refusal is not None:
            self._refuse(*self._refusal)
        else:
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)

    # -- parser callbacks ----------------------------------------------------------

    def on_message_begin(self) -> None:
        self._head_begun = True
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        if len(self.headers) > self._max_headers:
            self._refusal = (
                431,
                "too_many_headers",
                f"the request has more than {self._max_headers} header fields",
            )
            raise _HeadRefused
        self._head_pending = False
        self._head_begun = False
        self._head_bytes = 0
        self._heads_done += 1
        self._cancel_head_timer()
        # Until on_message_complete, which follows at once when there is no body.
        self._body_pending = True
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head_pending = True
        self._body_pending = False
        if self._body_timer is not None:
            self._cancel_body_timer()
        cycle = self.cycle
        if cycle is not None and cycle.response_complete:
            # Answered before its body had arrived (413, 401): the connection is idle
            # now, waiting on its client since this moment.
            self._room.waiting.pop(self, None)
            if not self._discarding and not self.transport.is_closing():
                self._room.waiting[self] = None
            if self.timeout_keep_alive_task is None and not self.pipeline:
                # The keep-alive timer the answer armed was cancelled by the body's
                # bytes: arm it again.
                self.timeout_keep_alive_task = self.loop.call_later(
                    self.timeout_keep_alive, self.timeout_keep_alive_handler
                )
        else:
            self._room.waiting.pop(self, None)  # the server's turn

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.pipeline and not self._discarding and not self.transport.is_closing():
            # Waiting on the client again (its next request, or the rest of a body
            # answered early, whose place in the order is kept).
            self._room.waiting.setdefault(self, None)

    # -- timers and refusals ---------------------------------------------------------

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _arm_head_timer(self) -> None:
        if not self._discarding and not self.transport.is_closing():
            self._head_timer = self.loop.call_later(self._head_timeout, self._head_timed_out)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._head_pending or self._discarding or self.transport.is_closing():
            return
        if self._head_bytes or self._head_begun:
            self._refuse(
                408,
                "header_timeout",
                f"the request head did not arrive within {self._head_timeout} s",
            )
        else:
            self._room.waiting.pop(self, None)
            self.transport.close()

    def _cancel_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _arm_body_timer(self) -> None:
        """Start the pending body's clock now (the bytes of the piece its head came in
        do not count: body_grace covers them)."""
        if not self._discarding and not self.transport.is_closing():
            self._body_started = self.loop.time()
            self._body_timer = self.loop.call_at(self._body_deadline(), self._body_timed_out)

    def _body_deadline(self) -> float:
        """When the pending body is late: ``body_grace`` after its start plus the time
        its bytes so far earned at ``body_min_rate``, and never after ``body_timeout``."""
        limits = self.limits
        allowed = limits.body_timeout
        if limits.body_min_rate:
            allowed = min(allowed, limits.body_grace + self._body_bytes / limits.body_min_rate)
        return self._body_started + allowed

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if not self._body_pending or self._discarding or self.transport.is_closing():
            return
        if self.flow.read_paused:
            # The server is not reading (see the class docstring): counted again from
            # now, as if the body began now.
            self._body_bytes = 0
            self._arm_body_timer()
            return
        deadline = self._body_deadline()
        if deadline > self.loop.time() + 0.001:  # what arrived meanwhile moved it
            self._body_timer = self.loop.call_at(deadline, self._body_timed_out)
            return
        limits = self.limits
        self._cut_body(
            408,
            "body_timeout",
            f"the request body did not arrive in time ({limits.body_min_rate} bytes a second "
            f"after {limits.body_grace} s, all of it within {limits.body_timeout} s)",
            linger=True,
        )

    def _refuse(self, status: int, code: str, message: str) -> None:
        """Answer ``status`` with a JSON error, then read and drop input until the
        client closes, for at most LINGER_SECONDS / LINGER_BYTES."""
        self._stop_reading(status, code)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # An earlier request's answer is still being written: it ends the connection.
            cycle.keep_alive = False
            return
        self._answer(status, code, message)
        self._linger()

    def _cut_body(self, status: int, code: str, message: str, *, linger: bool) -> None:
        """End a request whose body is still arriving: its handler is told the client
        is gone (``receive()`` answers ``http.disconnect``, what it sends is dropped),
        and ``status`` is answered unless an answer was already begun (then the
        connection is only closed)."""
        self._stop_reading(status, code)
        cycle = self.cycle
        speak = True
        if cycle is not None:
            # An answer sent, being sent, or to come for an earlier pipelined request.
            speak = not (cycle.response_started or self.pipeline)
            if not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()
        if speak:
            self._answer(status, code, message)
        if speak and linger:
            self._linger()
        else:
            self.transport.close()

    def _evict(self) -> None:
        """Close this connection to make room for a new one (it waits on its client, or
        lingers after a refusal): ``503`` to a request under way, silence otherwise."""
        room = self._room
        room.waiting.pop(self, None)
        room.lingering.pop(self, None)
        if self._evicted:
            return
        self._evicted = True
        room.closing += 1  # until its connection_lost
        if self.transport.is_closing():
            return
        message = "the server needed this connection: it had waited longest for its client"
        if self._discarding:
            self.transport.close()
        elif self._body_pending:
            self._cut_body(503, "too_many_connections", message, linger=False)
        elif (
            self._head_pending
            and (self._head_bytes or self._head_begun)
            and (self.cycle is None or self.cycle.response_complete)
        ):
            self._stop_reading(503, "too_many_connections")
            self._answer(503, "too_many_connections", message)
            self.transport.close()
        else:
            self._stop_reading(503, "too_many_connections")
            self.transport.close()

    def _stop_reading(self, status: int, code: str) -> None:
        """No more input is parsed on this connection, and no timer of it runs."""
        self._cancel_head_timer()
        self._cancel_body_timer()
        self._unset_keepalive_if_required()
        self._head_pending = False
        self._body_pending = False
        self._discarding = True
        self._room.waiting.pop(self, None)
        log.debug("http_refused", status=status, reason=code, client=_client(self.client))

    def _answer(self, status: int, code: str, message: str) -> None:
        """Write ``status`` with a JSON error and ``connection: close``, and shut the
        sending side."""
        body = json.dumps({"error": code, "message": message}).encode()
        content = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            content.extend([name, b": ", value, b"\r\n"])
        content.extend(
            [
                b"content-type: application/json\r\n",
                b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
                b"connection: close\r\n\r\n",
                body,
            ]
        )
        self.transport.write(b"".join(content))
        if self.transport.can_write_eof():
            self.transport.write_eof()

    def _linger(self) -> None:
        """Read and drop what the client still sends, then close (see LINGER_SECONDS);
        closed sooner when the server needs room."""
        if not self.transport.is_closing():
            self._room.lingering[self] = None
            self._linger_timer = self.loop.call_later(LINGER_SECONDS, self.transport.close)

    def _discard(self, size: int) -> None:
        self._discarded += size
        if self._discarded > LINGER_BYTES:
            self.transport.close()


def _client(client: tuple[str, int] | None) -> str | None:
    return f"{client[0]}:{client[1]}" if client else None


def protocol_class(limits: ServerSettings) -> type[BoundedHttpToolsProtocol]:
    """A :class:`BoundedHttpToolsProtocol` subclass enforcing ``limits``."""
    return type("RelayboxHttpProtocol", (BoundedHttpToolsProtocol,), {"limits": limits})


def uvicorn_config(
    app: Any, limits: ServerSettings, *, host: str, port: int, log_level: str = "warning"
) -> uvicorn.Config:
    """The uvicorn configuration ``relaybox serve`` runs ``app`` with."""
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        http=protocol_class(limits),
        timeout_keep_alive=limits.keep_alive_timeout,  # type: ignore[arg-type]
        backlog=limits.backlog,
    )


def run(
    app: Any,
    limits: ServerSettings,
    *,
    host: str,
    port: int,
    sock: socket.socket | None = None,
) -> None:
    """Serve ``app`` until SIGTERM/SIGINT, as ``uvicorn.run`` does with these settings,
    on ``sock`` (:func:`bind` it first to say where it serves only once it is bound;
    else it is bound here, and a taken port raises :class:`BindError`)."""
    _raise_fd_limit(limits.max_connections + _FD_HEADROOM)
    config = uvicorn_config(app, limits, host=host, port=port)
    server = uvicorn.Server(config)
    server.run(sockets=[sock if sock is not None else bind(host, port)])
    if not server.started:
        raise SystemExit(STARTUP_FAILURE)


class BindError(OSError):
    """The address to serve on cannot be bound (taken, or not this machine's)."""


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (IPv6 when ``host`` is an IPv6 address), as
    uvicorn binds one; :class:`BindError` names the address when it cannot be."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family=family, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        shown = f"[{host}]" if family == socket.AF_INET6 else host
        raise BindError(exc.errno, f"cannot serve on {shown}:{port}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock


def _raise_fd_limit(wanted: int) -> None:
    """Raise the soft RLIMIT_NOFILE to ``wanted`` (within the hard limit): a process
    that runs out of descriptors stops accepting connections well below the cap."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if new > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    if new < wanted:
        log.warning("fd_limit_low", soft=new, hard=hard, max_connections_needs=wanted)
