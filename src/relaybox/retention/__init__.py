"""Retention: payloads purged at their age (per tenant and per source:
:mod:`relaybox.retention.policy`), and the maintenance job that runs it
(:mod:`relaybox.retention.purge`)."""

from relaybox.retention import policy
from relaybox.retention.purge import (
    Maintenance,
    PurgeResult,
    backfill_keys,
    count_candidates,
    cutoffs,
    maintain_partitions,
    maintenance_lock,
    purge,
)

__all__ = [
    "Maintenance",
    "PurgeResult",
    "backfill_keys",
    "count_candidates",
    "cutoffs",
    "maintain_partitions",
    "maintenance_lock",
    "policy",
    "purge",
]
