"""A TCP proxy the tests put between relaybox and PostgreSQL, to cut the database
off mid-test without touching the shared server: :meth:`TcpProxy.cut` resets every
connection, :meth:`TcpProxy.blackhole` keeps them open but stops forwarding (a network
that drops packets) until :meth:`TcpProxy.flow`, and ``delay`` holds every chunk that
long before forwarding it (a slow network)."""

from __future__ import annotations

import asyncio
import contextlib


class TcpProxy:
    def __init__(
        self,
        *,
        host: str | None = None,
        port: int | None = None,
        unix: str | None = None,
        listen: str = "127.0.0.1",
    ):
        self.target_host, self.target_port, self.target_unix = host, port, unix
        self.listen = listen
        self.server: asyncio.base_events.Server | None = None
        self.port = 0
        self._conns: set[asyncio.StreamWriter] = set()
        self._cut = False
        self._upstream: dict[str, set[int]] = {}  # client address -> our ports to the target
        self.delay = 0.0  # seconds each chunk waits before it is forwarded
        self._flowing = asyncio.Event()
        self._flowing.set()

    async def start(self) -> TcpProxy:
        self.server = await asyncio.start_server(self._serve, self.listen, self.port)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            writer.close()
            return
        try:
            if self.target_unix:
                up_r, up_w = await asyncio.open_unix_connection(self.target_unix)
            else:
                up_r, up_w = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError:
            writer.close()
            return
        self._conns.update((writer, up_w))
        client = str(writer.get_extra_info("peername", ("?",))[0])
        ours = up_w.get_extra_info("sockname")
        port = ours[1] if isinstance(ours, tuple) else None
        if port is not None:
            self._upstream.setdefault(client, set()).add(port)

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await r.read(65536):
                    if self.delay:
                        await asyncio.sleep(self.delay)
                    await self._flowing.wait()
                    w.write(data)
                    await w.drain()
            with contextlib.suppress(Exception):
                w.close()

        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))
        self._conns.difference_update((writer, up_w))
        if port is not None:
            self._upstream.get(client, set()).discard(port)

    def upstream_ports(self, client: str) -> set[int]:
        """The local ports of this proxy's open connections to a TCP target on behalf of
        ``client`` (an address): what the target sees as their ``client_port``."""
        return set(self._upstream.get(client, ()))

    def cut(self) -> None:
        """Drop every open connection and refuse new ones."""
        self._cut = True
        for w in list(self._conns):
            with contextlib.suppress(Exception):
                w.transport.abort()
        self._conns.clear()

    def restore(self) -> None:
        self._cut = False

    def blackhole(self) -> None:
        """Keep every connection open but forward nothing (either way) until :meth:`flow`."""
        self._flowing.clear()

    def flow(self) -> None:
        self._flowing.set()

    async def close(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
