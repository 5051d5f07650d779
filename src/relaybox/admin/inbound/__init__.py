"""The receiving side in the admin app: the inbox, dead letters and quarantine, each a
section (:mod:`relaybox.admin.sections`) with its admin API operations (:mod:`.api`)
and its dashboard pages (:mod:`.pages`), as :mod:`relaybox.admin.outbound` is for the
sending side."""

from __future__ import annotations

from relaybox.admin.inbound.section import register

__all__ = ["register"]
