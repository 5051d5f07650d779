"""The store's catalog statements: event types and tenants' API keys. The sessions of
the dashboard and the portal are :class:`~relaybox.store.sessions.SessionStore`'s.

:class:`CatalogStore` is an area of :class:`~relaybox.store.base.Store`, beside
:class:`~relaybox.store.outbox.OutboxStore`, whose primitives it uses.
"""

from __future__ import annotations

from relaybox.store.backend import Backend
from relaybox.store.outbox_rows import ApiKey, EventTypeRow

__all__ = ["CatalogStore"]


class CatalogStore:
    """Event types and API keys (``store.catalog``)."""

    def __init__(self, db: Backend) -> None:
        self.db = db

    # -- event types --------------------------------------------------------------------

    async def event_type_upsert(
        self,
        name: str,
        description: str,
        schema: str | None,
        *,
        now: float,
        subject: str | None = None,
    ) -> None:
        """Add or replace a catalog entry (``schema``: JSON text or ``None``;
        ``subject``: the subject path of its messages, or ``None``)."""
        async with self.db.transaction() as conn:
            await self.db.rows(conn, "event_type_upsert", (name, description, schema, now, subject))

    async def event_type_list(self) -> list[EventTypeRow]:
        """The catalog, by name."""
        async with self.db.transaction() as conn:
            found = await self.db.rows(conn, "event_type_list")
        return [EventTypeRow(r[0], r[1], r[2], r[3]) for r in found]

    # -- API keys -----------------------------------------------------------------------

    async def api_key_create(
        self, key_id: str, tenant: str, name: str, key_hash: str, *, now: float
    ) -> None:
        async with self.db.transaction() as conn:
            await self.db.rows(conn, "api_key_insert", (key_id, tenant, name, key_hash, now))

    async def api_key_find(self, key_hash: str) -> str | None:
        """The tenant of the active key with this hash, or ``None``."""
        found = await self.api_key_match(key_hash)
        return None if found is None else found[1]

    async def api_key_match(self, key_hash: str) -> tuple[str, str] | None:
        """``(key id, tenant)`` of the active key with this hash, or ``None``."""
        async with self.db.transaction() as conn:
            row = await self.db.first(conn, "api_key_lookup", (key_hash,))
        return None if row is None else (str(row[0]), str(row[1]))

    async def api_key_list(self, tenant: str | None) -> list[ApiKey]:
        """Keys of ``tenant`` (``None``: every tenant), oldest first."""
        async with self.db.transaction() as conn:
            found = await self.db.rows(conn, "api_key_list", (tenant,))
        return [ApiKey(*r) for r in found]

    async def api_key_revoke(self, key_id: str, *, now: float) -> bool:
        """Revoke an active key; ``False`` when there is none with this id."""
        async with self.db.transaction() as conn:
            return await self.db.first(conn, "api_key_revoke", (key_id, now)) is not None
