"""The ``Relaybox`` facade: settings, store, sources, handlers; builds the ASGI app
and the runners.

    box = Relaybox("sqlite:///relaybox.db")
    box.source("stripe", sources.stripe(secrets=["whsec_..."], account="acct_123"))

    @box.handler("stripe", "invoice.paid")
    async def grant(ctx): ...

    app.mount("/webhooks", box.receiver)     # or: relaybox serve --app myapp:box
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from relaybox.clock import Clock, SystemClock
from relaybox.config import Settings, load_settings
from relaybox.errors import ConfigurationError
from relaybox.inbox import Acceptor
from relaybox.metrics import Metrics
from relaybox.receiver import Receiver
from relaybox.sources.base import Source
from relaybox.store import AcceptOutcome, NewDelivery, Store, open_store
from relaybox.worker import Handler, Hooks, Worker

__all__ = ["Relaybox"]

log = structlog.get_logger("relaybox")


class Relaybox:
    def __init__(
        self,
        database_url: str | None = None,
        *,
        settings: Settings | None = None,
        config: str | Path | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.settings = settings or load_settings(config)
        if database_url is not None:
            self.settings = self.settings.model_copy(update={"database_url": database_url})
        self.clock: Clock = clock or SystemClock()
        self.metrics = Metrics()
        self.hooks = Hooks()
        self.sources: dict[str, Source] = {}
        self._handlers: list[tuple[str, str, Handler]] = []
        self._store: Store | None = None
        self._acceptor: Acceptor | None = None
        self._inline_worker: Worker | None = None
        self._background: list[asyncio.Task[None]] = []
        self._workers: list[Worker] = []
        self.receiver = Receiver(self)
        if self.settings.sources:
            from relaybox import sources as _sources

            for name, options in self.settings.sources.items():
                self.source(name, _sources.from_config(dict(options)))

    # -- configuration --------------------------------------------------------

    def source(self, name: str, source: Source) -> Source:
        """Register ``source`` under ``name``: it answers ``POST /webhooks/{name}``."""
        if not name or "/" in name:
            raise ConfigurationError(f"invalid source name {name!r}")
        source.name = name
        self.sources[name] = source
        return source

    def handler(self, source: str, event_type: str = "*") -> Callable[[Handler], Handler]:
        """Register a handler for ``(source, event_type)``; both accept ``*`` wildcards.
        The most specific registration wins (fewest wildcards, then first registered)."""

        def register(fn: Handler) -> Handler:
            self._handlers.append((source, event_type, fn))
            return fn

        return register

    def handler_for(self, source: str, event_type: str) -> Handler | None:
        matches = [
            (src.count("*") + typ.count("*"), i, fn)
            for i, (src, typ, fn) in enumerate(self._handlers)
            if fnmatch.fnmatchcase(source, src) and fnmatch.fnmatchcase(event_type, typ)
        ]
        return min(matches, key=lambda m: (m[0], m[1]))[2] if matches else None

    # -- parts ----------------------------------------------------------------

    @property
    def store(self) -> Store:
        if self._store is None:
            self._store = open_store(self.settings.database_url)
        return self._store

    @property
    def acceptor(self) -> Acceptor:
        if self._acceptor is None:
            self._acceptor = Acceptor(self.store, timeout=self.settings.accept_timeout)
        return self._acceptor

    def worker(self, **options: Any) -> Worker:
        return Worker(self, **options)

    async def migrate(self) -> list[str]:
        return await self.store.migrate()

    async def accept_inline(self, delivery: NewDelivery) -> AcceptOutcome:
        """Inline mode: store the delivery and run its handler in one transaction.

        A failing handler rolls back only its own savepoint: the delivery still
        commits as pending (with the error recorded) for the worker, so nothing is
        lost and the sender still gets its 2xx after the COMMIT.
        """
        if self._inline_worker is None:
            self._inline_worker = Worker(self, name="inline")
        store = self.store
        async with store.transaction() as conn:
            [outcome] = await store.inbox_insert(conn, [delivery])
            if outcome.status == "accepted":
                [event] = await store.inbox_lock(conn, [outcome.inbox_id])
                result = await self._inline_worker.process(conn, event)
                if result.kind == "done":
                    await store.inbox_complete(conn, [event.id], self.clock.now())
        return outcome

    # -- running --------------------------------------------------------------

    def asgi(self, *, roles: tuple[str, ...] = ("receiver", "worker")) -> Any:
        """The app served by ``relaybox serve``: ``/webhooks/{source}``, ``/healthz``,
        ``/metrics``; the worker runs in the same process when its role is on."""
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, Response
        from starlette.routing import Mount, Route

        async def healthz(_: Request) -> Response:
            try:
                applied, latest = await self.store.schema_version()
            except Exception:
                return JSONResponse({"status": "unavailable"}, status_code=503)
            ok = applied == latest
            return JSONResponse(
                {"status": "ok" if ok else "migrations_pending", "schema": applied},
                status_code=200 if ok else 503,
            )

        async def metrics(_: Request) -> Response:
            return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")

        @contextlib.asynccontextmanager
        async def lifespan(_: Any) -> Any:
            await self.start(roles)
            try:
                yield
            finally:
                await self.close()

        routes = [
            Route("/healthz", healthz),
            Route("/metrics", metrics),
        ]
        if "receiver" in roles:
            routes.append(Mount("/webhooks", app=self.receiver))
        return Starlette(routes=routes, lifespan=lifespan)

    async def start(self, roles: tuple[str, ...] = ("worker",)) -> None:
        """Start background roles in the running event loop."""
        if "worker" in roles:
            worker = self.worker()
            self._workers.append(worker)
            self._background.append(asyncio.create_task(worker.run(), name="relaybox-worker"))

    async def lifespan(self, receive: Any, send: Any) -> None:
        """ASGI lifespan for the bare receiver (when it is the whole app)."""
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def close(self) -> None:
        """Stop background roles gracefully (finishing what they hold), then close."""
        for worker in self._workers:
            worker.stop()
        for task in self._background:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, 30)
        self._background.clear()
        self._workers.clear()
        if self._acceptor is not None:
            await self._acceptor.close()
            self._acceptor = None
        if self._store is not None:
            await self._store.close()
            self._store = None
