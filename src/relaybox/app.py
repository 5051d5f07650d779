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
import gc
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from relaybox.clock import Clock, SystemClock
from relaybox.config import Settings, load_settings
from relaybox.errors import ConfigurationError
from relaybox.inbox import Acceptor
from relaybox.log import short_error
from relaybox.metrics import Metrics
from relaybox.receiver import Receiver
from relaybox.sources.base import Source
from relaybox.store import AcceptOutcome, NewDelivery, Store, open_store
from relaybox.worker import Context, Handler, Hooks, Registration, Worker

__all__ = ["ROLES", "Relaybox"]

ROLES = ("receiver", "api", "admin", "worker", "dispatcher", "maintenance")
"""Every role ``relaybox serve`` can run; all are on by default."""

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
        self._handlers: list[Registration] = []
        self._store: Store | None = None
        self._acceptor: Acceptor | None = None
        self._heap_frozen = False
        self._inline_worker: Worker | None = None
        self._background: list[asyncio.Task[None]] = []
        self._workers: list[Any] = []
        self._made: weakref.WeakSet[Worker] = weakref.WeakSet()  # box.worker()'s
        self.receiver = Receiver(self)
        if self.settings.sources:
            from relaybox import sources as _sources

            for name, options in self.settings.sources.items():
                try:
                    self.source(name, _sources.from_config(dict(options)))
                except ConfigurationError as exc:
                    raise ConfigurationError(f"[sources.{name}]: {exc}") from None

    # -- configuration --------------------------------------------------------

    def source(self, name: str, source: Source) -> Source:
        """Register ``source`` under ``name``: it answers ``POST /webhooks/{name}``."""
        if not name or "/" in name:
            raise ConfigurationError(f"invalid source name {name!r}")
        source.name = name
        self.sources[name] = source
        return source

    def handler(
        self,
        source: str,
        event_type: str = "*",
        *,
        business_key: Callable[[Context], str | None] | None = None,
        fingerprint: str = "",
    ) -> Callable[[Handler], Handler]:
        """Register a handler for ``(source, event_type)``; both accept ``*`` wildcards.
        The most specific registration wins (fewest wildcards, then first registered).

        ``business_key`` declares the business key the handler will ask for with
        ``ctx.once(key)``, computed from its context (``lambda ctx:
        f"acct:{ctx.payload['invoice']}:grant"``; ``None``: none for this event), with
        its ``fingerprint``. The handler's code stays the same (``ctx.once()`` without
        arguments also means the declared key). On PostgreSQL the worker then claims a
        group's keys with its BEGIN, so ``ctx.once()`` answers without a round trip of
        its own; a key that is taken already, or that two events of the group name,
        sends the group back to asking per event, and a claimed key the handler does
        not ask for is released with the COMMIT: the key is recorded exactly when the
        handler's ``ctx.once()`` says True, as without a declaration."""

        def register(fn: Handler) -> Handler:
            self._handlers.append(Registration(source, event_type, fn, business_key, fingerprint))
            return fn

        return register

    def handler_for(self, source: str, event_type: str) -> Handler | None:
        found = self.registration_for(source, event_type)
        return None if found is None else found.handler

    def registration_for(self, source: str, event_type: str) -> Registration | None:
        """The registration whose handler runs for ``(source, event_type)``."""
        matches = [
            (r.source.count("*") + r.event_type.count("*"), i, r)
            for i, r in enumerate(self._handlers)
            if fnmatch.fnmatchcase(source, r.source)
            and fnmatch.fnmatchcase(event_type, r.event_type)
        ]
        return min(matches, key=lambda m: (m[0], m[1]))[2] if matches else None

    # -- parts ----------------------------------------------------------------

    @property
    def store(self) -> Store:
        if self._store is None:
            url = self.settings.database_url
            options: dict[str, Any] = {}
            if not url.startswith("sqlite"):
                # Each worker chain holds a connection of the engine's pool while its
                # events run: room for all of them, and for the other roles besides.
                options["pool_size"] = max(10, self.settings.worker.concurrency + 2)
            self._store = open_store(url, **options)
        return self._store

    @property
    def acceptor(self) -> Acceptor:
        if self._acceptor is None:
            self._acceptor = Acceptor(
                self.store,
                timeout=self.settings.accept_timeout,
                committers=self.settings.accept_committers,
            )
        return self._acceptor

    def worker(self, **options: Any) -> Worker:
        worker = Worker(self, **options)
        self._made.add(worker)  # close() waits for its chains to give connections back
        return worker

    @property
    def outbound(self) -> Any:
        """The sending side: settings, SSRF guard, channels (:mod:`relaybox.outbound`)."""
        from relaybox.outbound import outbound

        return outbound(self)

    def dispatcher(self, **options: Any) -> Any:
        """The outbox dispatcher (``relaybox dispatch``)."""
        from relaybox.outbound.dispatcher import Dispatcher

        return Dispatcher(self, **options)

    def maintenance(self, **options: Any) -> Any:
        """The scheduled maintenance loop (retention purge; ``relaybox maintenance``)."""
        from relaybox.retention import Maintenance

        return Maintenance(self, **options)

    async def publish(
        self,
        conn: Any,
        event_type: str,
        data: Any,
        *,
        tenant: str,
        idempotency_key: str | None = None,
        **options: Any,
    ) -> Any:
        """Publish an outbound event inside the caller's transaction (``conn``): one
        message row plus one outbox row per subscribed, enabled endpoint, committed
        with the caller's change or not at all."""
        from relaybox.outbound.publish import publish

        return await publish(
            self, conn, event_type, data, tenant=tenant, idempotency_key=idempotency_key, **options
        )

    async def migrate(self) -> list[str]:
        """Create or upgrade relaybox's tables, then seal the endpoint secrets older
        versions stored in plaintext (:func:`relaybox.outbound.endpoints.seal_plaintext`).
        Returns the migrations applied."""
        from relaybox.outbound.endpoints import seal_plaintext

        applied = await self.store.migrate()
        await seal_plaintext(self)
        return applied

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
        if outcome.status == "accepted" and result.outbox_created:
            store.wake("outbox")
        return outcome

    # -- running --------------------------------------------------------------

    def asgi(self, *, roles: tuple[str, ...] = ROLES) -> Any:
        """The app served by ``relaybox serve``. HTTP roles: ``receiver``
        (``/webhooks/{source}``), ``api`` (tenant-facing ``/api/v1``), ``admin``
        (``/admin``: operator API and dashboard); background roles: ``worker``,
        ``dispatcher``. ``/healthz`` and ``/metrics`` are always there."""
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, Response
        from starlette.routing import BaseRoute, Mount, Route

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
            body = await self.metrics.scrape(self)
            return Response(body, media_type="text/plain; version=0.0.4")

        @contextlib.asynccontextmanager
        async def lifespan(_: Any) -> Any:
            if "api" in roles or "dispatcher" in roles:
                # A broken key file stops the start with its message (KeyFileError),
                # rather than every endpoint's deliveries and secrets failing later.
                self.outbound.vault.check()
            if "receiver" in roles:
                await self.warm_receiver()
            await self.start(roles)
            try:
                yield
            finally:
                await self.close()

        routes: list[BaseRoute] = [
            Route("/healthz", healthz),
            Route("/metrics", metrics),
        ]
        if "receiver" in roles:
            routes.append(Mount("/webhooks", app=self.receiver))
        if "api" in roles:
            from relaybox.outbound.api import build_api

            routes.append(Mount("/api/v1", app=build_api(self)))
        if "admin" in roles:
            from relaybox.admin import build_admin

            routes.append(Mount("/admin", app=build_admin(self)))
        return Starlette(routes=routes, lifespan=lifespan)

    def freeze_startup_heap(self) -> None:
        """Once started, the objects alive now (modules, the app, its settings) live as
        long as the process: ``gc.freeze()`` takes them out of the cyclic collector's
        passes. Its full collections over that heap stalled requests 30-50 ms (the
        accept's p99, bench/README.md). Setting ``gc_freeze = false`` turns it off."""
        if self.settings.gc_freeze and not self._heap_frozen:
            gc.freeze()  # O(1): the generations' lists move to the permanent one
            self._heap_frozen = True

    async def warm_receiver(self) -> None:
        """Open the accept path's database connections before the first request
        (:meth:`Store.warm_accept`). Best effort, within ``accept_timeout``: with the
        database down the server still starts, and answers 503 until it is back."""
        try:
            async with asyncio.timeout(self.settings.accept_timeout):
                await self.store.warm_accept(self.acceptor.committers)
        except Exception as exc:  # logged; requests get 503 until the database answers
            log.warning("receiver_warm_failed", error=short_error(exc))

    async def start(self, roles: tuple[str, ...] = ("worker",)) -> None:
        """Start background roles (``worker``, ``dispatcher``, ``maintenance``) in the running loop.
        Each runner has ``run()`` (until stopped) and ``stop()`` (finish what it holds)."""
        self.freeze_startup_heap()
        factories = {
            "worker": self.worker,
            "dispatcher": self.dispatcher,
            "maintenance": self.maintenance,
        }
        for role in roles:
            if role in factories:
                runner = factories[role]()
                self._workers.append(runner)
                self._background.append(asyncio.create_task(runner.run(), name=f"relaybox-{role}"))

    async def lifespan(self, receive: Any, send: Any) -> None:
        """ASGI lifespan for the bare receiver (when it is the whole app)."""
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.warm_receiver()
                self.freeze_startup_heap()
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
        for made in list(self._made):
            await made.drain()
        if self._acceptor is not None:
            await self._acceptor.close()
            self._acceptor = None
        if self._store is not None:
            await self._store.close()
            self._store = None
