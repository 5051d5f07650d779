"""Prometheus metrics, and the numbers every operator surface shares.

Each Relaybox has its own registry, so several boxes (tests, embedded apps) never
collide; ``/metrics`` exposes it. Two kinds of series live in it:

* **process counters and histograms** that the code paths update as they run
  (accept latency, processing outcomes, outbound delivery latency and results,
  reconciliation divergences, purged payloads);
* **queue gauges read from the database at scrape time** (:class:`QueueCollector`):
  pending rows and the age of the oldest one per queue and source, retrying rows,
  unresolved dead letters by reason, open quarantine entries. They are read from the
  tables rather than counted in memory because several processes share one database
  and a restart must not reset "how stuck are we". A snapshot is reused for up to
  :attr:`Metrics.cache_seconds`, so a scrape storm costs one query per second.

:func:`read_ops_stats` is that snapshot; ``relaybox stats`` and the dashboard
overview show the same :class:`OpsStats`, so the three never disagree.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from relaybox.store.history import QueueGroup
from relaybox.store.operator import DatabaseHealth
from relaybox.store.silence import SilenceSummary

if TYPE_CHECKING:
    from relaybox.runtime import Runtime
    from relaybox.store import Store

__all__ = [
    "DEAD_REASONS",
    "AcceptTally",
    "Metrics",
    "OpsStats",
    "QueueCollector",
    "read_ops_stats",
    "status_class",
]

log = structlog.get_logger("relaybox.metrics")

DEAD_REASONS = ("invalid", "exhausted", "conflict", "unhandled")
"""Dead-letter reasons of the inbox, always exported (as 0 when none), so an alert on
``relaybox_dead_letters{reason="exhausted"} > 0`` has a series before the first one."""

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)
_DELIVERY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


def status_class(status: int | None, error: str | None = None) -> str:
    """``2xx``…``5xx`` for an HTTP answer; ``timeout`` or ``network`` when none came."""
    if status is None:
        return "timeout" if error == "timeout" else "network"
    return f"{status // 100}xx"


@dataclass(frozen=True)
class OpsStats:
    """One consistent read of the queues, taken at ``taken_at`` (the box's clock)."""

    taken_at: float
    groups: tuple[QueueGroup, ...]
    quarantined_by_source: dict[str, int] = field(default_factory=dict)
    blocked_keys: int = 0
    """Ordering keys dead deliveries hold back (docs/howto/ordered-delivery.md)."""

    def _sum(self, queue: str, *, status: str, **match: Any) -> int:
        return sum(
            g.count
            for g in self.groups
            if g.queue == queue
            and g.status == status
            and all(getattr(g, k) == v for k, v in match.items())
        )

    def sources(self, queue: str) -> list[str]:
        return sorted({g.source for g in self.groups if g.queue == queue})

    def pending(self, queue: str, source: str | None = None) -> int:
        return sum(
            g.count
            for g in self.groups
            if g.queue == queue and g.status == "pending" and source in (None, g.source)
        )

    def oldest_pending_age(self, queue: str, source: str | None = None) -> float | None:
        """Seconds since the oldest pending row was received (``None``: none pending).
        The first signal to watch: it grows when anything is stuck, whatever the cause."""
        oldest = [
            g.oldest
            for g in self.groups
            if g.queue == queue and g.oldest is not None and source in (None, g.source)
        ]
        return None if not oldest else max(0.0, self.taken_at - min(oldest))

    def dead_by_reason(self, queue: str = "inbox") -> dict[str, int]:
        """Unresolved dead letters (discarded ones excluded) per reason."""
        out = dict.fromkeys(DEAD_REASONS, 0) if queue == "inbox" else {}
        for g in self.groups:
            if g.queue == queue and g.status == "dead" and not g.discarded:
                key = g.reason or "unspecified"
                out[key] = out.get(key, 0) + g.count
        return out

    @property
    def quarantined(self) -> int:
        return sum(self.quarantined_by_source.values())

    def summary(self) -> dict[str, Any]:
        """The numbers ``relaybox stats --json`` prints and the overview shows."""
        dead = self.dead_by_reason("inbox")
        age = self.oldest_pending_age("inbox")
        out_age = self.oldest_pending_age("outbox")
        return {
            "pending": self.pending("inbox"),
            "oldest_pending_age_seconds": None if age is None else round(age, 3),
            "retrying": sum(
                g.retrying for g in self.groups if g.queue == "inbox" and g.status == "pending"
            ),
            "done": self._sum("inbox", status="done"),
            "ignored": self._sum("inbox", status="ignored"),
            "dead": sum(dead.values()),
            "dead_invalid": dead["invalid"],
            "dead_exhausted": dead["exhausted"],
            "dead_by_reason": dead,
            "discarded": self._sum("inbox", status="dead", discarded=True),
            "quarantined": self.quarantined,
            "outbox": {
                "pending": self.pending("outbox"),
                "oldest_pending_age_seconds": None if out_age is None else round(out_age, 3),
                "sent": self._sum("outbox", status="sent"),
                "held": self._sum("outbox", status="held"),
                "dead": self._sum("outbox", status="dead"),
            },
        }


async def read_ops_stats(store: Store, now: float) -> OpsStats:
    """Read the queue snapshot in one transaction (one consistent view on PostgreSQL)."""
    snapshot = await store.history.ops_stats_queues()
    return OpsStats(
        taken_at=now,
        groups=snapshot.groups,
        quarantined_by_source=snapshot.quarantined_by_source,
        blocked_keys=await store.outbox.ordering_blocked_count(),
    )


class Tally(Collector):
    """A histogram and a counter counted in plain numbers under one lock and turned
    into metric families when collected: ~0.5 to 1.3 µs an observation, where a
    prometheus_client ``Histogram`` and ``Counter`` took ~1.7 to 2.6 µs (a lock for each
    bucket, sum and count, and their checks). The lock is for callers in threads (the
    Django view answers in threads). ``histogram`` and ``counter``: each series' name,
    help and label names; the counter's name without ``_total``, as prometheus_client
    takes it."""

    def __init__(
        self,
        histogram: tuple[str, str, list[str]],
        counter: tuple[str, str, list[str]],
        buckets: tuple[float, ...],
    ) -> None:
        self._histogram, self._counter = histogram, counter
        self._bounds = buckets
        # The buckets' ``le`` labels as prometheus_client writes them ("0.001", "1.0", "+Inf").
        self._le = (*(repr(float(bound)) for bound in buckets), "+Inf")
        self._lock = threading.Lock()
        # Per histogram labels: [sum, count in bucket 0, …, count over the last bound].
        self._seconds: dict[tuple[str, ...], list[float]] = {}
        self._counts: dict[tuple[str, ...], int] = {}

    def count(self, labels: tuple[str, ...], counted: tuple[str, ...], seconds: float) -> None:
        """One observation of ``seconds`` under the histogram's ``labels``, counted
        under the counter's ``counted``."""
        slot = bisect.bisect_left(self._bounds, seconds) + 1
        with self._lock:
            row = self._seconds.get(labels)
            if row is None:
                row = self._seconds[labels] = [0.0] * (len(self._bounds) + 2)
            row[0] += seconds
            row[slot] += 1
            self._counts[counted] = self._counts.get(counted, 0) + 1

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            seconds = {labels: list(row) for labels, row in self._seconds.items()}
            counts = dict(self._counts)
        name, text, labels = self._histogram
        histogram = HistogramMetricFamily(name, text, labels=labels)
        for values, row in sorted(seconds.items()):
            cumulative, buckets = 0.0, []
            for le, count in zip(self._le, row[1:], strict=True):
                cumulative += count
                buckets.append((le, cumulative))
            histogram.add_metric(list(values), buckets, row[0])
        yield histogram
        name, text, labels = self._counter
        counter = CounterMetricFamily(name, text, labels=labels)
        for values, count in sorted(counts.items()):
            counter.add_metric(list(values), count)
        yield counter


class AcceptTally(Tally):
    """The receiver's two series: ``relaybox_accept_seconds`` (a histogram by status
    class) and ``relaybox_inbound_deliveries`` (a counter by status)."""

    def __init__(self) -> None:
        super().__init__(
            (
                "relaybox_accept_seconds",
                "Time to answer an inbound delivery, by HTTP status class.",
                ["status_class"],
            ),
            ("relaybox_inbound_deliveries", "Inbound deliveries by HTTP status.", ["status"]),
            _LATENCY_BUCKETS,
        )
        self._keys: dict[int, tuple[tuple[str], tuple[str]]] = {}

    def observe(self, status: int, seconds: float) -> None:
        # Tally.count's body, inlined: this runs for every request the receiver
        # answers, and the call was 15 of its ~1,870 Python opcodes.
        keys = self._keys.get(status)
        if keys is None:
            keys = self._keys[status] = ((f"{status // 100}xx",), (str(status),))
        cls, counted = keys
        slot = bisect.bisect_left(self._bounds, seconds) + 1
        with self._lock:
            row = self._seconds.get(cls)
            if row is None:
                row = self._seconds[cls] = [0.0] * (len(self._bounds) + 2)
            row[0] += seconds
            row[slot] += 1
            self._counts[counted] = self._counts.get(counted, 0) + 1


class QueueCollector(Collector):
    """Yields the database gauges from the snapshot that :meth:`Metrics.scrape` took.

    ``collect()`` is synchronous (prometheus_client's contract) and runs inside the
    event loop, so it never touches the database itself: the async scrape refreshes
    the snapshot first, then renders."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        snap = self._metrics.snapshot
        up = GaugeMetricFamily(
            "relaybox_database_up",
            "1 when the last scrape read the queue tables, 0 when the database failed.",
            value=0.0 if snap is None or self._metrics.snapshot_error else 1.0,
        )
        yield up
        if snap is None:
            return
        labels = ["queue", "source"]
        pending = GaugeMetricFamily(
            "relaybox_queue_pending", "Rows waiting to be processed or sent.", labels=labels
        )
        oldest = GaugeMetricFamily(
            "relaybox_queue_oldest_pending_age_seconds",
            "Seconds since the oldest pending row was received (0 when none is pending).",
            labels=labels,
        )
        retrying = GaugeMetricFamily(
            "relaybox_queue_retrying",
            "Pending rows that already failed at least once.",
            labels=labels,
        )
        attempts = GaugeMetricFamily(
            "relaybox_queue_pending_attempts",
            "Attempts already used by the rows still pending.",
            labels=labels,
        )
        rows = GaugeMetricFamily(
            "relaybox_queue_rows",
            "Rows per status (done, ignored, sent, held …), kept until retention.",
            labels=[*labels, "status"],
        )
        dead = GaugeMetricFamily(
            "relaybox_dead_letters",
            "Dead letters waiting for an operator (discarded ones excluded), by reason.",
            labels=[*labels, "reason"],
        )
        quarantined = GaugeMetricFamily(
            "relaybox_quarantined",
            "Deliveries in quarantine (an accepted event id with other content), unresolved.",
            labels=["source"],
        )
        for queue in ("inbox", "outbox"):
            for source in snap.sources(queue):
                key = [queue, source]
                pending.add_metric(key, snap.pending(queue, source))
                oldest.add_metric(key, snap.oldest_pending_age(queue, source) or 0.0)
                mine = [g for g in snap.groups if g.queue == queue and g.source == source]
                retrying.add_metric(key, sum(g.retrying for g in mine if g.status == "pending"))
                attempts.add_metric(key, sum(g.attempts for g in mine if g.status == "pending"))
                statuses: dict[str, int] = {}
                reasons = dict.fromkeys(DEAD_REASONS, 0) if queue == "inbox" else {}
                for g in mine:
                    if g.status == "dead" and not g.discarded:
                        reason = g.reason or "unspecified"
                        reasons[reason] = reasons.get(reason, 0) + g.count
                    elif g.status not in ("pending", "dead"):
                        statuses[g.status] = statuses.get(g.status, 0) + g.count
                for status, n in sorted(statuses.items()):
                    rows.add_metric([*key, status], n)
                for reason, n in sorted(reasons.items()):
                    dead.add_metric([*key, reason], n)
        for source, n in sorted(snap.quarantined_by_source.items()):
            quarantined.add_metric([source], n)
        yield from (pending, oldest, retrying, attempts, rows, dead, quarantined)
        paused = self._metrics.paused
        if paused is not None:
            yield GaugeMetricFamily(
                "relaybox_paused_endpoints", "Webhook endpoints paused.", value=len(paused)
            )
            yield GaugeMetricFamily(
                "relaybox_paused_deliveries",
                "Webhook deliveries waiting for their paused endpoint to be resumed.",
                value=sum(paused.values()),
            )
        yield from _silence_gauges(self._metrics.silences, snap.taken_at)
        yield GaugeMetricFamily(
            "relaybox_outbound_blocked_keys",
            "Ordering keys that a dead delivery holds back on an ordered endpoint (on_dead hold).",
            value=snap.blocked_keys,
        )
        health = self._metrics.health
        if health is not None:
            yield from _health_metrics(health)


def _health_metrics(health: DatabaseHealth) -> Iterator[Metric]:
    """Long transactions and dead rows (PostgreSQL), free pages and the write-ahead
    log (SQLite): :class:`~relaybox.store.operator.DatabaseHealth`."""
    if health.pages is None:  # PostgreSQL
        oldest = GaugeMetricFamily(
            "relaybox_db_oldest_transaction_seconds",
            "Seconds the oldest open transaction of another session has run: scope "
            "'relaybox' those holding a lock on relaybox's tables, 'database' any (which "
            "keeps vacuum from removing dead rows); 0 when none is open.",
            labels=["scope"],
        )
        oldest.add_metric(["relaybox"], health.oldest(relaybox=True) or 0.0)
        oldest.add_metric(["database"], health.oldest(relaybox=False) or 0.0)
        yield oldest
        idle = GaugeMetricFamily(
            "relaybox_db_idle_in_transaction",
            "Sessions idle inside an open transaction that holds a lock on relaybox's tables.",
            value=sum(
                1
                for t in health.transactions
                if t["relaybox"] and t["state"] == "idle in transaction"
            ),
        )
        yield idle
        dead = GaugeMetricFamily(
            "relaybox_db_dead_rows",
            "Dead row versions in relaybox's tables (pg_stat_user_tables), by table.",
            labels=["table"],
        )
        ratio = GaugeMetricFamily(
            "relaybox_db_dead_row_ratio",
            "Dead rows over live and dead rows of a relaybox table (0 when empty).",
            labels=["table"],
        )
        for t in health.tables:
            total = t["live"] + t["dead"]
            dead.add_metric([t["table"]], t["dead"])
            ratio.add_metric([t["table"]], t["dead"] / total if total else 0.0)
        yield dead
        yield ratio
    else:  # SQLite
        yield GaugeMetricFamily(
            "relaybox_db_free_page_ratio",
            "SQLite: pages of the file freed by deletes (only VACUUM returns them) over all.",
            value=(health.free_pages or 0) / health.pages if health.pages else 0.0,
        )
        if health.wal_bytes is not None:
            yield GaugeMetricFamily(
                "relaybox_db_wal_bytes",
                "SQLite: size of the write-ahead log; it grows while a long read keeps "
                "checkpoints from reaching its end.",
                value=health.wal_bytes,
            )


def _silence_gauges(summary: SilenceSummary | None, now: float) -> Iterator[Metric]:
    """Silence detection's gauges (:mod:`relaybox.silence`), from the state its last
    check left: per watched source, seconds since its last arrival while it is silent
    (0 otherwise); for endpoints, labelled by nothing a tenant creates, how many are
    silent and the longest silence."""
    if summary is None:
        return
    sources = GaugeMetricFamily(
        "relaybox_source_silent_seconds",
        "Seconds since a watched source's last arrival while it is silent (past its "
        "traffic window, [silence.sources]); 0 while it is not.",
        labels=["source"],
    )
    for state in summary.sources:
        silent = state.silent_since is not None and state.last_seen is not None
        seconds = max(0.0, now - (state.last_seen or now)) if silent else 0.0
        sources.add_metric([state.name], seconds)
    yield sources
    yield GaugeMetricFamily(
        "relaybox_silent_endpoints",
        "Webhook endpoints that took nothing for their window while deliveries wait.",
        value=summary.silent_endpoints,
    )
    longest = summary.endpoints[0].last_seen if summary.endpoints else None
    yield GaugeMetricFamily(
        "relaybox_endpoint_silent_seconds",
        "Seconds since the last success of the silent endpoint that has been silent "
        "longest (0: none is silent).",
        value=0.0 if longest is None else max(0.0, now - longest),
    )


class Metrics:
    """The registry of one Relaybox, with the metrics its parts update.

    Names other parts call (each one a method, so label order lives here):
    :meth:`observe_accept` (receiver), ``processed`` (worker),
    :meth:`observe_delivery` (outbound dispatcher), :meth:`observe_divergence`
    (reconciliation), :meth:`observe_purge` (retention), :meth:`observe_clock`
    (:class:`relaybox.clock.ClockGuard`).
    """

    cache_seconds = 1.0

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.accepts = AcceptTally()
        self.registry.register(self.accepts)
        self.processed = Counter(
            "relaybox_inbox_outcomes",
            "Inbox processing outcomes (done, retry, dead_invalid, dead_exhausted).",
            ["source", "outcome"],
            registry=self.registry,
        )
        self.deliveries = Tally(
            (
                "relaybox_delivery_seconds",
                "Duration of one outbound delivery attempt (request sent to answer read),"
                " by channel.",
                ["channel", "status_class"],
            ),
            (
                "relaybox_delivery_results",
                "Outbound delivery attempts by channel and result (2xx…5xx, timeout, network).",
                ["channel", "status_class"],
            ),
            _DELIVERY_BUCKETS,
        )
        self.registry.register(self.deliveries)
        self.reconcile_divergences = Counter(
            "relaybox_reconcile_divergences",
            "Reconciliation found the local state differing from the provider's.",
            ["source"],
            registry=self.registry,
        )
        self.purged_payloads = Counter(
            "relaybox_purged_payloads",
            "Payloads dropped by retention (inbox events and resolved quarantine entries).",
            ["table"],
            registry=self.registry,
        )
        # 0 on a box that never reads the database's clock (SQLite, a clock of its own).
        self.clock_offset = Gauge(
            "relaybox_clock_offset_seconds",
            "The database server's clock minus this process's host clock, at the last read.",
            registry=self.registry,
        )
        self.clock_skew_exceeded = Gauge(
            "relaybox_clock_skew_exceeded",
            "1 while this host's clock is more than clock_max_skew from the database's: "
            "its worker and dispatcher take no work.",
            registry=self.registry,
        )
        self.snapshot: OpsStats | None = None
        # Per paused endpoint, its waiting deliveries (summed: no per-endpoint series).
        self.paused: dict[str, int] | None = None
        # Silence detection's state rows, as its last check left them.
        self.silences: SilenceSummary | None = None
        self.snapshot_error: str | None = None
        self.health: DatabaseHealth | None = None
        self._snapshot_read_at = -math.inf
        self._refresh_lock = asyncio.Lock()
        self.registry.register(QueueCollector(self))

    # -- observations -----------------------------------------------------------

    def observe_accept(self, status: int, seconds: float) -> None:
        self.accepts.observe(status, seconds)

    def observe_delivery(
        self, channel: str, status: int | None, seconds: float, *, error: str | None = None
    ) -> None:
        """One outbound attempt of ``channel``: ``status`` is the HTTP answer, or
        ``None`` with ``error="timeout"`` / any other error (counted as ``network``).
        Labelled by channel (registered by code: a bounded set), never by endpoint,
        which tenants create: per-endpoint detail is the attempt log's."""
        labels = (channel, status_class(status, error))
        self.deliveries.count(labels, labels, seconds)

    def observe_divergence(self, source: str, count: int = 1) -> None:
        self.reconcile_divergences.labels(source).inc(count)

    def observe_clock(self, offset: float, max_skew: float) -> None:
        self.clock_offset.set(offset)
        self.clock_skew_exceeded.set(1 if abs(offset) > max_skew else 0)

    def observe_purge(self, table: str, count: int) -> None:
        self.purged_payloads.labels(table).inc(count)

    # -- exposition -------------------------------------------------------------

    async def refresh(self, box: Runtime) -> OpsStats | None:
        """Re-read the queue snapshot unless the last one is fresher than
        :attr:`cache_seconds`. A database failure is reported as
        ``relaybox_database_up 0`` instead of failing the whole scrape."""
        async with self._refresh_lock:
            loop = asyncio.get_running_loop()
            if loop.time() - self._snapshot_read_at < self.cache_seconds:
                return self.snapshot
            try:
                self.snapshot = await read_ops_stats(box.store, box.clock.now())
                self.paused = await box.store.flow.endpoint_paused_backlog()
                self.silences = await box.store.silence.summary(limit=1)
                self.snapshot_error = None
            except Exception as exc:
                first_line = str(exc).splitlines()[0] if str(exc) else ""
                self.snapshot_error = f"{type(exc).__name__}: {first_line[:200]}"
                log.warning("metrics_snapshot_failed", error=self.snapshot_error)
            if self.snapshot_error is None:
                try:  # statistics views: their failure is not the queues'
                    self.health = await box.store.operator.database_health()
                except Exception as exc:
                    self.health = None
                    log.warning("metrics_health_failed", error=f"{type(exc).__name__}: {exc}"[:200])
            self._snapshot_read_at = loop.time()
            return self.snapshot

    async def scrape(self, box: Runtime) -> bytes:
        """What ``GET /metrics`` answers: a fresh (≤ 1 s old) snapshot, rendered."""
        await self.refresh(box)
        return self.render()

    def render(self) -> bytes:
        return generate_latest(self.registry)
