"""Points where tests wait or inject faults on the receiving and the sending paths:
:class:`AcceptHooks` (the acceptor's COMMIT) and :class:`DispatchHooks` (a delivery's
attempt and its recorded outcome). The worker's are :class:`relaybox.worker.Hooks`.

Each point is a list of ``async`` callables, run in order; the box holds one object of
each (``box.accept_hooks``, ``box.dispatch_hooks``). Empty, and free, in production:
the paths check that a list is empty and go on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from relaybox.errors import StoreUnavailable

if TYPE_CHECKING:
    from relaybox.store import AcceptOutcome, NewDelivery
    from relaybox.store.outbox_rows import Delivery

__all__ = ["AcceptHooks", "DispatchHooks"]


class AcceptHooks:
    """The acceptor's points (:class:`relaybox.inbound.accept.Acceptor`).

    ``after_commit``: a batch of deliveries is committed, before their requests are
    answered; each hook gets every delivery of the batch with its outcome (inbox id;
    ``accepted``, ``duplicate``, …). Inline acceptance (a source with ``inline``)
    fires it too, for its one delivery, after the transaction that also ran the
    handler. A hook that raises stands for a lost COMMIT answer: the requests are
    answered as unavailable (503, the sender retries) while their rows stay committed,
    and a retry is found as a duplicate of the same inbox row. Nothing is lost."""

    def __init__(self) -> None:
        self.after_commit: list[
            Callable[[list[tuple[NewDelivery, AcceptOutcome]]], Awaitable[None]]
        ] = []

    async def committed(self, accepted: list[tuple[NewDelivery, AcceptOutcome]]) -> None:
        """Run the ``after_commit`` hooks; one that raises raises
        :class:`StoreUnavailable` (the COMMIT's answer is lost)."""
        try:
            for hook in self.after_commit:
                await hook(accepted)
        except Exception as exc:
            raise StoreUnavailable("the database did not confirm the commit") from exc


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
