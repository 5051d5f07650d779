"""Local receivers for outbound tests: an HTTP endpoint and an SMTP server, both on
127.0.0.1 and port 0, in the test's own event loop.

:class:`HttpReceiver` records every request (headers, raw body, arrival time) and
answers from a script: a fixed :class:`Reply`, a list (the n-th request gets the
n-th reply, the last one repeats) or a function of the request. A reply may hang
until :meth:`HttpReceiver.release` (the receiver releases on close, so a test never
waits for a hung handler). ``on_request`` runs when a request arrives, before the
answer (the kill test SIGKILLs the dispatcher there).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from typing import Any

from aiohttp import web
from aiosmtpd.smtp import SMTP, Envelope, Session

__all__ = ["HttpReceiver", "Reply", "Seen", "SmtpSink"]


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: bytes = b'{"ok":true}'
    headers: dict[str, str] = field(default_factory=dict)
    hang: bool = False
    delay: float = 0.0


@dataclass(frozen=True)
class Seen:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float

    @property
    def webhook_id(self) -> str:
        return self.headers["webhook-id"]


Script = Reply | Sequence[Reply] | Callable[[Seen], Reply]


class HttpReceiver:
    def __init__(
        self,
        script: Script = Reply(),
        *,
        on_request: Callable[[Seen], Any] | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.host = host
        self.script = script
        self.on_request = on_request
        self.requests: list[Seen] = []
        self.in_flight = 0
        self.peak_in_flight = 0
        self._released = asyncio.Event()
        self._arrived = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/hook"

    def reply_for(self, seen: Seen, index: int) -> Reply:
        if isinstance(self.script, Reply):
            return self.script
        if callable(self.script):
            return self.script(seen)
        return self.script[min(index, len(self.script) - 1)]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        seen = Seen(
            path=request.path_qs,
            headers={k.lower(): v for k, v in request.headers.items()},
            body=await request.read(),
            at=time.monotonic(),
        )
        index = len(self.requests)
        self.requests.append(seen)
        async with self._arrived:
            self._arrived.notify_all()
        if self.on_request is not None:
            self.on_request(seen)
        reply = self.reply_for(seen, index)
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            if reply.hang:
                await self._released.wait()
            elif reply.delay:
                await asyncio.sleep(reply.delay)
            return web.Response(status=reply.status, body=reply.body, headers=reply.headers)
        finally:
            self.in_flight -= 1

    async def start(self) -> HttpReceiver:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    def release(self) -> None:
        """Let every hanging handler answer."""
        self._released.set()

    async def wait_for(self, count: int, within: float = 5.0) -> list[Seen]:
        """Until ``count`` requests arrived; returns them."""

        async def enough() -> None:
            async with self._arrived:
                await self._arrived.wait_for(lambda: len(self.requests) >= count)

        await asyncio.wait_for(enough(), within)
        return self.requests[:count]

    async def close(self) -> None:
        self.release()
        if self._runner is not None:
            await self._runner.cleanup()

    async def __aenter__(self) -> HttpReceiver:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class SmtpSink:
    """An SMTP server (aiosmtpd's protocol on the running loop) keeping every message."""

    def __init__(self, *, rcpt_reply: str | None = None, data_reply: str | None = None) -> None:
        """``rcpt_reply``/``data_reply``: an SMTP reply (``"550 5.1.1 no such user"``)
        refusing every recipient, or every message at the end of DATA."""
        self.messages: list[Message] = []
        self.envelopes: list[tuple[str, list[str]]] = []
        self.rcpt_reply, self.data_reply = rcpt_reply, data_reply
        self._server: asyncio.AbstractServer | None = None
        self.port = 0

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: Any
    ) -> str:
        """aiosmtpd's hook: take the recipient, unless told to refuse it."""
        if self.rcpt_reply is not None:
            return self.rcpt_reply
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        """aiosmtpd's hook (its name is fixed): keep the message, accept it."""
        if self.data_reply is not None:
            return self.data_reply
        content = envelope.original_content or b""
        self.messages.append(message_from_bytes(content))
        self.envelopes.append((str(envelope.mail_from), list(envelope.rcpt_tos)))
        return "250 Message accepted for delivery"

    async def start(self) -> SmtpSink:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: SMTP(self, hostname="relaybox.test"), "127.0.0.1", 0
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def __aenter__(self) -> SmtpSink:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class OrderCheckingReceiver:
    """An ordered endpoint's receiver: answers 500 to ``fail`` of new messages at
    random; accepts a key's message only as the next one after the last it accepted;
    a repeat of an accepted one (an uncertain resend) is answered 200 and dropped, as a
    receiver using ``webhook-sequence`` would."""

    def __init__(self, keys: Sequence[str], *, fail: float = 0.3, seed: int = 42) -> None:
        self.accepted: dict[str, list[int]] = {k: [] for k in keys}
        self.out_of_order: list[tuple[str, int, int]] = []
        self.fail = fail
        self.rng = random.Random(seed)

    def reply(self, seen: Seen) -> Reply:
        key = str(json.loads(seen.body)["orderingKey"])
        seq = int(seen.headers["webhook-sequence"])
        done = self.accepted[key]
        last = done[-1] if done else 0
        if seq <= last:
            return Reply(200)  # stale: already have it
        if seq != last + 1:
            self.out_of_order.append((key, last, seq))
            return Reply(500)
        if self.rng.random() < self.fail:
            return Reply(500)
        done.append(seq)
        return Reply(200)

    def total(self) -> int:
        return sum(len(v) for v in self.accepted.values())
