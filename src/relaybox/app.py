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
import inspect
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import structlog

from relaybox.clock import Clock, ClockGuard, DatabaseClock
from relaybox.config import Settings, load_settings
from relaybox.errors import TABLES_MISSING, ConfigurationError
from relaybox.hooks import AcceptHooks, DispatchHooks
from relaybox.inbox import Acceptor
from relaybox.log import short_error
from relaybox.metrics import Metrics
from relaybox.receiver import Receiver
from relaybox.sources.base import Source, check_subject_path
from relaybox.sources.bodies import BodyLimits
from relaybox.store import AcceptOutcome, NewDelivery, Store, check_database_url, open_store
from relaybox.worker import Context, Handler, Hooks, Registration, Worker
from relaybox.worker.context import SyncHandler

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session
    from starlette.applications import Starlette

    from relaybox.outbound.catalog import EventType
    from relaybox.outbound.dispatcher import Dispatcher
    from relaybox.outbound.portal_links import PortalLink
    from relaybox.outbound.registry import Outbound
    from relaybox.retention import Maintenance
    from relaybox.silence import SilenceWatch
    from relaybox.store.erasure import Erasure
    from relaybox.store.outbox_rows import Message

__all__ = ["ROLES", "Relaybox"]

H = TypeVar("H", bound=Handler | SyncHandler)
R = TypeVar("R", bound="Callable[[Relaybox], Awaitable[Any]]")
"""A handler: ``async def`` (:data:`Handler`) or plain ``def`` (:data:`SyncHandler`)."""

ROLES = ("receiver", "api", "admin", "worker", "dispatcher", "maintenance")
"""Every role ``relaybox serve`` can run; all are on by default."""

log = structlog.get_logger("relaybox")


class Relaybox:
    """The box: settings, the database (``store``), the sources that may deliver, the
    handlers that run their events, and the roles that run them (receiver, worker,
    dispatcher, maintenance).

    ``Relaybox(url)`` reads settings as ``load_settings`` does (a TOML file named by
    ``config``, then ``RELAYBOX_*`` variables) with ``url`` as the database;
    ``Relaybox(settings=Settings(...))`` takes exactly the settings given. ``clock``
    replaces the database's clock (a test's ``FrozenClock``); ``sync_transaction``
    gives plain ``def`` handlers their transactions (:mod:`relaybox.sync`).
    """

    def __init__(
        self,
        database_url: str | None = None,
        *,
        settings: Settings | None = None,
        config: str | Path | None = None,
        clock: Clock | None = None,
        sync_transaction: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
    ) -> None:
        self.settings = settings or load_settings(config)
        if database_url is not None:
            self.settings = self.settings.model_copy(update={"database_url": database_url})
        # The database's clock on PostgreSQL (several hosts compare holds and leases),
        # kept read by clock_guard; this host's on SQLite or before the first read.
        self.clock: Clock = clock or DatabaseClock()
        self.clock_guard = ClockGuard(self)
        self.metrics = Metrics()
        # Where tests wait or inject faults: the worker's COMMITs, the acceptor's, a
        # delivery's attempt and its recorded outcome. Empty in production.
        self.hooks: Hooks = Hooks()
        self.accept_hooks = AcceptHooks()
        self.dispatch_hooks = DispatchHooks()
        self.sources: dict[str, Source] = {}
        self._handlers: list[Registration] = []
        self._on_ready: list[Callable[[Relaybox], Awaitable[Any]]] = []
        self._ready_ran = False
        self._store: Store | None = None
        self._acceptor: Acceptor | None = None
        self._heap_frozen = False
        self._inline_worker: Worker | None = None
        self._background: list[asyncio.Task[None]] = []
        self._clock_task: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self.webhooks_doc: dict[str, Any] = {}  # the catalog as OpenAPI webhooks
        self._workers: list[Worker | Dispatcher | Maintenance | SilenceWatch] = []
        self._made: weakref.WeakSet[Worker] = weakref.WeakSet()  # box.worker()'s
        # Synchronous transactions for plain-def handlers (relaybox.sync): this
        # callable, or the store's sync engine.
        self.sync_transaction: Callable[[], contextlib.AbstractContextManager[Any]] = (
            sync_transaction or self._default_sync_transaction
        )
        self.receiver = Receiver(self)
        if self.settings.sources:
            from relaybox import sources as _sources

            for name, options in self.settings.sources.items():
                try:
                    self.source(name, _sources.from_config(dict(options)))
                except ConfigurationError as exc:
                    raise ConfigurationError(f"[sources.{name}]: {exc}") from None

    # -- configuration --------------------------------------------------------

    def configure(self, settings: Settings) -> None:
        """Apply the settings that ``settings`` sets explicitly (a TOML file's keys and
        ``RELAYBOX_*`` variables, as :func:`relaybox.config.load_settings` reads them)
        over this box's; sources declared there are added. ``relaybox … --app myapp:box
        --config dev.toml`` does this."""
        from relaybox.config import merge_settings

        self.settings = merge_settings(self.settings, settings)
        if settings.sources:
            from relaybox import sources as _sources

            for name, options in settings.sources.items():
                try:
                    self.source(name, _sources.from_config(dict(options)))
                except ConfigurationError as exc:
                    raise ConfigurationError(f"[sources.{name}]: {exc}") from None

    def source(self, name: str, source: Source) -> Source:
        """Register ``source`` under ``name``: it answers ``POST /webhooks/{name}``."""
        if not name or "/" in name:
            raise ConfigurationError(f"invalid source name {name!r}")
        source.name = name
        if source.subject_path is not None:
            erasure = self.settings.erasure
            check_subject_path(
                source.subject_path,
                max_depth=erasure.path_max_depth,
                max_chars=erasure.path_max_chars,
            )
        bodies = self.settings.bodies
        source.body_limits = BodyLimits(
            max_fields=bodies.max_fields,
            max_xml_depth=bodies.max_xml_depth,
            max_xml_elements=bodies.max_xml_elements,
        )
        self.sources[name] = source
        return source

    def handler(
        self,
        source: str,
        event_type: str = "*",
        *,
        business_key: Callable[[Context], str | None] | None = None,
        fingerprint: str = "",
    ) -> Callable[[H], H]:
        """Register a handler for ``(source, event_type)``; both accept ``*`` wildcards.
        The most specific registration wins (fewest wildcards, then first registered).
        An ``async def`` handler gets a :class:`Context`; a plain ``def`` one a
        :class:`relaybox.sync.SyncContext`, and runs in a worker thread inside a
        transaction of :attr:`sync_transaction`.

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

        def register(fn: H) -> H:
            sync = not (
                inspect.iscoroutinefunction(fn)
                or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004
            )
            self._handlers.append(
                Registration(source, event_type, fn, business_key, fingerprint, sync)
            )
            return fn

        return register

    def on_ready(self, fn: R) -> R:
        """Register ``async def fn(box)`` to run once the database answers and
        relaybox's tables are current, before the worker and the other roles start
        (the lifespan, :meth:`running`, the test kit's harness): where an application
        creates or checks its own tables. With the database down at startup the app
        still starts and ``fn`` runs when it answers; a failing ``fn`` is logged and
        tried again the same way, and the roles wait for it. Usable as a decorator."""
        self._on_ready.append(fn)
        return fn

    async def run_on_ready(self) -> None:
        """Run the :meth:`on_ready` functions, in the order they were registered."""
        for fn in self._on_ready:
            await fn(self)

    def handler_for(self, source: str, event_type: str) -> Handler | SyncHandler | None:
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
            s = self.settings
            sizes: dict[str, float] = {
                "max_overflow": s.pool_overflow,
                "pool_timeout": s.pool_timeout,
                "idle_in_transaction_timeout": s.idle_in_transaction_timeout,
            }
            if s.pool_size is not None:
                sizes["pool_size"] = s.pool_size
            self._store = open_store(s.database_url, worker_chains=s.worker.concurrency, **sizes)
        return self._store

    @property
    def acceptor(self) -> Acceptor:
        if self._acceptor is None:
            self._acceptor = Acceptor(
                self.store,
                timeout=self.settings.accept_timeout,
                committers=self.settings.accept_committers,
                hooks=self.accept_hooks,
            )
        return self._acceptor

    def worker(self, **options: Any) -> Worker:
        worker = Worker(self, **options)
        self._made.add(worker)  # close() waits for its chains to give connections back
        return worker

    @property
    def outbound(self) -> Outbound:
        """The sending side: settings, SSRF guard, channels (:mod:`relaybox.outbound`)."""
        from relaybox.outbound import outbound

        return outbound(self)

    def dispatcher(self, **options: Any) -> Dispatcher:
        """The outbox dispatcher (``relaybox dispatch``)."""
        from relaybox.outbound.dispatcher import Dispatcher

        options.setdefault("hooks", self.dispatch_hooks)
        return Dispatcher(self, **options)

    def maintenance(self, **options: Any) -> Maintenance:
        """The scheduled maintenance loop (retention purge; ``relaybox maintenance``)."""
        from relaybox.retention import Maintenance

        return Maintenance(self, **options)

    def silence_watch(self, **options: Any) -> SilenceWatch:
        """The silence check (:mod:`relaybox.silence`), run with the maintenance role."""
        from relaybox.silence import SilenceWatch

        return SilenceWatch(self, **options)

    async def publish(
        self,
        conn: AsyncConnection | AsyncSession,
        event_type: str,
        data: Any,
        *,
        tenant: str,
        idempotency_key: str | None = None,
        endpoint_ids: Sequence[str] | None = None,
        api_version: str | None = None,
        ordering_key: str | None = None,
        subject: str | None = None,
    ) -> Message:
        """Publish an outbound event inside the caller's transaction: one message
        row plus one outbox row per subscribed, enabled endpoint, committed with the
        caller's change or not at all. ``conn`` is an ``AsyncConnection`` or an ORM
        ``AsyncSession`` (its connection, in its transaction, is used). ``subject``:
        whom it is about, for :meth:`erase`."""
        from sqlalchemy.ext.asyncio import AsyncSession

        from relaybox.outbound.publish import publish

        if isinstance(conn, AsyncSession):
            conn = await conn.connection()

        return await publish(
            self,
            conn,
            event_type,
            data,
            tenant=tenant,
            idempotency_key=idempotency_key,
            endpoint_ids=endpoint_ids,
            api_version=api_version,
            ordering_key=ordering_key,
            subject=subject,
        )

    async def erase(
        self,
        *,
        subject: str | None = None,
        tenant: str | None = None,
        actor: str,
        reason: str = "",
    ) -> Erasure:
        """Erase every payload, header, attempt body and response excerpt relaybox
        holds of ``subject`` (as a source's ``subject`` path or ``publish(...,
        subject=...)`` named it) or of ``tenant``, in batches of ``erasure.batch`` rows
        per transaction, and record who asked (``actor``) and why. Keys, fingerprints,
        statuses and outcomes stay. Rows still pending wait: the erasure returned has
        ``finished_at`` ``None`` and ``waiting`` > 0 until the maintenance job empties
        them once they finish. See :mod:`relaybox.erasure`."""
        from relaybox.erasure import erase

        return await erase(self, subject=subject, tenant=tenant, actor=actor, reason=reason)

    def portal_link(
        self,
        tenant: str,
        *,
        ttl: float | None = None,
        base_url: str | None = None,
        single_use: bool | None = None,
    ) -> PortalLink:
        """A short-lived signed link to ``tenant``'s portal (:mod:`relaybox.portal`):
        ``.url`` to hand to the tenant's browser, ``.expires_at`` (epoch seconds).
        ``single_use``: it opens one session only (default
        ``portal.single_use_links``)."""
        from relaybox.portal import portal_link

        return portal_link(self, tenant, ttl=ttl, base_url=base_url, single_use=single_use)

    async def announce(
        self,
        conn: Any,
        event_type: str,
        data: Any,
        *,
        key: str | None = None,
        inbox_id: int | None = None,
    ) -> None:
        """Publish an operational event (``relaybox.…``) to the operational tenant in
        ``conn``'s transaction (:mod:`relaybox.outbound.operational`); ``key``: once per
        key. How the receiving side, which does not import the sending side, tells."""
        from relaybox.outbound.operational import emit

        await emit(self, conn, event_type, data, key=key, inbox_id=inbox_id)

    def publish_sync(
        self,
        conn: Connection | Session,
        event_type: str,
        data: Any,
        *,
        tenant: str,
        idempotency_key: str | None = None,
        endpoint_ids: Sequence[str] | None = None,
        api_version: str | None = None,
        ordering_key: str | None = None,
        subject: str | None = None,
    ) -> Message:
        """:meth:`publish` for synchronous code: ``conn`` is a ``sqlalchemy.Connection``
        or an ORM ``Session`` (its connection, in its transaction); the message and its
        outbox rows commit with the caller's change or not at all. Returns the
        :class:`~relaybox.outbound.Message` (the existing one for an idempotency key
        the tenant used already). ``ordering_key`` and ``subject`` as in :meth:`publish`."""
        from relaybox.sync.publish import publish_sync

        return publish_sync(
            self,
            conn,
            event_type,
            data,
            tenant=tenant,
            idempotency_key=idempotency_key,
            endpoint_ids=endpoint_ids,
            api_version=api_version,
            ordering_key=ordering_key,
            subject=subject,
        )

    def _default_sync_transaction(self) -> contextlib.AbstractContextManager[Any]:
        """A transaction on the store's sync engine (:attr:`Store.sync`), made on first
        use from the database URL (psycopg 3 on PostgreSQL, sqlite3 on SQLite)."""
        return self.store.sync.transaction()

    async def migrate(self) -> list[str]:
        """Create or upgrade relaybox's tables, then seal the endpoint secrets older
        versions stored in plaintext (:func:`relaybox.outbound.endpoints.seal_plaintext`).
        Returns the migrations applied."""
        from relaybox.outbound.endpoints import seal_plaintext

        applied = await self.store.migrate()
        await seal_plaintext(self)
        return applied

    async def define_event_type(
        self,
        name: str,
        *,
        description: str = "",
        schema: dict[str, Any] | None = None,
        subject: str | None = None,
    ) -> EventType:
        """Add or replace an entry of the event catalog (``relaybox event-types``):
        tenants subscribe from it, ``publish`` checks data against its schema, and
        :func:`relaybox.embed.document_webhooks` shows it in the OpenAPI document.
        ``subject``: where its messages name their subject (``data.customer.id``, a
        path into the envelope): each publish without ``subject=`` is indexed under
        the value there, for ``erase(subject=...)``."""
        from relaybox.outbound.catalog import define_event_type

        defined = await define_event_type(
            self, name, description=description, schema=schema, subject=subject
        )
        await self.refresh_webhooks()
        return defined

    async def refresh_webhooks(self) -> dict[str, Any]:
        """Read the event catalog again into :attr:`webhooks_doc` (OpenAPI 3.1
        ``webhooks``)."""
        from relaybox.embed import openapi_webhooks
        from relaybox.outbound.catalog import list_event_types

        types = await list_event_types(self)
        self.webhooks_doc = openapi_webhooks(types, api_version=self.outbound.settings.api_version)
        return self.webhooks_doc

    async def accept_inline(self, delivery: NewDelivery) -> AcceptOutcome:
        """Inline mode: store the delivery and run its handler in one transaction.

        A failing handler rolls back only its own savepoint: the delivery still
        commits as pending (with the error recorded) for the worker, so nothing is
        lost and the sender still gets its 2xx after the COMMIT.
        """
        if self._inline_worker is None:
            self._inline_worker = Worker(self, name="inline")
        store = self.store
        result = None
        async with store.transaction() as conn:
            [outcome] = await store.inbox_insert(conn, [delivery])
            registration = self.registration_for(delivery.source, delivery.event_type)
            # A plain-def handler runs later, in the worker's synchronous transaction.
            if outcome.status == "accepted" and (registration is None or not registration.sync):
                [event] = await store.inbox_lock(conn, [outcome.inbox_id])
                result = await self._inline_worker.process(conn, event)
                if result.kind == "done":
                    await store.inbox_complete(conn, [event.id], self.clock.now())
        if result is not None and result.outbox_created:
            store.wake("outbox")
        if self.accept_hooks.after_commit:
            await self.accept_hooks.committed([(delivery, outcome)])
        return outcome

    # -- running --------------------------------------------------------------

    @property
    def started(self) -> bool:
        """Whether background roles run here (:meth:`start`, the lifespan, or a
        lifespan waiting for the database to start them)."""
        return bool(self._background) or self._watcher is not None

    def asgi(self, *, roles: tuple[str, ...] = ROLES) -> Starlette:
        """The app served by ``relaybox serve``. HTTP roles: ``receiver``
        (``/webhooks/{source}``), ``api`` (tenant-facing ``/api/v1`` and ``/portal``),
        ``admin`` (``/admin``: operator API and dashboard); background roles:
        ``worker``, ``dispatcher``. ``/healthz`` and ``/metrics`` are always there
        (:func:`relaybox.web.build_asgi`)."""
        from relaybox.web import build_asgi

        return build_asgi(self, roles)

    def freeze_startup_heap(self) -> None:
        """Once started, the objects alive now (modules, the app, its settings) live as
        long as the process: ``gc.freeze()`` takes them out of the cyclic collector's
        passes. Its full collections over that heap stalled requests 30-50 ms (the
        accept's p99, bench/README.md). Setting ``gc_freeze = false`` turns it off."""
        if self.settings.gc_freeze and not self._heap_frozen:
            gc.freeze()  # O(1): the generations' lists move to the permanent one
            self._heap_frozen = True

    def widen_young_gc(self) -> None:
        """``relaybox dispatch``: the cyclic collector's young pass after
        ``dispatch_gc_threshold`` allocations, not Python's 700. With 100 attempts in
        flight, each holding its coroutines, request and response objects, a pass every
        700 allocations (every few deliveries) traversed those thousands of live objects
        again: ~0.45 ms a pass, 25-30 µs of CPU per delivery (bench/README.md). A pass
        still runs, over more objects, ten-odd times less often."""
        threshold = self.settings.dispatch_gc_threshold
        if threshold:
            gc.set_threshold(threshold, *gc.get_threshold()[1:])

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
        factories: dict[str, Callable[[], Worker | Dispatcher | Maintenance]] = {
            "worker": self.worker,
            "dispatcher": self.dispatcher,
            "maintenance": self.maintenance,
        }
        for role in roles:
            if role in factories:
                runner = factories[role]()
                self._workers.append(runner)
                if isinstance(runner, Worker) and self.settings.worker.handoff:
                    # A receiver in this process hands its new rows to this worker.
                    if self.acceptor.handoff is None:
                        self.acceptor.handoff = runner
                self._background.append(asyncio.create_task(runner.run(), name=f"relaybox-{role}"))
            if role == "maintenance":
                watch = self.silence_watch()
                if watch.watching:
                    self._workers.append(watch)
                    task = asyncio.create_task(watch.run(), name="relaybox-silence")
                    self._background.append(task)
        if self.clock_guard.applies and self._clock_task is None:
            # Keeps the database's clock read for the receiver's times too.
            self._clock_task = asyncio.create_task(self.clock_guard.run(), name="relaybox-clock")

    def lifespan(self, app: Any = None) -> contextlib.AbstractAsyncContextManager[Any]:
        """The ASGI lifespan of an application that embeds relaybox::

            app = FastAPI(lifespan=box.lifespan)           # Starlette(lifespan=...) alike
            app.mount("/webhooks", box.receiver)
            app = Litestar(..., lifespan=[box.lifespan])

        At startup it checks the schema (``migrate = "check"``) or applies pending
        migrations (``"auto"``, the default), opens the receiver's connections and
        starts ``lifespan_roles`` (worker, dispatcher, maintenance) in the
        application's process; at shutdown it stops them gracefully, finishing what
        they hold. The lifespan state gets ``relaybox`` (the box) for
        :func:`relaybox.get_box`. With the database down or its tables missing the
        application still starts: the receiver answers 503 and the roles start once
        the database is ready."""
        return self._lifespan_state()

    @contextlib.asynccontextmanager
    async def _lifespan_state(self) -> Any:
        async with self.running():
            yield {"relaybox": self}

    @contextlib.asynccontextmanager
    async def running(
        self, roles: tuple[str, ...] | list[str] | None = None, *, receiver: bool = True
    ) -> AsyncIterator[Relaybox]:
        """Run relaybox in this event loop for the duration of the block::

            async with box.running(roles=("worker",)):
                ...                                        # your program

        ``roles`` are background roles (``worker``, ``dispatcher``, ``maintenance``;
        default: the ``lifespan_roles`` setting); ``receiver`` opens the accept
        path's connections at startup. Schema and database handling as in
        :meth:`lifespan`."""
        from relaybox.config import BACKGROUND_ROLES

        wanted = tuple(self.settings.lifespan_roles if roles is None else roles)
        unknown = sorted(set(wanted) - set(BACKGROUND_ROLES))
        if unknown:
            raise ConfigurationError(
                f"unknown role(s) {', '.join(unknown)}: choose from {', '.join(BACKGROUND_ROLES)}"
            )
        check_database_url(self.settings.database_url)  # before anything starts
        if not structlog.is_configured():
            # Embedded in an app that did not set structlog up: relaybox's lines at
            # the configured level (info), not structlog's print-everything default.
            from relaybox.log import configure_logging

            configure_logging(
                self.settings.log_level, json=self.settings.log_json, follow_stderr=True
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
            yield self
        finally:
            await self.close()

    async def _schema_ready(self, *, first: bool) -> bool:
        """Migrate (``migrate = "auto"``) or check the schema; ``False`` while the
        database is unreachable or its schema is behind. The first failure is
        logged; the retries that follow are quiet until the state changes."""
        try:
            if self.settings.migrate == "auto":
                applied = await self.migrate()
                if applied:
                    log.info("relaybox_migrated", applied=applied)
            current, latest = await self.store.schema_version()
        except ConfigurationError:
            raise
        except Exception as exc:
            if first:
                log.warning(
                    "relaybox_database_unavailable",
                    error=short_error(exc),
                    detail="the receiver answers 503; roles start once the database answers",
                )
            return False
        if current < latest:
            if first:
                hint = TABLES_MISSING if current == 0 else "run `relaybox migrate`"
                log.error(
                    "relaybox_schema_behind",
                    applied=current,
                    latest=latest,
                    hint=hint,
                    detail="the receiver answers 503; roles start once migrated",
                )
            return False
        if not self._ready_ran:
            try:
                await self.run_on_ready()
            except Exception as exc:
                if first:
                    log.error(
                        "relaybox_on_ready_failed",
                        error=short_error(exc),
                        detail="the roles start once the on_ready functions succeed",
                    )
                return False
            self._ready_ran = True
        return True

    async def _refresh_webhooks_quietly(self) -> None:
        try:
            await self.refresh_webhooks()
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

    async def close(self) -> None:
        """Stop background roles gracefully (finishing what they hold), then close."""
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._watcher
            self._watcher = None
        for worker in self._workers:
            worker.stop()
        if self._clock_task is not None:
            self.clock_guard.stop()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._clock_task, 30)
            self._clock_task = None
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
        self._ready_ran = False
