"""The operator surface mounted at ``/admin``: a JSON API (``/admin/api/v1``) and a
server-rendered dashboard, both built from the registered sections
(:mod:`relaybox.admin.sections`) and both behind ``admin_token``
(:mod:`relaybox.admin.auth`).

Built-in sections: the overview and erasures here; the receiving side (inbox, dead
letters, quarantine) registers itself from :mod:`relaybox.admin.inbound`, the sending
side (endpoints, messages, operational events) from :mod:`relaybox.admin.outbound`,
shown once its tables are migrated.
"""

from __future__ import annotations

from relaybox.admin.app import build_admin, registered_sections
from relaybox.admin.sections import Call, Operation, OverviewPanel, Section, register_section

__all__ = [
    "Call",
    "Operation",
    "OverviewPanel",
    "Section",
    "build_admin",
    "register_section",
    "registered_sections",
]
