"""relaybox: reliable webhooks in both directions, inside your application's database."""

from relaybox import sources
from relaybox.app import Relaybox
from relaybox.clock import Clock, FrozenClock, SystemClock
from relaybox.embed import document_webhooks, get_box
from relaybox.errors import (
    BadSignature,
    ConfigurationError,
    OperationConflict,
    PermanentError,
    RejectedDelivery,
    RelayboxError,
    StoreUnavailable,
)
from relaybox.inbound.worker import Context, Worker
from relaybox.retry import Backoff
from relaybox.sources.base import Secret
from relaybox.sync import SyncContext

__all__ = [
    "Backoff",
    "BadSignature",
    "Clock",
    "ConfigurationError",
    "Context",
    "FrozenClock",
    "OperationConflict",
    "PermanentError",
    "RejectedDelivery",
    "Relaybox",
    "RelayboxError",
    "Secret",
    "StoreUnavailable",
    "SyncContext",
    "SystemClock",
    "Worker",
    "document_webhooks",
    "get_box",
    "sources",
]

__version__ = "0.1.0.dev0"
