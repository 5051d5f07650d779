"""Storage backends behind one interface: SQLite (default) and PostgreSQL."""

from __future__ import annotations

from relaybox.store.base import Store
from relaybox.store.inbox_rows import (
    AcceptOutcome,
    Claim,
    InboxEvent,
    NewDelivery,
    OutboxRow,
    Stats,
)
from relaybox.store.opening import check_database_url, open_store

__all__ = [
    "AcceptOutcome",
    "Claim",
    "InboxEvent",
    "NewDelivery",
    "OutboxRow",
    "Stats",
    "Store",
    "check_database_url",
    "open_store",
]
