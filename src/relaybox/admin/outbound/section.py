"""The sending side's sections (endpoints, messages, the delivery log) and the
overview's success-rate panel, registered by :func:`register`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from relaybox.admin.outbound import sending
from relaybox.admin.outbound.api import ENDPOINT_OPERATIONS, MESSAGE_OPERATIONS
from relaybox.admin.outbound.flow import FLOW_OPERATIONS, FLOW_PAGES
from relaybox.admin.outbound.ordered import ORDERED_OPERATIONS
from relaybox.admin.outbound.pages import ENDPOINT_PAGES, MESSAGE_PAGES
from relaybox.admin.sections import OverviewPanel, Section, register_section
from relaybox.ops.outbound import endpoint_list
from relaybox.ops.outbound_models import EndpointFilter

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = ["TABLES", "overview_panel", "register"]


TABLES = ("relaybox_endpoints", "relaybox_messages", "relaybox_outbox_attempts")


async def overview_panel(box: Runtime) -> OverviewPanel | None:
    """Delivery success rate per endpoint over the last 24 hours."""
    summaries = (await endpoint_list(box, EndpointFilter(limit=50))).items
    if not summaries:
        return None
    rows = [
        (
            e.id,
            e.status,
            e.health.attempts,
            "-" if e.health.success_rate is None else f"{e.health.success_rate:.1%}",
            e.health.pending,
            e.health.dead,
        )
        for e in summaries
    ]
    return OverviewPanel(
        title="Delivery success rate per endpoint (24 h)",
        columns=("endpoint", "status", "attempts", "success rate", "pending", "dead"),
        rows=rows,
        metric="endpoints",
    )


def register() -> None:
    """Add the endpoints and messages sections (shown once their tables exist)."""
    register_section(
        Section(
            "endpoints",
            "Endpoints",
            40,
            nav_path="/endpoints",
            operations=ENDPOINT_OPERATIONS + FLOW_OPERATIONS + ORDERED_OPERATIONS,
            pages=ENDPOINT_PAGES + FLOW_PAGES,
            requires_tables=TABLES,
            overview=overview_panel,
            tag_description="Tenants' webhook endpoints, their health and recent attempts; "
            "disable, enable, recover.",
        )
    )
    register_section(
        Section(
            "messages",
            "Messages",
            50,
            nav_path="/messages",
            operations=MESSAGE_OPERATIONS,
            pages=MESSAGE_PAGES,
            requires_tables=TABLES,
            tag_description="Published messages, their deliveries, attempts and redelivery.",
        )
    )
    register_section(
        Section(
            "deliveries",
            "Delivery log",
            55,
            nav_path="/deliveries",
            pages=sending.PAGES,
            requires_tables=TABLES,
        )
    )
