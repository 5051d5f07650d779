"""Silence detection: a source that has sent nothing for longer than its traffic
window, or a webhook endpoint that has taken nothing while deliveries wait for it.

A quiet provider is the failure nothing else sees: no request fails, no queue grows.
Each source named under ``[silence.sources.<name>]`` (:mod:`relaybox.config.silence`)
expects traffic at least once every ``expect_every`` within its hours and days, or at
a learned window: the ``learn_percentile`` of the gaps between its newest arrivals of
the last ``learn_weeks`` (at most ``learn_max_arrivals`` of them, through an index),
times ``learn_margin``, kept between ``learn_floor`` and ``learn_cap``; until
``learn_min_arrivals`` have arrived, a learned source raises nothing. With
``[silence.endpoints]`` every enabled, unpaused endpoint outside the operational
tenant is watched: silent when deliveries have waited for it, and it has had no
success, for ``expect_every`` (within its hours and days).

The check (:class:`SilenceWatch`) runs in the maintenance role every
``silence.check_every`` seconds, off the serving loop; each run reads each source's
newest arrival and each endpoint's first waiting deliveries in one statement each.
What it saw is kept in ``relaybox_silences``, and a silence is raised, then ended,
by conditional updates: of several hosts checking at once, one announces it. Its
start and its end are operational events (:mod:`relaybox.outbound.announce`):

    relaybox.source.silent      a source sent nothing for its window
    relaybox.source.resumed     its traffic came back
    relaybox.endpoint.silent    an endpoint took nothing for its window while
                                deliveries wait
    relaybox.endpoint.resumed   it took a delivery again, or none waits any more

``/metrics`` shows ``relaybox_source_silent_seconds{source}`` (seconds since a silent
source's last arrival, 0 while it is not silent), ``relaybox_silent_endpoints`` and
``relaybox_endpoint_silent_seconds`` (the longest silence of an endpoint); the
dashboard shows a badge and ``relaybox doctor`` a finding. When a source with a pull
recovery (:func:`relaybox.inbound.recovery.register`) goes silent, one recovery run starts
(``silence.recover``), over the silence and at most ``recover_max_age`` back, within
``recover_timeout``, and its report is logged.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import structlog

from relaybox.clock import every
from relaybox.inbound import recovery
from relaybox.outbound.announce import emit
from relaybox.outbound.registry import outbound

if TYPE_CHECKING:
    from relaybox.config.silence import SilenceSettings, SilenceWindow
    from relaybox.runtime import InboundRuntime
    from relaybox.store.silence import SilenceKind, SilenceState

__all__ = ["SilenceReport", "SilenceWatch", "learned_window"]

log = structlog.get_logger("relaybox.silence")

RECOVERY_MARGIN = 300.0
"""Seconds before a silent source's last arrival its recovery starts from."""


@dataclass
class SilenceReport:
    """What one check found: the names newly silent and resumed, per kind, and the
    recoveries it ran (their reports, or the error that ended them)."""

    checked_at: float
    silent: dict[str, list[str]] = field(default_factory=lambda: {"source": [], "endpoint": []})
    resumed: dict[str, list[str]] = field(default_factory=lambda: {"source": [], "endpoint": []})
    recoveries: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def learned_window(arrivals: list[float], settings: SilenceSettings) -> float | None:
    """The window learned from arrival times (any order): the ``learn_percentile``
    of their gaps times ``learn_margin``, between ``learn_floor`` and ``learn_cap``;
    ``None`` with fewer than ``learn_min_arrivals``."""
    if len(arrivals) < settings.learn_min_arrivals:
        return None
    ordered = sorted(arrivals)
    gaps = sorted(b - a for a, b in itertools.pairwise(ordered))
    rank = max(0, math.ceil(settings.learn_percentile / 100 * len(gaps)) - 1)
    window = gaps[rank] * settings.learn_margin
    return min(settings.learn_cap, max(settings.learn_floor, window))


def _past(window: SilenceWindow, since: float, now: float, expected: float) -> bool:
    """Whether the time inside ``window`` since ``since`` reached ``expected`` (the
    wall clock first: the window's time is never more)."""
    return now - since >= expected and window.counted(since, now, expected) >= expected


@dataclass(frozen=True)
class _Judged:
    """One watched name in a check: what the database shows (``seen``: a source's
    newest arrival, an endpoint's last success), the window in force, its state."""

    name: str
    window: SilenceWindow
    seen: float | None
    expected: float | None
    state: SilenceState | None

    def last_seen(self, now: float) -> float:
        """``seen``; else the one stored; else ``now`` (first seen by this check)."""
        if self.seen is not None:
            return self.seen
        if self.state is not None and self.state.last_seen is not None:
            return self.state.last_seen
        return now


class SilenceWatch:
    """The check, every ``silence.check_every`` seconds: ``run()`` until :meth:`stop`,
    ``run_once()`` for one pass (``relaybox maintenance --once``, tests)."""

    def __init__(self, box: InboundRuntime, *, interval: float | None = None) -> None:
        self.box = box
        self.settings = box.settings.silence
        self.interval = interval or self.settings.check_every
        self._stopping = asyncio.Event()

    @property
    def watching(self) -> bool:
        """Whether any source or the endpoints are watched."""
        return bool(self.settings.sources) or self.settings.endpoints is not None

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        if not self.watching:
            await self._stopping.wait()
            return
        unknown = sorted(set(self.settings.sources) - set(self.box.sources))
        if unknown:
            log.warning("silence_unknown_sources", sources=unknown)
        await every(
            self.interval, self._stopping, self.run_once, logger=log, failed="silence_check_failed"
        )

    async def run_once(self) -> SilenceReport:
        """One check of every watched source and endpoint."""
        now = self.box.clock.now()
        report = SilenceReport(now)
        raised = await self._sources(now, report)
        await self._endpoints(now, report)
        for name, last_seen in raised:
            ran = await self._recover(name, last_seen, now)
            if ran is not None:
                report.recoveries[name] = ran
        return report

    # -- sources ------------------------------------------------------------------------

    async def _sources(self, now: float, report: SilenceReport) -> list[tuple[str, float]]:
        store = self.box.store
        windows = self.settings.sources
        await store.silence.forget("source", list(windows))
        if not windows:
            return []
        seen = await store.silence.sources_seen(list(windows))
        learned = await self._learned(windows, now)
        states = await store.silence.rows("source")
        judged = []
        for name, window in windows.items():
            expected = window.every if window.every is not None else learned.get(name)
            judged.append(_Judged(name, window, seen.get(name), expected, states.get(name)))
        await self._note("source", judged, now)
        raised: list[tuple[str, float]] = []
        for j in judged:
            if j.expected is None:
                continue  # a window still to learn: nothing is raised, nothing ended
            last = j.last_seen(now)
            silent = _past(j.window, last, now, j.expected)
            data = {
                "source": j.name,
                "lastArrivalAt": j.seen,
                "expectedEvery": j.expected,
                "learned": j.window.learned,
                "window": j.window.describe(),
            }
            if await self._turn("source", j, silent, last, now, data, report):
                raised.append((j.name, last))
        return raised

    async def _learned(
        self, windows: dict[str, SilenceWindow], now: float
    ) -> dict[str, float | None]:
        """The learned window of each source that learns: the stored one, learned
        again when older than ``learn_every``."""
        wanted = [name for name, w in windows.items() if w.learned]
        if not wanted:
            return {}
        store = self.box.store
        stored = await store.silence.rows("source")
        out: dict[str, float | None] = {}
        s = self.settings
        for name in wanted:
            state = stored.get(name)
            if (
                state is not None
                and state.learned_at is not None
                and now - state.learned_at < s.learn_every
            ):
                out[name] = state.learned
                continue
            since = now - s.learn_weeks * 7 * 86400
            arrivals = await store.silence.arrivals(name, since, s.learn_max_arrivals)
            out[name] = learned_window(arrivals, s)
            await store.silence.learned("source", name, out[name], now=now)
            log.info(
                "silence_window_learned", source=name, arrivals=len(arrivals), window=out[name]
            )
        return out

    # -- endpoints ----------------------------------------------------------------------

    async def _endpoints(self, now: float, report: SilenceReport) -> None:
        store = self.box.store
        window = self.settings.endpoints
        if window is None or window.every is None:
            await store.silence.forget("endpoint", [])
            return
        expected = window.every
        tenant = outbound(self.box).settings.operational_tenant
        found = await store.silence.endpoints(tenant)
        await store.silence.forget("endpoint", [e.id for e in found])
        states = await store.silence.rows("endpoint")
        # No success noted (none since the endpoint was made, or since migration
        # 0024): the wait of its deliveries alone counts.
        judged = [
            _Judged(
                e.id,
                window,
                e.last_success_at if e.last_success_at is not None else e.created_at,
                expected,
                states.get(e.id),
            )
            for e in found
        ]
        await self._note("endpoint", judged, now)
        for n, (e, j) in enumerate(zip(found, judged, strict=True)):
            if n % 100 == 99:
                await asyncio.sleep(0)  # the maintenance role may share a server's loop
            last = j.last_seen(now)
            silent = False
            start = last
            if e.waiting_since is not None:
                start = max(last, e.waiting_since)
                silent = _past(window, start, now, expected)
            data = {
                "endpointId": e.id,
                "tenant": e.tenant,
                "url": e.url,
                "lastSuccessAt": e.last_success_at,
                "waitingSince": e.waiting_since,
                "expectedEvery": expected,
                "window": window.describe(),
            }
            await self._turn("endpoint", j, silent, start, now, data, report)

    # -- state ----------------------------------------------------------------------------

    async def _note(self, kind: SilenceKind, judged: list[_Judged], now: float) -> None:
        """Write what this check saw, for the names whose values changed (or new):
        one statement, however many names."""
        changed = [
            (j.name, j.last_seen(now), j.expected)
            for j in judged
            if j.state is None
            or j.state.last_seen != j.last_seen(now)
            or j.state.expected != j.expected
        ]
        await self.box.store.silence.note(kind, changed, now=now)

    async def _turn(
        self,
        kind: SilenceKind,
        j: _Judged,
        silent: bool,
        since: float,
        now: float,
        data: dict[str, Any],
        report: SilenceReport,
    ) -> bool:
        """Raise a silence, or end one, in one transaction with its event; ``True``
        when this check raised it (another host's check may have been first)."""
        was = j.state.silent_since if j.state is not None else None
        store = self.box.store
        if silent and was is None:
            async with store.transaction() as conn:
                if not await store.silence.start(conn, kind, j.name, now=now):
                    return False
                await self._announce(conn, kind, j.name, "silent", since, now, data, None)
            report.silent[kind].append(j.name)
            return True
        if not silent and was is not None:
            async with store.transaction() as conn:
                if not await store.silence.end(conn, kind, j.name):
                    return False
                await self._announce(conn, kind, j.name, "resumed", since, now, data, was)
            report.resumed[kind].append(j.name)
        return False

    # -- events and recovery ------------------------------------------------------------

    async def _announce(
        self,
        conn: Any,
        kind: SilenceKind,
        name: str,
        what: str,
        since: float,
        now: float,
        data: dict[str, Any],
        silent_since: float | None,
    ) -> None:
        if what == "silent":
            body = {**data, "silentSince": since, "silentSeconds": round(now - since, 3)}
            key = f"silence:{kind}:{name}:{since!r}"
        else:
            body = {**data, "silentSince": silent_since, "resumedAt": now}
            key = f"silence-end:{kind}:{name}:{silent_since!r}"
        await emit(self.box, conn, f"relaybox.{kind}.{what}", body, key=key)
        level = log.warning if what == "silent" else log.info
        level(f"{kind}_{what}", name=name, since=since if what == "silent" else silent_since)

    async def _recover(self, source: str, last_seen: float, now: float) -> Any:
        """One recovery run for a source that went silent, if it has a delivery log
        and ``silence.recover`` is on: its report, or the error that ended it."""
        factory = recovery.log_for(self.box, source)
        if factory is None or not self.settings.recover:
            return None
        since = max(last_seen - RECOVERY_MARGIN, now - self.settings.recover_max_age)
        deliveries = factory()
        try:
            async with asyncio.timeout(self.settings.recover_timeout):
                found = await recovery.recover(self.box, source, deliveries, since=since)
        except Exception as exc:  # logged and reported: the check goes on
            error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            log.error("silence_recovery_failed", source=source, since=since, error=error)
            return {"error": error, "since": since}
        finally:
            await deliveries.close()
        result = found.as_dict()
        log.info(
            "silence_recovery",
            source=source,
            since=since,
            listed=found.listed,
            missing=len(found.missing),
            ingested=len(found.ingested),
            failed=len(found.failed),
        )
        return result
