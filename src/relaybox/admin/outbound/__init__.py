"""The sending side in the admin app: endpoints with their health and recent attempts,
Disable, Enable and Recover; messages with their deliveries and attempts, and Redeliver.

Rows are read through :mod:`relaybox.outbound` (the area that owns those tables), so
the admin shows what the tenant API shows; only the health figures (success rate and
backlog per endpoint) are operator-specific queries (``ops_endpoint_*``). The section
names its tables in ``requires_tables``: on a database without them it stays hidden
and its routes answer 404 ``not_migrated``.

Layout: ``models`` (the API's pydantic models), ``service`` (reads and actions),
``api`` (the admin API's operations), ``pages`` (the dashboard's pages and forms).

The endpoint actions call what the CLI and the tenant API call
(:func:`relaybox.outbound.endpoints.disable_endpoint`, ``enable_endpoint``,
:func:`relaybox.outbound.deliveries.recover`). Who acted and why go into the log
(``endpoint_action``) and, for a disable, into the endpoint's ``disabled_reason``
(``manual by dashboard: …``), which the endpoint's pages, ``relaybox endpoints list``
and the ``relaybox.endpoint.disabled`` operational event show.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from relaybox.admin.outbound import sending
from relaybox.admin.outbound.api import ENDPOINT_OPERATIONS, MESSAGE_OPERATIONS, OPERATIONS
from relaybox.admin.outbound.flow import FLOW_OPERATIONS, FLOW_PAGES
from relaybox.admin.outbound.ordered import ORDERED_OPERATIONS
from relaybox.admin.outbound.pages import ENDPOINT_PAGES, MESSAGE_PAGES, PAGES
from relaybox.admin.sections import OverviewPanel, Section, register_section
from relaybox.ops.outbound import endpoint_list
from relaybox.ops.outbound_models import (
    EndpointActionRequest,
    EndpointActionResult,
    EndpointDetail,
    EndpointFilter,
    EndpointList,
    EndpointSummary,
    EventTypeList,
    MessageDetail,
    MessagePage,
    MessageSummary,
    RecoverRequest,
    RecoverResult,
    RedeliverResult,
)

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = [
    "ENDPOINT_OPERATIONS",
    "ENDPOINT_PAGES",
    "FLOW_OPERATIONS",
    "FLOW_PAGES",
    "MESSAGE_OPERATIONS",
    "MESSAGE_PAGES",
    "OPERATIONS",
    "PAGES",
    "EndpointActionRequest",
    "EndpointActionResult",
    "EndpointDetail",
    "EndpointList",
    "EndpointSummary",
    "EventTypeList",
    "MessageDetail",
    "MessagePage",
    "MessageSummary",
    "RecoverRequest",
    "RecoverResult",
    "RedeliverResult",
    "register",
]


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
