"""The receiving side of one :class:`~relaybox.app.Relaybox`: the sources that may
deliver, the handlers registered for their events, the acceptor that stores
deliveries (several requests' in one transaction) and inline acceptance, and the
announcer it tells operational events through. The composition root builds it and
passes it to the receiver; the announcer is the sending side's
(:func:`relaybox.outbound.announce.announcer`), passed in: this side imports nothing
of the other.

    inbound = box.inbound
    inbound.source("stripe", sources.stripe(secrets=[...]))   # what box.source does
    inbound.handler("stripe", "invoice.paid")(grant)          # what @box.handler does
    inbound.registration_for("stripe", "invoice.paid")        # the handler that runs
"""

from __future__ import annotations

import fnmatch
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from relaybox.errors import ConfigurationError
from relaybox.inbound.accept import Acceptor
from relaybox.inbound.probes import AcceptHooks
from relaybox.inbound.worker import Context, Handler, Registration, Worker
from relaybox.inbound.worker.context import SyncHandler
from relaybox.sources.base import Source, check_subject_path
from relaybox.sources.bodies import BodyLimits
from relaybox.store import keys

if TYPE_CHECKING:
    from relaybox.runtime import Announce, AnnounceSync, WorkerRuntime
    from relaybox.store import AcceptOutcome, NewDelivery

__all__ = ["Inbound"]

H = TypeVar("H", bound=Handler | SyncHandler)
"""A handler: ``async def`` (:data:`Handler`) or plain ``def`` (:data:`SyncHandler`)."""


class Inbound:
    """Everything the receiver, the worker and recovery share for one box: sources,
    handlers, the acceptor, inline acceptance, the announcer."""

    def __init__(
        self,
        box: WorkerRuntime,
        *,
        announce: Announce,
        announce_sync: AnnounceSync,
        hooks: AcceptHooks | None = None,
    ) -> None:
        self.box = box
        self.announce = announce
        """Publishes an operational event (``relaybox.inbox.…``) in a transaction."""
        self.announce_sync = announce_sync
        """:attr:`announce` in a synchronous transaction (plain-def handlers')."""
        self.accept_hooks = hooks or AcceptHooks()
        self.sources: dict[str, Source] = {}
        self.handlers: list[Registration] = []
        self._acceptor: Acceptor | None = None
        self._inline_worker: Worker | None = None

    # -- sources and handlers -------------------------------------------------------

    def source(self, name: str, source: Source) -> Source:
        """Register ``source`` under ``name``: it answers ``POST /webhooks/{name}``."""
        if not name or "/" in name:
            raise ConfigurationError(f"invalid source name {name!r}")
        source.name = name
        settings = self.box.settings
        if source.subject_path is not None:
            check_subject_path(
                source.subject_path,
                max_depth=settings.erasure.path_max_depth,
                max_chars=settings.erasure.path_max_chars,
            )
        bodies = settings.bodies
        source.body_limits = BodyLimits(
            max_fields=bodies.max_fields,
            max_xml_depth=bodies.max_xml_depth,
            max_xml_elements=bodies.max_xml_elements,
        )
        self.check_source_scopes(settings.retention.sources, name)
        self.sources[name] = source
        return source

    def check_source_scopes(self, windows: Iterable[str], *names: str) -> None:
        """Refuse two known sources (those registered, ``names``, and ``windows``: the
        names ``[retention.sources]`` gives a window) whose keys would share a scope
        number (:func:`relaybox.store.keys.check_scopes`): their keys could not expire
        apart."""
        try:
            keys.check_scopes(sorted({*self.sources, *windows, *names}))
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None

    def declare_sources(self, declared: Mapping[str, Mapping[str, Any]]) -> None:
        """Register the sources a configuration declares (``[sources.<name>]`` tables,
        :func:`relaybox.sources.from_config` each)."""
        if not declared:
            return
        from relaybox import sources

        for name, options in declared.items():
            try:
                self.source(name, sources.from_config(dict(options)))
            except ConfigurationError as exc:
                raise ConfigurationError(f"[sources.{name}]: {exc}") from None

    def handler(
        self,
        source: str,
        event_type: str = "*",
        *,
        business_key: Callable[[Context], str | None] | None = None,
        fingerprint: str = "",
    ) -> Callable[[H], H]:
        """Register a handler for ``(source, event_type)`` (:meth:`Relaybox.handler`
        says how)."""

        def register(fn: H) -> H:
            sync = not (
                inspect.iscoroutinefunction(fn)
                or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004
            )
            self.handlers.append(
                Registration(source, event_type, fn, business_key, fingerprint, sync)
            )
            return fn

        return register

    def registration_for(self, source: str, event_type: str) -> Registration | None:
        """The registration whose handler runs for ``(source, event_type)``: the most
        specific (fewest wildcards), then the first registered."""
        matches = [
            (r.source.count("*") + r.event_type.count("*"), i, r)
            for i, r in enumerate(self.handlers)
            if fnmatch.fnmatchcase(source, r.source)
            and fnmatch.fnmatchcase(event_type, r.event_type)
        ]
        return min(matches, key=lambda m: (m[0], m[1]))[2] if matches else None

    def handler_for(self, source: str, event_type: str) -> Handler | SyncHandler | None:
        found = self.registration_for(source, event_type)
        return None if found is None else found.handler

    # -- accepting ------------------------------------------------------------------

    @property
    def acceptor(self) -> Acceptor:
        """Stores deliveries, several requests' in one transaction (group commit);
        made on first use, again after :meth:`close`."""
        if self._acceptor is None:
            settings = self.box.settings
            self._acceptor = Acceptor(
                self.box.store,
                timeout=settings.accept_timeout,
                committers=settings.accept_committers,
                hooks=self.accept_hooks,
            )
        return self._acceptor

    async def accept_inline(self, delivery: NewDelivery) -> AcceptOutcome:
        """Inline mode: store the delivery and run its handler in one transaction.

        A failing handler rolls back only its own savepoint: the delivery still
        commits as pending (with the error recorded) for the worker, so nothing is
        lost and the sender still gets its 2xx after the COMMIT.
        """
        if self._inline_worker is None:
            self._inline_worker = Worker(self.box, name="inline")
        store = self.box.store
        result = None
        async with store.transaction() as conn:
            [outcome] = await store.inbox.insert(conn, [delivery])
            registration = self.registration_for(delivery.source, delivery.event_type)
            # A plain-def handler runs later, in the worker's synchronous transaction.
            if outcome.status == "accepted" and (registration is None or not registration.sync):
                [event] = await store.inbox.lock(conn, [outcome.inbox_id])
                result = await self._inline_worker.process(conn, event)
                if result.kind == "done":
                    await store.inbox.complete(conn, [event.id], self.box.clock.now())
        if result is not None and result.outbox_created:
            store.db.wake("outbox")
        if self.accept_hooks.after_commit:
            await self.accept_hooks.committed([(delivery, outcome)])
        return outcome

    async def close(self) -> None:
        """Close the acceptor (its committers finish what they hold); forget the inline
        worker."""
        if self._acceptor is not None:
            await self._acceptor.close()
            self._acceptor = None
        # Its runners hold the store and the clock the box had: made again on next use.
        self._inline_worker = None
