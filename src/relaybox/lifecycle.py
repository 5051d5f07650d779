"""Running one box's roles in this process: starting the background roles (worker,
dispatcher, maintenance with its silence watch, the clock guard), the schema checked
or migrated first, and when the database is down or behind at startup, starting
them once it is ready (asking again with a growing pause); stopping them
gracefully. The box (:class:`relaybox.Relaybox`) holds one :class:`Lifecycle` and
its ``start``, ``running``, ``lifespan`` and ``close`` use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from relaybox.config import BACKGROUND_ROLES
from relaybox.errors import TABLES_MISSING, ConfigurationError
from relaybox.inbound.worker import Worker
from relaybox.log import short_error
from relaybox.runtime import Runtime
from relaybox.store import check_database_url

if TYPE_CHECKING:
    from relaybox.clock import ClockGuard
    from relaybox.inbound.registry import Inbound
    from relaybox.outbound.dispatcher import Dispatcher
    from relaybox.retention import Maintenance
    from relaybox.silence import SilenceWatch

__all__ = ["Lifecycle", "LifecycleRuntime"]

log = structlog.get_logger("relaybox")


class LifecycleRuntime(Runtime, Protocol):
    """What the lifecycle runs: a :class:`~relaybox.runtime.Runtime` (the box's
    settings, store, ...) with its clock guard and receiving side, the roles'
    factories, and what it does before they start."""

    @property
    def clock_guard(self) -> ClockGuard: ...

    @property
    def inbound(self) -> Inbound: ...

    def worker(self, **options: Any) -> Worker: ...

    def dispatcher(self, **options: Any) -> Dispatcher: ...

    def maintenance(self, **options: Any) -> Maintenance: ...

    def silence_watch(self, **options: Any) -> SilenceWatch: ...

    async def migrate(self) -> list[str]: ...

    async def refresh_webhooks(self) -> dict[str, Any]: ...

    async def close(self) -> None: ...


class Lifecycle:
    """The background roles of one box and how they start and stop."""

    def __init__(self, box: LifecycleRuntime) -> None:
        self.box = box
        self.on_ready: list[Callable[[Any], Awaitable[Any]]] = []
        """``async def fn(box)`` run once the database answers (:meth:`Relaybox.on_ready`)."""
        self._ready_ran = False
        self._heap_frozen = False
        self._background: list[asyncio.Task[None]] = []
        self._clock_task: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._workers: list[Worker | Dispatcher | Maintenance | SilenceWatch] = []
        self.made: weakref.WeakSet[Worker] = weakref.WeakSet()
        """The box's workers (``box.worker()``): :meth:`stop` waits for their chains to
        give connections back."""

    @property
    def started(self) -> bool:
        """Whether background roles run here (:meth:`start`, or :meth:`running`
        waiting for the database to start them)."""
        return bool(self._background) or self._watcher is not None

    async def run_on_ready(self) -> None:
        """Run the ``on_ready`` functions, in the order they were registered."""
        for fn in self.on_ready:
            await fn(self.box)

    def freeze_startup_heap(self) -> None:
        """Once started, the objects alive now (modules, the app, its settings) live as
        long as the process: ``gc.freeze()`` takes them out of the cyclic collector's
        passes. Its full collections over that heap stalled requests 30-50 ms (the
        accept's p99, bench/README.md). Setting ``gc_freeze = false`` turns it off."""
        if self.box.settings.gc_freeze and not self._heap_frozen:
            gc.freeze()  # O(1): the generations' lists move to the permanent one
            self._heap_frozen = True

    def widen_young_gc(self) -> None:
        """``relaybox dispatch``: the cyclic collector's young pass after
        ``dispatch_gc_threshold`` allocations, not Python's 700. With 100 attempts in
        flight, each holding its coroutines, request and response objects, a pass every
        700 allocations (every few deliveries) traversed those thousands of live objects
        again: ~0.45 ms a pass, 25-30 µs of CPU per delivery (bench/README.md). A pass
        still runs, over more objects, ten-odd times less often."""
        threshold = self.box.settings.dispatch_gc_threshold
        if threshold:
            gc.set_threshold(threshold, *gc.get_threshold()[1:])

    async def warm_receiver(self) -> None:
        """Open the accept path's database connections before the first request
        (:meth:`InboxStore.warm_accept`). Best effort, within ``accept_timeout``: with the
        database down the server still starts, and answers 503 until it is back."""
        try:
            async with asyncio.timeout(self.box.settings.accept_timeout):
                await self.box.store.inbox.warm_accept(self.box.inbound.acceptor.committers)
        except Exception as exc:  # logged; requests get 503 until the database answers
            log.warning("receiver_warm_failed", error=short_error(exc))

    async def start(self, roles: tuple[str, ...] = ("worker",)) -> None:
        """Start background roles (``worker``, ``dispatcher``, ``maintenance``) in the
        running loop: each runner's ``run()`` as a task, stopped by :meth:`stop`."""
        self.freeze_startup_heap()
        factories: dict[str, Callable[[], Worker | Dispatcher | Maintenance]] = {
            "worker": self.box.worker,
            "dispatcher": self.box.dispatcher,
            "maintenance": self.box.maintenance,
        }
        for role in roles:
            if role in factories:
                runner = factories[role]()
                self._workers.append(runner)
                if isinstance(runner, Worker) and self.box.settings.worker.handoff:
                    # A receiver in this process hands its new rows to this worker.
                    if self.box.inbound.acceptor.handoff is None:
                        self.box.inbound.acceptor.handoff = runner
                self._background.append(asyncio.create_task(runner.run(), name=f"relaybox-{role}"))
            if role == "maintenance":
                watch = self.box.silence_watch()
                if watch.watching:
                    self._workers.append(watch)
                    task = asyncio.create_task(watch.run(), name="relaybox-silence")
                    self._background.append(task)
        if self.box.clock_guard.applies and self._clock_task is None:
            # Keeps the database's clock read for the receiver's times too.
            self._clock_task = asyncio.create_task(
                self.box.clock_guard.run(), name="relaybox-clock"
            )

    @contextlib.asynccontextmanager
    async def running(
        self, roles: tuple[str, ...] | list[str] | None = None, *, receiver: bool = True
    ) -> AsyncIterator[None]:
        """Run the box for the duration of the block (:meth:`Relaybox.running`): the
        schema checked or migrated, the accept path's connections opened, ``roles``
        started now or once the database is ready; the box closed at the end."""

        wanted = tuple(self.box.settings.lifespan_roles if roles is None else roles)
        unknown = sorted(set(wanted) - set(BACKGROUND_ROLES))
        if unknown:
            raise ConfigurationError(
                f"unknown role(s) {', '.join(unknown)}: choose from {', '.join(BACKGROUND_ROLES)}"
            )
        check_database_url(self.box.settings.database_url)  # before anything starts
        if not structlog.is_configured():
            # Embedded in an app that did not set structlog up: relaybox's lines at
            # the configured level (info), not structlog's print-everything default.
            from relaybox.log import configure_logging

            configure_logging(
                self.box.settings.log_level, json=self.box.settings.log_json, follow_stderr=True
            )
        ready = await self._schema_ready(first=True)
        if receiver:
            await self.warm_receiver()
        self.freeze_startup_heap()
        if ready:
            await self._refresh_webhooks_quietly()
            await self.start(wanted)
        else:
            self._watcher = asyncio.create_task(
                self._start_when_ready(wanted), name="relaybox-schema-watch"
            )
        try:
            yield
        finally:
            await self.box.close()

    async def _schema_ready(self, *, first: bool) -> bool:
        """Migrate (``migrate = "auto"``) or check the schema; ``False`` while the
        database is unreachable or its schema is behind. The first failure is
        logged; the retries that follow are quiet until the state changes."""
        blocked = await self._blocked()
        if blocked is not None and first:
            level, event, fields = blocked
            getattr(log, level)(event, **fields)
        return blocked is None

    async def _blocked(self) -> tuple[str, str, dict[str, Any]] | None:
        """What keeps the roles from starting, as its log line (level, event and
        fields), or ``None`` once the schema is current and ``on_ready`` ran."""
        try:
            if self.box.settings.migrate == "auto":
                applied = await self.box.migrate()
                if applied:
                    log.info("relaybox_migrated", applied=applied)
            current, latest = await self.box.store.schema_version()
        except ConfigurationError:
            raise
        except Exception as exc:
            return (
                "warning",
                "relaybox_database_unavailable",
                {
                    "error": short_error(exc),
                    "detail": "the receiver answers 503; roles start once the database answers",
                },
            )
        if current < latest:
            return (
                "error",
                "relaybox_schema_behind",
                {
                    "applied": current,
                    "latest": latest,
                    "hint": TABLES_MISSING if current == 0 else "run `relaybox migrate`",
                    "detail": "the receiver answers 503; roles start once migrated",
                },
            )
        if not self._ready_ran:
            try:
                await self.run_on_ready()
            except Exception as exc:
                return (
                    "error",
                    "relaybox_on_ready_failed",
                    {
                        "error": short_error(exc),
                        "detail": "the roles start once the on_ready functions succeed",
                    },
                )
            self._ready_ran = True
        return None

    async def _refresh_webhooks_quietly(self) -> None:
        try:
            await self.box.refresh_webhooks()
        except Exception as exc:  # the OpenAPI document is not worth a failed start
            log.warning("relaybox_catalog_unreadable", error=short_error(exc))

    async def _start_when_ready(self, roles: tuple[str, ...]) -> None:
        """Start ``roles`` once the database answers with a current schema, asking
        again with a growing pause (1 s, doubling up to 10 s)."""
        pause = 1.0
        while True:
            await asyncio.sleep(pause)
            if await self._schema_ready(first=False):
                log.info("relaybox_database_ready", roles=list(roles))
                await self._refresh_webhooks_quietly()
                await self.start(roles)
                return
            pause = min(pause * 2, 10.0)

    async def stop(self) -> None:
        """Stop the background roles gracefully (finishing what they hold) and wait for
        the workers made here to give their connections back."""
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watcher
            self._watcher = None
        for worker in self._workers:
            worker.stop()
        if self._clock_task is not None:
            self.box.clock_guard.stop()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._clock_task, 30)
            self._clock_task = None
        for task in self._background:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, 30)
        self._background.clear()
        self._workers.clear()
        for made in list(self.made):
            await made.drain()
        self._ready_ran = False
