"""The HTTP server that ``relaybox serve`` runs: uvicorn on httptools, every request
head bounded in size, header count and time, and the open connections capped.

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
"""

from __future__ import annotations

import asyncio
import json
import resource
from typing import Any, ClassVar

import httptools
import structlog
import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from relaybox.config import ServerSettings

__all__ = ["BoundedHttpToolsProtocol", "protocol_class", "run", "uvicorn_config"]

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
    """uvicorn's httptools protocol with bounded request heads and connections.

    ``limits`` is set on the subclass :func:`protocol_class` makes. A head is
    "pending" from the connection's start, and again from the end of each request,
    until its headers are complete; bytes received while a head is pending are
    counted and fed to the parser at most up to ``max_header_bytes``. A head that
    begins inside a piece of input already being parsed (a pipelined request after a
    body) is counted from the next piece on, so what is parsed of it uncounted is at
    most that one socket read.
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
        self._max_head = limits.max_header_bytes
        self._max_headers = limits.max_headers
        self._head_timeout = limits.header_timeout
        self._head_pending = True
        self._head_begun = False
        self._head_bytes = 0
        self._heads_done = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._refusal: tuple[int, str, str] | None = None
        self._discarding = False
        self._discarded = 0
        self._linger_timer: asyncio.TimerHandle | None = None

    # -- connection ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._refuse(503, "too_many_connections", "the server has too many connections open")
            return
        # Armed at once: a connection that never sends a complete head is closed too.
        self._head_timer = self.loop.call_later(self._head_timeout, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        super().connection_lost(exc)

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
            try:
                self.parser.feed_data(data)
            except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
                self._parse_stopped(exc)
            if self._head_pending and self._head_begun and self._head_timer is None:
                # A pipelined request began after this piece's body.
                self._arm_head_timer()

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
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head_pending = True
        cycle = self.cycle
        if (
            cycle is not None
            and cycle.response_complete
            and self.timeout_keep_alive_task is None
            and not self.pipeline
            and not self.transport.is_closing()
        ):
            # Answered before its body had arrived (413, 401): the keep-alive timer the
            # answer armed was cancelled by the body's bytes; the connection is idle now.
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

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
            self.transport.close()

    def _refuse(self, status: int, code: str, message: str) -> None:
        """Answer ``status`` with a JSON error, then read and drop input until the
        client closes, for at most LINGER_SECONDS / LINGER_BYTES."""
        self._cancel_head_timer()
        self._unset_keepalive_if_required()
        self._head_pending = False
        self._discarding = True
        log.debug("http_refused", status=status, reason=code, client=_client(self.client))
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # An earlier request's answer is still being written: it ends the connection.
            cycle.keep_alive = False
            return
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


def run(app: Any, limits: ServerSettings, *, host: str, port: int) -> None:
    """Serve ``app`` until SIGTERM/SIGINT, as ``uvicorn.run`` does with these settings."""
    _raise_fd_limit(limits.max_connections + _FD_HEADROOM)
    server = uvicorn.Server(uvicorn_config(app, limits, host=host, port=port))
    server.run()
    if not server.started:
        raise SystemExit(STARTUP_FAILURE)


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
