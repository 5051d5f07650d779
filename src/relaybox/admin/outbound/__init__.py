"""The sending side in the admin app: endpoints with their health and recent attempts,
Disable, Enable and Recover; messages with their deliveries and attempts, and Redeliver.

Rows are read through :mod:`relaybox.outbound` (the area that owns those tables), so
the admin shows what the tenant API shows; only the health figures (success rate and
backlog per endpoint) are operator-specific queries (``ops_endpoint_*``). The section
names its tables in ``requires_tables``: on a database without them it stays hidden
and its routes answer 404 ``not_migrated``.

Layout: ``api`` (the admin API's operations), ``pages``, ``sending``, ``flow`` and
``ordered`` (the dashboard's pages and forms), ``section`` (the sections, registered by
:func:`register`); the models are :mod:`relaybox.ops.outbound_models`.

The endpoint actions call what the CLI and the tenant API call
(:func:`relaybox.outbound.endpoints.disable_endpoint`, ``enable_endpoint``,
:func:`relaybox.outbound.deliveries.recover`). Who acted and why go into the log
(``endpoint_action``) and, for a disable, into the endpoint's ``disabled_reason``
(``manual by dashboard: …``), which the endpoint's pages, ``relaybox endpoints list``
and the ``relaybox.endpoint.disabled`` operational event show.
"""

from __future__ import annotations

from relaybox.admin.outbound.api import ENDPOINT_OPERATIONS, MESSAGE_OPERATIONS, OPERATIONS
from relaybox.admin.outbound.flow import FLOW_OPERATIONS, FLOW_PAGES
from relaybox.admin.outbound.pages import ENDPOINT_PAGES, MESSAGE_PAGES, PAGES
from relaybox.admin.outbound.section import register
from relaybox.ops.outbound_models import (
    EndpointActionRequest,
    EndpointActionResult,
    EndpointDetail,
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
