"""What the parts of relaybox need from the application: :class:`Runtime`, and the
receiving side's wider :class:`InboundRuntime`, :class:`WorkerRuntime` and
:class:`ReceiverRuntime`.

A part (the operator use cases, the sending side's services, the dispatcher, the
recorder, retention, replay, metrics, projections, reconciliation) takes a
``Runtime``: the store, the clock, the settings and the metrics, nothing else. The
parts of the receiving side that need more name exactly what: recovery the sources
(:class:`InboundRuntime`); the worker and the handlers' contexts the handler
registry, the test hooks, the clock guard, operational events and synchronous
transactions (:class:`WorkerRuntime`); the receiver the acceptor, inline
acceptance, operational events and the lifespan (:class:`ReceiverRuntime`).
:class:`relaybox.Relaybox` is all of them (it wires and runs the parts); a test or an
embedding may pass any object with the members named.

The types these protocols name are imported for annotations only: this module
imports nothing of relaybox when it runs, so every part may import it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from relaybox.clock import Clock, ClockGuard
    from relaybox.config import Settings
    from relaybox.inbox import Acceptor
    from relaybox.metrics import Metrics
    from relaybox.sources.base import Source
    from relaybox.store import AcceptOutcome, NewDelivery, Store
    from relaybox.worker.context import Hooks, Registration

__all__ = ["InboundRuntime", "ReceiverRuntime", "Runtime", "WorkerRuntime"]


class Runtime(Protocol):
    """The store, the clock, the settings and the metrics of one application."""

    @property
    def store(self) -> Store: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def metrics(self) -> Metrics: ...


class InboundRuntime(Runtime, Protocol):
    """A :class:`Runtime` with the sources registered, by name (recovery reads a
    source's delivery log; the receiver and the handlers' payloads decode with it)."""

    @property
    def sources(self) -> Mapping[str, Source]: ...


class WorkerRuntime(InboundRuntime, Protocol):
    """What the worker and the handlers' contexts (``ctx.box``) use besides an
    :class:`InboundRuntime`."""

    @property
    def hooks(self) -> Hooks:
        """Where tests wait or inject faults around the worker's COMMITs."""
        ...

    @property
    def clock_guard(self) -> ClockGuard:
        """Says whether this host's clock is close enough to the database's to claim."""
        ...

    @property
    def _handlers(self) -> Sequence[Registration]:
        """The registrations so far: the worker keeps the answers of
        :meth:`registration_for` until their number changes."""
        ...

    @property
    def sync_transaction(self) -> Callable[[], AbstractContextManager[Any]]:
        """The provider of the synchronous transactions plain-def handlers run in."""
        ...

    def registration_for(self, source: str, event_type: str) -> Registration | None:
        """The registration whose handler runs for ``(source, event_type)``."""
        ...

    async def announce(
        self,
        conn: Any,
        event_type: str,
        data: Any,
        *,
        key: str | None = None,
        inbox_id: int | None = None,
    ) -> None:
        """Publish an operational event (``relaybox.…``) in ``conn``'s transaction
        (``inbox_id``: the inbox row it is about, whose subjects it is indexed under)."""
        ...


class ReceiverRuntime(InboundRuntime, Protocol):
    """What the receiver uses besides an :class:`InboundRuntime`."""

    @property
    def acceptor(self) -> Acceptor:
        """Stores deliveries, several requests' in one transaction."""
        ...

    async def accept_inline(self, delivery: NewDelivery) -> AcceptOutcome:
        """Stores ``delivery`` and runs its handler in one transaction."""
        ...

    async def announce(
        self,
        conn: Any,
        event_type: str,
        data: Any,
        *,
        key: str | None = None,
        inbox_id: int | None = None,
    ) -> None:
        """Publish an operational event (``relaybox.…``) in ``conn``'s transaction
        (``inbox_id``: the inbox row it is about, whose subjects it is indexed under)."""
        ...

    def running(
        self, roles: tuple[str, ...] | list[str] | None = None, *, receiver: bool = True
    ) -> AbstractAsyncContextManager[Any]:
        """Runs relaybox (schema, connections; ``roles``) for the duration of a block:
        the bare receiver's ASGI lifespan."""
        ...
