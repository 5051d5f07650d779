"""Points where tests wait or inject faults on the receiving path: :class:`AcceptHooks`
(the acceptor's COMMIT). The worker's are :class:`relaybox.inbound.worker.Hooks`; the sending
side's :class:`relaybox.outbound.probes.DispatchHooks`.

Each point is a list of ``async`` callables, run in order; the box holds one object
(``box.accept_hooks``). Empty, and free, in production: the path checks that a list
is empty and goes on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from relaybox.errors import StoreUnavailable

if TYPE_CHECKING:
    from relaybox.store import AcceptOutcome, NewDelivery

__all__ = ["AcceptHooks"]


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
