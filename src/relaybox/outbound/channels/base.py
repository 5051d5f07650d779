"""What a channel is: one way out of the outbox (a webhook, an e-mail, a POST).

The dispatcher leases a row, hands the channel a :class:`Delivery` and records the
:class:`Result` it returns. A channel never touches the database and never retries by
itself: retries, dead letters and the attempt log belong to the dispatcher, so every
channel gets them the same way. (``Delivery`` and ``Result`` are defined with the
store's records, in :mod:`relaybox.store.outbox_rows` and
:mod:`relaybox.store.dispatch_rows`, whose statements take them; a channel imports
them from here.)

Adding a channel (the extension point)::

    class SmsChannel(Channel):
        uncertain = "review"          # a duplicate SMS costs money: a human decides
        max_in_flight = 2             # per lane (= per channel for handler rows)

        async def deliver(self, delivery: Delivery) -> Result:
            ...                       # one attempt; classify what happened
            return Result("sent")

    relaybox.outbound.outbound(box).channel("sms", SmsChannel())

``uncertain`` is the channel's answer to "my dispatcher died after sending and before
recording": ``resend`` (the destination deduplicates on ``delivery.key``),
``review`` (hold the row as ``held`` for a human) or ``accept`` (count it as sent).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypedDict

from relaybox.config.outbound import UncertainPolicy
from relaybox.store.dispatch_rows import Outcome as Outcome
from relaybox.store.dispatch_rows import Result as Result
from relaybox.store.outbox_rows import Delivery as Delivery

if TYPE_CHECKING:
    from relaybox.outbound.registry import Outbound

__all__ = [
    "Channel",
    "ChannelPolicy",
]  # and, defined with the store's records, Delivery, Outcome, Result


class ChannelPolicy(TypedDict, total=False):
    """The delivery policy a channel's constructor takes (``**policy``): each value
    that is not ``None`` overrides the :class:`Channel` attribute of the same name."""

    uncertain: UncertainPolicy | None
    max_in_flight: int | None
    rate_limit: float | None
    schedule: Sequence[float] | None


class Channel(abc.ABC):
    """Base class of channels. Subclasses implement :meth:`deliver`; the class
    attributes are defaults that subclasses or constructor arguments override."""

    kind: str = "custom"
    """What the channel is, as delivery listings show it: ``webhook``, ``http``,
    ``email``, ``rabbitmq``, ``nats``, ``redis``; ``custom`` for one of yours."""
    uncertain: UncertainPolicy = "resend"
    max_in_flight: int = 4
    rate_limit: float | None = None
    """Deliveries per second across all dispatchers; ``None``: no limit."""
    schedule: Sequence[float] | None = None
    """Retry delays; ``None``: the outbound settings' schedule."""
    bounded: bool = False
    """``True``: :meth:`deliver` ends within ``delivery.deadline`` by itself, so the
    dispatcher sets no timer of its own (the HTTP channels time the whole attempt)."""

    def __init__(
        self,
        *,
        uncertain: UncertainPolicy | None = None,
        max_in_flight: int | None = None,
        rate_limit: float | None = None,
        schedule: Sequence[float] | None = None,
    ) -> None:
        if uncertain is not None:
            self.uncertain = uncertain
        if max_in_flight is not None:
            self.max_in_flight = max_in_flight
        if rate_limit is not None:
            self.rate_limit = rate_limit
        if schedule is not None:
            self.schedule = tuple(schedule)
        if self.uncertain not in ("resend", "review", "accept"):
            raise ValueError(f"uncertain must be resend, review or accept, not {self.uncertain!r}")
        self.name = ""
        self.outbound: Outbound | None = None

    def bind(self, outbound: Outbound, name: str) -> None:
        """Called once when the channel is registered under ``name``."""
        self.outbound = outbound
        self.name = name

    @abc.abstractmethod
    async def deliver(self, delivery: Delivery) -> Result:
        """Make one attempt and classify it. Must return within
        ``delivery.deadline`` seconds and should not raise: an exception is recorded as
        a transient failure."""

    async def close(self) -> None:  # noqa: B027 (optional hook, nothing to release here)
        """Release connections (the dispatcher calls it when it stops)."""
