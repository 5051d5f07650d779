"""The dashboard's home page: the receiving side's counts and the last hour's
throughput, each section's panel (:attr:`relaybox.admin.sections.Section.overview`),
channels no dispatcher delivers, and silence detection's state."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from relaybox.admin.html import box_of, page, render
from relaybox.ops import inbound as ops

__all__ = ["OVERVIEW_PAGES"]


def _chart(buckets: list[dict[str, Any]]) -> dict[str, Any]:
    """Stacked bars (one per minute) as SVG rectangles: no chart library needed."""
    width, height, pad = 600, 120, 2
    colors = {"done": "#2e7d32", "pending": "#f9a825", "dead": "#c62828", "ignored": "#90a4ae"}
    peak = max((b["total"] for b in buckets), default=0) or 1
    bar = width / max(len(buckets), 1)
    rects = []
    for i, b in enumerate(buckets):
        y = height
        minute = datetime.fromtimestamp(b["minute"] * 60, UTC).strftime("%H:%M")
        for status in ("done", "ignored", "pending", "dead"):
            n = b["by_status"].get(status, 0)
            if not n:
                continue
            h = max(1.0, n / peak * (height - pad))
            y -= h
            rects.append(
                {
                    "x": round(i * bar + 0.5, 2),
                    "y": round(y, 2),
                    "w": round(max(bar - 1, 1), 2),
                    "h": round(h, 2),
                    "color": colors[status],
                    "title": f"{minute} UTC: {n} {status}",
                }
            )
    total = sum(b["total"] for b in buckets)
    return {
        "width": width,
        "height": height,
        "rects": rects,
        "peak": peak,
        "total": total,
        "colors": colors,
    }


@page
async def overview(request: Request) -> Response:
    box = box_of(request)
    stats = await ops.stats(box)
    panels = []
    for section in request.app.state.sections:
        if section.overview is None:
            continue
        if await request.app.state.tables.missing(section.requires_tables):
            continue
        panel = await section.overview(box)
        if panel is not None:
            panels.append(panel)
    chart = _chart(await ops.throughput(box))
    # Silence detection's state (relaybox.silence): the watched sources and at most
    # ten silent endpoints, whatever the number of endpoints.
    silence = await box.store.silence.summary(limit=10)
    return await render(
        request,
        "overview.html",
        active="overview",
        stats=stats,
        chart=chart,
        panels=panels,
        unregistered=await ops.unregistered_channels(box),
        silence=silence,
        silent=len(silence.silent_sources) + silence.silent_endpoints,
        now=box.clock.now(),
    )


OVERVIEW_PAGES = (Route("/", overview, methods=["GET"]),)
