"""The tenant portal: server-rendered pages where one tenant of the application
manages its endpoints, reads its signing secret, browses the event types, and
follows its deliveries (request and response of every attempt, resend, test events).

The application makes a short-lived signed link for the tenant
(``box.portal_link(tenant)`` or ``POST /api/v1/portal/sessions``) and hands it to the
tenant's browser, or puts it in an iframe of its own pages
(``portal.frame_ancestors``). It is served with the ``api`` role at ``/portal``.
Every page has a logout button, which ends the session for every process; a session
also ends when the API key that asked for its link is revoked, and a link may be
single-use.
"""

from __future__ import annotations

from relaybox.outbound.portal_links import (
    PortalLink,
    PortalSession,
    TokenRefused,
    check_session,
    end_session,
    open_link,
    portal_link,
    read_session,
)
from relaybox.portal.app import build_portal

__all__ = [
    "PortalLink",
    "PortalSession",
    "TokenRefused",
    "build_portal",
    "check_session",
    "end_session",
    "open_link",
    "portal_link",
    "read_session",
]
