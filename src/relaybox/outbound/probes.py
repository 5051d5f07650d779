"""Points where tests wait or inject faults on the sending path: :class:`DispatchHooks`
(a delivery's attempt and its recorded outcome), held as ``box.dispatch_hooks``. They
work as the receiving side's (:mod:`relaybox.inbound.probes`): lists of ``async``
callables, empty and free in production.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from relaybox.store.outbox_rows import Delivery

__all__ = ["DispatchHooks"]


class DispatchHooks:
    """The dispatcher's points (:class:`relaybox.outbound.dispatcher.Dispatcher`).

    ``before_send``: a leased delivery is about to be handed to its channel. A hook
    that raises fails the attempt as a channel that raises does: it is recorded as a
    retry with the error, and the row is sent again when it comes due.

    ``after_record``: outcomes are committed; each hook gets every delivery of the
    batch with its attempt log label (``sent``, ``retry``, ``failed``, ``exhausted``,
    ``fenced``, …). The outcomes stand whatever the hook does: one that raises is
    logged (``dispatch_hook_failed``) and the dispatcher goes on."""

    def __init__(self) -> None:
        self.before_send: list[Callable[[Delivery], Awaitable[None]]] = []
        self.after_record: list[Callable[[list[tuple[Delivery, str]]], Awaitable[None]]] = []
