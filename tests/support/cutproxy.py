"""A TCP proxy in front of a shared broker that cuts every connection once a number of
bytes has gone upstream: a connection lost mid-publish, without touching the server."""

from __future__ import annotations

import asyncio
import contextlib


class CutProxy:
    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.server: asyncio.Server | None = None
        self.port = 0
        self.upstream_bytes = 0
        self.cuts = 0
        self._cut_at: int | None = None
        self._refusing = False
        self._conns: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> CutProxy:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    def cut_after(self, nbytes: int) -> None:
        """Cut every connection (and refuse new ones) once ``nbytes`` more bytes have
        gone to the broker."""
        self._cut_at = self.upstream_bytes + nbytes

    def cut(self) -> None:
        self._refusing = True
        self._cut_at = None
        self.cuts += 1
        for w in list(self._conns):
            with contextlib.suppress(Exception):
                w.transport.abort()
        self._conns.clear()

    def restore(self) -> None:
        self._refusing = False

    @property
    def refusing(self) -> bool:
        return self._refusing

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._refusing:
            writer.transport.abort()
            return
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._conns.update((writer, up_w))

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, up: bool) -> None:
            with contextlib.suppress(Exception):
                while data := await r.read(65536):
                    if self._refusing:
                        break
                    w.write(data)
                    await w.drain()
                    if up:
                        self.upstream_bytes += len(data)
                        if self._cut_at is not None and self.upstream_bytes >= self._cut_at:
                            self.cut()
            with contextlib.suppress(Exception):
                w.transport.abort()

        await asyncio.gather(pipe(reader, up_w, True), pipe(up_r, writer, False))
        self._conns.difference_update((writer, up_w))
