"""Prometheus metrics. Each Relaybox has its own registry, so several boxes (tests,
embedded apps) never collide; ``/metrics`` exposes it."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

__all__ = ["Metrics"]


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.accept_seconds = Histogram(
            "relaybox_accept_seconds",
            "Time to answer an inbound delivery, by HTTP status class.",
            ["status_class"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
        )
        self.deliveries = Counter(
            "relaybox_inbound_deliveries",
            "Inbound deliveries by HTTP status.",
            ["status"],
            registry=self.registry,
        )
        self.processed = Counter(
            "relaybox_inbox_outcomes",
            "Inbox processing outcomes (done, retry, dead_invalid, dead_exhausted).",
            ["source", "outcome"],
            registry=self.registry,
        )

    def observe_accept(self, status: int, seconds: float) -> None:
        self.accept_seconds.labels(f"{status // 100}xx").observe(seconds)
        self.deliveries.labels(str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
