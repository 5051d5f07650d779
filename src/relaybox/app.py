"""The ``Relaybox`` facade, the composition root: it reads the settings, opens the
store and builds the two sides (:class:`~relaybox.inbound.registry.Inbound`: sources,
handlers, acceptor; :class:`~relaybox.outbound.registry.Outbound`: channels, guard,
vault), hands each part what it needs, and runs the roles. What a side does lives in
that side; the methods here register, delegate or start.

    box = Relaybox("sqlite:///relaybox.db")
    box.source("stripe", sources.stripe(secrets=["whsec_..."], account="acct_123"))

    @box.handler("stripe", "invoice.paid")
    async def grant(ctx): ...

    app.mount("/webhooks", box.receiver)     # or: relaybox serve --app myapp:box
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from relaybox.clock import Clock, ClockGuard, DatabaseClock
from relaybox.config import Settings, load_settings
from relaybox.inbound.receiver import Receiver
from relaybox.inbound.registry import H, Inbound
from relaybox.inbound.worker import Context, Handler, Hooks, Worker
from relaybox.inbound.worker.context import SyncHandler
from relaybox.lifecycle import Lifecycle
from relaybox.metrics import Metrics
from relaybox.outbound.announce import announcer, sync_announcer
from relaybox.outbound.probes import DispatchHooks
from relaybox.outbound.registry import Outbound
from relaybox.sources.base import Source
from relaybox.store import Store, open_store
from relaybox.sync.context import StoreTransactions

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Sequence

    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
    from sqlalchemy.orm import Session
    from starlette.applications import Starlette

    from relaybox.outbound.catalog import EventType
    from relaybox.outbound.dispatcher import Dispatcher
    from relaybox.outbound.portal_links import PortalLink
    from relaybox.retention import Maintenance
    from relaybox.silence import SilenceWatch
    from relaybox.store.erasure import Erasure
    from relaybox.store.outbox_rows import Message

__all__ = ["ROLES", "Relaybox"]

R = TypeVar("R", bound="Callable[[Relaybox], Awaitable[Any]]")

ROLES = ("receiver", "api", "admin", "worker", "dispatcher", "maintenance")
"""Every role ``relaybox serve`` can run; all are on by default."""


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
        chosen = settings or load_settings(config)
        if database_url is not None:
            chosen = chosen.model_copy(update={"database_url": database_url})
        self._settings = chosen
        # The database's clock on PostgreSQL (several hosts compare holds and leases),
        # kept read by clock_guard; this host's on SQLite or before the first read.
        self.clock: Clock = clock or DatabaseClock()
        self.clock_guard = ClockGuard(self)
        self.metrics = Metrics()
        # Where tests wait or inject faults: the worker's COMMITs, the acceptor's, a
        # delivery's attempt and its recorded outcome. Empty in production.
        self.hooks: Hooks = Hooks()
        self.dispatch_hooks = DispatchHooks()
        # The two sides, built once: the sending side first, whose announcer the
        # receiving side tells operational events through.
        self.outbound = Outbound(self, chosen.outbound)
        self.inbound = Inbound(self, announce=announcer(self), announce_sync=sync_announcer(self))
        self.accept_hooks = self.inbound.accept_hooks
        self.sources: dict[str, Source] = self.inbound.sources
        self._store: Store | None = None
        self.webhooks_doc: dict[str, Any] = {}  # the catalog as OpenAPI webhooks
        self.lifecycle = Lifecycle(self)  # the roles started here, and how they stop
        # Synchronous transactions for plain-def handlers (relaybox.sync): this
        # callable, or the store's sync engine.
        self.sync_transaction: Callable[[], contextlib.AbstractContextManager[Any]] = (
            sync_transaction or StoreTransactions(self)
        )
        self.receiver = Receiver(self, self.inbound)
        self.inbound.check_source_scopes(chosen.retention.sources)
        self.inbound.declare_sources(chosen.sources)

    # -- configuration --------------------------------------------------------

    @property
    def settings(self) -> Settings:
        return self._settings

    @settings.setter
    def settings(self, settings: Settings) -> None:
        """New settings (``configure``, the CLI's ``--database-url``, a test harness);
        the sending side takes what changed in its part (:meth:`Outbound.follow`)."""
        self.inbound.check_source_scopes(settings.retention.sources)
        before, self._settings = self._settings, settings
        if settings.outbound != before.outbound:
            self.outbound.follow(before.outbound, settings.outbound)

    def configure(self, settings: Settings) -> None:
        """Apply the settings that ``settings`` sets explicitly (a TOML file's keys and
        ``RELAYBOX_*`` variables, as :func:`relaybox.config.load_settings` reads them)
        over this box's; sources declared there are added. ``relaybox … --app myapp:box
        --config dev.toml`` does this."""
        from relaybox.config import merge_settings

        self.settings = merge_settings(self.settings, settings)
        self.inbound.declare_sources(settings.sources)

    def source(self, name: str, source: Source) -> Source:
        """Register ``source`` under ``name``: it answers ``POST /webhooks/{name}``."""
        return self.inbound.source(name, source)

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

        return self.inbound.handler(
            source, event_type, business_key=business_key, fingerprint=fingerprint
        )

    def on_ready(self, fn: R) -> R:
        """Register ``async def fn(box)`` to run once the database answers and
        relaybox's tables are current, before the worker and the other roles start
        (the lifespan, :meth:`running`, the test kit's harness): where an application
        creates or checks its own tables. With the database down at startup the app
        still starts and ``fn`` runs when it answers; a failing ``fn`` is logged and
        tried again the same way, and the roles wait for it. Usable as a decorator."""
        self.lifecycle.on_ready.append(fn)
        return fn

    async def run_on_ready(self) -> None:
        """Run the :meth:`on_ready` functions, in the order they were registered."""
        await self.lifecycle.run_on_ready()

    def handler_for(self, source: str, event_type: str) -> Handler | SyncHandler | None:
        """The handler that runs for ``(source, event_type)``, if any."""
        return self.inbound.handler_for(source, event_type)

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

    def worker(self, **options: Any) -> Worker:
        worker = Worker(self, **options)
        self.lifecycle.made.add(worker)  # close() waits for its chains to give connections back
        return worker

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
        from relaybox.outbound.publish import Publication
        from relaybox.sync.publish import publish_sync

        request = Publication(
            event_type,
            data,
            tenant,
            idempotency_key=idempotency_key,
            endpoint_ids=endpoint_ids,
            api_version=api_version,
            ordering_key=ordering_key,
            subject=subject,
        )
        return publish_sync(self, conn, request)

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

    # -- running --------------------------------------------------------------

    @property
    def started(self) -> bool:
        """Whether background roles run here (:meth:`start`, the lifespan, or a
        lifespan waiting for the database to start them)."""
        return self.lifecycle.started

    def asgi(self, *, roles: tuple[str, ...] = ROLES) -> Starlette:
        """The app served by ``relaybox serve``. HTTP roles: ``receiver``
        (``/webhooks/{source}``), ``api`` (tenant-facing ``/api/v1`` and ``/portal``),
        ``admin`` (``/admin``: operator API and dashboard); background roles:
        ``worker``, ``dispatcher``. ``/healthz`` and ``/metrics`` are always there
        (:func:`relaybox.web.build_asgi`)."""
        from relaybox.web import build_asgi

        return build_asgi(self, roles)

    def freeze_startup_heap(self) -> None:
        """Take the objects alive now out of the cyclic collector's passes
        (:meth:`Lifecycle.freeze_startup_heap`; ``gc_freeze = false`` turns it off)."""
        self.lifecycle.freeze_startup_heap()

    def widen_young_gc(self) -> None:
        """``relaybox dispatch``: the young collection after ``dispatch_gc_threshold``
        allocations (:meth:`Lifecycle.widen_young_gc`)."""
        self.lifecycle.widen_young_gc()

    async def start(self, roles: tuple[str, ...] = ("worker",)) -> None:
        """Start background roles (``worker``, ``dispatcher``, ``maintenance``) in the running loop.
        Each runner has ``run()`` (until stopped) and ``stop()`` (finish what it holds)."""
        await self.lifecycle.start(roles)

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
        async with self.lifecycle.running(roles, receiver=receiver):
            yield self

    async def close(self) -> None:
        """Stop background roles gracefully (finishing what they hold), then close."""
        await self.lifecycle.stop()
        await self.inbound.close()
        await self.outbound.close()
        if self._store is not None:
            await self._store.close()
            self._store = None
