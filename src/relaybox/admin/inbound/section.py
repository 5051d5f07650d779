"""The receiving side's sections (inbox, dead letters, quarantine) and the overview's
"Inbox by source" panel, registered by :func:`register`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from relaybox.admin.inbound.api import DEAD_OPERATIONS, INBOX_OPERATIONS, QUARANTINE_OPERATIONS
from relaybox.admin.inbound.pages import DEAD_PAGES, INBOX_PAGES, QUARANTINE_PAGES
from relaybox.admin.sections import OverviewPanel, Section, register_section
from relaybox.metrics import read_ops_stats

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = ["register"]


async def _sources_panel(box: Runtime) -> OverviewPanel | None:
    snap = await read_ops_stats(box.store, box.clock.now())
    rows = []
    for source in snap.sources("inbox"):
        age = snap.oldest_pending_age("inbox", source)
        dead = sum(
            g.count
            for g in snap.groups
            if g.queue == "inbox" and g.source == source and g.status == "dead" and not g.discarded
        )
        quarantined = snap.quarantined_by_source.get(source, 0)
        rows.append((source, snap.pending("inbox", source), age, dead, quarantined))
    if not rows:
        return None
    return OverviewPanel(
        title="Inbox by source",
        columns=("source", "pending", "oldest pending", "dead", "quarantined"),
        rows=rows,
        metric="sources",
    )


def register() -> None:
    register_section(
        Section(
            "inbox",
            "Inbox",
            10,
            nav_path="/inbox",
            operations=INBOX_OPERATIONS,
            pages=INBOX_PAGES,
            overview=_sources_panel,
            tag_description="Received events, their attempts and replay.",
        )
    )
    register_section(
        Section(
            "dead",
            "Dead letters",
            20,
            nav_path="/dead",
            operations=DEAD_OPERATIONS,
            pages=DEAD_PAGES,
            tag_description="Events that will not be retried without an operator.",
        )
    )
    register_section(
        Section(
            "quarantine",
            "Quarantine",
            30,
            nav_path="/quarantine",
            operations=QUARANTINE_OPERATIONS,
            pages=QUARANTINE_PAGES,
            tag_description="Deliveries that reused an accepted event id with other content.",
        )
    )
