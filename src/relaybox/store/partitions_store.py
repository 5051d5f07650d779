"""The store's time partitions of the history tables (``store.partitions``): what
:mod:`relaybox.store.partitions` does, as an area of :class:`~relaybox.store.base.Store`.
Only PostgreSQL partitions (:class:`~relaybox.store.postgres.PostgresPartitions`);
here, on SQLite, no table is partitioned and maintenance has nothing to do."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from relaybox.store import partitions
from relaybox.store.backend import Backend
from relaybox.store.keys_store import KeysStore

__all__ = ["PartitionsStore"]


class PartitionsStore:
    """Time partitions (``store.partitions``)."""

    def __init__(self, db: Backend, keys: KeysStore) -> None:
        self.db = db
        self.keys = keys

    async def tables(self) -> set[str]:
        """The history tables partitioned by time (none on SQLite)."""
        return set()

    async def convert(
        self, period: str, *, before_switch: Callable[[str, str], Any] | None = None
    ) -> list[str]:
        """Partition the history tables by ``period`` (``day``, ``week``): PostgreSQL
        only (:func:`relaybox.store.partitions.convert`)."""
        raise NotImplementedError("time partitions need PostgreSQL")

    async def maintain(
        self,
        period: str,
        *,
        ahead: int = 3,
        drop: partitions.Drop | None = None,
        before_drop: Callable[[str, str], Any] | None = None,
    ) -> partitions.MaintainResult:
        """Partitions made ahead and old ones dropped (PostgreSQL; nothing here)."""
        return partitions.MaintainResult()
