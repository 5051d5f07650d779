"""What the parts of relaybox need from the application: :class:`Runtime`, and the
receiving side's wider :class:`InboundRuntime`, :class:`WorkerRuntime` and
:class:`ReceiverRuntime`; :class:`Announce`, how the receiving side tells operational
events without importing the sending side.

A part (the operator use cases, the sending side's services, the dispatcher, the
recorder, retention, replay, metrics, projections, reconciliation) takes a
``Runtime``: the store, the clock, the settings, the metrics and the sending side
(``outbound``, built with the box), nothing else. The parts of the receiving side that
need more name exactly what: recovery the sources (:class:`InboundRuntime`); the
worker and the handlers' contexts the test hooks, the clock guard, synchronous
transactions and the receiving side (``inbound``: the handlers registered, the
announcer of operational events) (:class:`WorkerRuntime`); the receiver the lifespan
(:class:`ReceiverRuntime`), and the receiving side
(:class:`relaybox.inbound.registry.Inbound`: sources, acceptor, inline acceptance,
announcer) passed to it. :class:`relaybox.Relaybox` is all of them (it assembles the
parts and runs them); a test or an embedding may pass any object with the members
named.

The types these protocols name are imported for annotations only: this module
imports nothing of relaybox when it runs, so every part may import it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from relaybox.clock import Clock, ClockGuard
    from relaybox.config import Settings
    from relaybox.inbound.registry import Inbound
    from relaybox.inbound.worker.context import Hooks
    from relaybox.metrics import Metrics
    from relaybox.outbound.registry import Outbound
    from relaybox.sources.base import Source
    from relaybox.store import Store

__all__ = [
    "Announce",
    "AnnounceSync",
    "InboundRuntime",
    "ReceiverRuntime",
    "Runtime",
    "WorkerRuntime",
]


class Announce(Protocol):
    """Publishes an operational event (``relaybox.…``) in ``conn``'s transaction;
    ``key``: once per key; ``inbox_id``: the inbox row it is about, whose subjects it
    is indexed under (:func:`relaybox.outbound.announce.announcer`)."""

    async def __call__(
        self,
        conn: Any,
        event_type: str,
        data: Any,
        *,
        key: str | None = None,
        inbox_id: int | None = None,
    ) -> None: ...


class AnnounceSync(Protocol):
    """:class:`Announce` in a synchronous transaction (a plain-def handler's):
    :func:`relaybox.outbound.announce.sync_announcer`."""

    def __call__(
        self,
        conn: Any,
        event_type: str,
        data: Any,
        *,
        key: str | None = None,
        inbox_id: int | None = None,
    ) -> None: ...


class Runtime(Protocol):
    """The store, the clock, the settings, the metrics and the sending side of one
    application."""

    @property
    def store(self) -> Store: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def outbound(self) -> Outbound:
        """The sending side: its settings, channels, SSRF guard and vault."""
        ...


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
    def inbound(self) -> Inbound:
        """The receiving side: the handlers registered (``registration_for``), the
        announcer of operational events (``announce``)."""
        ...

    @property
    def sync_transaction(self) -> Callable[[], AbstractContextManager[Any]]:
        """The provider of the synchronous transactions plain-def handlers run in."""
        ...


class ReceiverRuntime(Runtime, Protocol):
    """What the receiver uses besides a :class:`Runtime` and the receiving side it is
    given."""

    def running(
        self, roles: tuple[str, ...] | list[str] | None = None, *, receiver: bool = True
    ) -> AbstractAsyncContextManager[Any]:
        """Runs relaybox (schema, connections; ``roles``) for the duration of a block:
        the bare receiver's ASGI lifespan."""
        ...
