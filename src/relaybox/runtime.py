"""What the parts of relaybox need from the application: :class:`Runtime`.

A part (the operator use cases, the sending side's services, the dispatcher, the
recorder, retention, replay, metrics) takes a ``Runtime``: the store, the clock, the
settings and the metrics, nothing else. :class:`relaybox.Relaybox` is one (it wires
and runs the parts); a test or an embedding may pass any object with these four.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from relaybox.clock import Clock
    from relaybox.config import Settings
    from relaybox.metrics import Metrics
    from relaybox.store import Store

__all__ = ["Runtime"]


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
