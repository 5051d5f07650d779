"""Finding and running an event's handler: :class:`HandlerLookup` (the registration of
an event's source and type, remembered until a handler is registered) and
:class:`HandlerRunner` (an ``async def`` handler in the caller's transaction, with its
:class:`~relaybox.inbound.worker.context.Context`, traced and bounded by
``worker.handler_timeout``; its outcome as an
:class:`~relaybox.inbound.worker.outcomes._Outcome`, never an exception)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING, cast

from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox import tracing
from relaybox.errors import OperationConflict, PermanentError
from relaybox.inbound.worker.context import Context, Handler, Registration, process_attributes
from relaybox.inbound.worker.outcomes import (
    _IN_FAILED_TRANSACTION,
    _contended,
    _Outcome,
    _sqlstate_in,
)
from relaybox.log import error_text
from relaybox.store import InboxEvent

if TYPE_CHECKING:
    from relaybox.inbound.registry import Inbound
    from relaybox.runtime import WorkerRuntime

__all__ = ["HandlerLookup", "HandlerRunner", "HandlerTimeout"]


class HandlerTimeout(Exception):
    """A handler ran past ``worker.handler_timeout``: a transient failure."""


class HandlerLookup:
    """The handlers registered on the receiving side (``inbound``), by event."""

    def __init__(self, inbound: Inbound) -> None:
        self.inbound = inbound
        self._handlers: dict[tuple[str, str], Registration | None] = {}
        self._known = -1  # registrations seen when _handlers was filled

    def registration(self, source: str, event_type: str) -> Registration | None:
        """``inbound.registration_for``, remembered until a handler is registered."""
        known = len(self.inbound.handlers)
        if known != self._known:
            self._handlers.clear()
            self._known = known
        key = (source, event_type)
        try:
            return self._handlers[key]
        except KeyError:
            found = self._handlers[key] = self.inbound.registration_for(source, event_type)
            return found

    def threaded(self, event: InboxEvent) -> Registration | None:
        """The registration of ``event`` when its handler is a plain ``def`` (it runs
        in a thread: :class:`~relaybox.inbound.worker.threaded.ThreadedRunner`)."""
        registration = self.registration(event.source, event.event_type)
        return registration if registration is not None and registration.sync else None


class HandlerRunner:
    """Runs ``async def`` handlers in the caller's transaction. ``box`` is what their
    contexts carry (``ctx.box``); its store and clock write a savepointed handler's
    outbox rows."""

    def __init__(self, box: WorkerRuntime, lookup: HandlerLookup, *, timeout: float) -> None:
        self.box = box
        self.store = box.store
        self.clock = box.clock
        self.lookup = lookup
        self.timeout = timeout
        """``worker.handler_timeout``: seconds before a handler is cancelled."""

    async def run(
        self,
        conn: AsyncConnection,
        event: InboxEvent,
        *,
        savepoint: bool,
        grouped: bool = False,
        ctx: Context | None = None,
    ) -> tuple[Context, _Outcome]:
        """The handler of ``event`` in ``conn``'s transaction, traced as
        ``relaybox.process``: a child of the context the event was received in (and
        linked to it), current while the handler runs, so that what it publishes
        carries it."""
        if not tracing.enabled():
            return await self._run(conn, event, savepoint=savepoint, grouped=grouped, ctx=ctx)
        with tracing.span(
            "relaybox.process",
            kind="consumer",
            parent=event.traceparent,
            attributes=process_attributes(event),
        ) as span:
            ctx, outcome = await self._run(
                conn, event, savepoint=savepoint, grouped=grouped, ctx=ctx
            )
            if span.is_recording():
                span.set_attributes(
                    {"relaybox.outcome": outcome.kind, "relaybox.outbox_rows": len(ctx.outbox_rows)}
                )
                ctx._trace = tracing.traceparent()
            return ctx, outcome

    async def _run(
        self,
        conn: AsyncConnection,
        event: InboxEvent,
        *,
        savepoint: bool,
        grouped: bool,
        ctx: Context | None,
    ) -> tuple[Context, _Outcome]:
        registration = self.lookup.registration(event.source, event.event_type)
        if ctx is None:
            ctx = Context(self.box, conn, event)
            if registration is not None:
                ctx._declare(registration)
        if registration is None:
            return ctx, _Outcome("unhandled", f"no handler for {event.source}/{event.event_type}")
        if registration.sync:  # plain defs run in threads (ThreadedRunner), not here
            return ctx, _Outcome("retry", "a plain def handler runs in a synchronous transaction")
        handler = cast(Handler, registration.handler)
        try:
            if savepoint:
                async with conn.begin_nested():
                    await self._call(handler, ctx)
                    await ctx._flush_session()
                    await self.store.outbox_insert_rows(conn, ctx.outbox_rows, now=self.clock.now())
            else:
                await self._call(handler, ctx)
                await ctx._flush_session()
            return ctx, _Outcome("done")
        except OperationConflict as exc:
            return ctx, _Outcome("conflict", str(exc))
        except PermanentError as exc:
            return ctx, _Outcome("invalid", str(exc) or type(exc).__name__)
        except Exception as exc:
            if grouped and _contended(exc):
                return ctx, _Outcome("contended", error_text(exc))
            aborted = grouped and _sqlstate_in(exc, _IN_FAILED_TRANSACTION)
            return ctx, _Outcome("retry", error_text(exc), aborted=aborted)
        finally:
            await ctx._close_session()

    async def _call(self, handler: Handler, ctx: Context) -> None:
        """``handler(ctx)``, cancelled past ``worker.handler_timeout``: a handler that
        hangs (a call without a timeout of its own) fails its attempt as a transient
        error, and its transaction is rolled back, instead of holding its rows, their
        locks and a chain for good while the worker renews their hold."""
        limit = asyncio.timeout(self.timeout)
        try:
            async with limit:
                await handler(ctx)
        except TimeoutError:
            if not limit.expired():
                raise  # the handler's own
            raise HandlerTimeout(
                f"the handler ran longer than worker.handler_timeout"
                f" ({self.timeout:g} s) and was cancelled"
            ) from None

    def declared(self, conn: AsyncConnection, events: Iterable[InboxEvent]) -> dict[int, Context]:
        """Contexts for the events whose handler declares a business key, by id."""
        contexts: dict[int, Context] = {}
        for event in events:
            registration = self.lookup.registration(event.source, event.event_type)
            if registration is not None and registration.business_key is not None:
                ctx = contexts[event.id] = Context(self.box, conn, event)
                ctx._declare(registration)
        return contexts
