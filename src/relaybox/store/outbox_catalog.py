"""The store's catalog statements: event types, tenants' API keys, the dashboard's
revoked sessions, and the portal's revoked tokens (sessions logged out of, single-use
links once opened).

:class:`CatalogStore` is a mixin of :class:`~relaybox.store.base.Store`, beside
:class:`~relaybox.store.outbox.OutboxStore`, whose primitives it uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox.store.outbox_rows import ApiKey, EventTypeRow

__all__ = ["CatalogStore"]


class CatalogStore:
    """Event types, API keys, revoked dashboard sessions and portal tokens (a base of
    :class:`Store`)."""

    if TYPE_CHECKING:

        def transaction(self) -> AbstractAsyncContextManager[AsyncConnection]: ...

        async def rows(
            self, conn: AsyncConnection, name: str, params: Sequence[Any] = ()
        ) -> list[Any]: ...

        async def first(
            self, conn: AsyncConnection, name: str, params: Sequence[Any] = ()
        ) -> Any: ...

    # -- admin sessions -----------------------------------------------------------------

    async def admin_session_revoke(
        self, session_id: str, *, expires_at: float, purge_before: float
    ) -> None:
        """Revoke a dashboard session until ``expires_at`` (idempotent), and drop the
        revocations that expired before ``purge_before``, in one transaction."""
        async with self.transaction() as conn:
            await self.rows(conn, "admin_session_revoke", (session_id, expires_at))
            await self.rows(conn, "admin_session_purge", (purge_before,))

    async def admin_session_revoked(self, session_id: str) -> bool:
        """Whether the dashboard session was revoked (one primary-key lookup)."""
        async with self.transaction() as conn:
            return await self.first(conn, "admin_session_revoked", (session_id,)) is not None

    # -- portal tokens ------------------------------------------------------------------

    async def portal_token_revoke(
        self, token_id: str, *, expires_at: float, purge_before: float
    ) -> bool:
        """Revoke a portal token until ``expires_at``: whether this call did (``False``:
        it was revoked before, e.g. a single-use link opened already). Drops a few rows
        of tokens that expired before ``purge_before`` in the same transaction."""
        async with self.transaction() as conn:
            done = await self.first(conn, "portal_token_revoke", (token_id, expires_at))
            await self.rows(conn, "portal_token_trim", (purge_before,))
        return done is not None

    async def portal_link_open(
        self,
        token_id: str,
        *,
        key_id: str | None,
        single_use: bool,
        expires_at: float,
        purge_before: float,
    ) -> Literal["ok", "used", "revoked"]:
        """Open a portal link, in one transaction: ``"revoked"`` when the API key that
        asked for it (``key_id``) is revoked; ``"used"`` when it is single-use and was
        opened before; otherwise ``"ok"`` (a single-use link is then spent)."""
        if key_id is None and not single_use:
            return "ok"  # nothing to look up: the application's own reusable link
        async with self.transaction() as conn:
            if key_id is not None:
                if await self.first(conn, "portal_key_active", (key_id,)) is None:
                    return "revoked"
            if not single_use:
                return "ok"
            spent = await self.first(conn, "portal_token_revoke", (token_id, expires_at))
            await self.rows(conn, "portal_token_trim", (purge_before,))
        return "ok" if spent is not None else "used"

    async def portal_session_live(self, token_id: str, key_id: str | None) -> bool:
        """Whether a portal session goes on: not logged out of, and its API key (if an
        API key asked for its link) not revoked. One statement per portal request."""
        async with self.transaction() as conn:
            row = await self.first(conn, "portal_session_live", (token_id, key_id))
        return bool(row[0])

    async def portal_tokens_purge(self, before: float) -> int:
        """Maintenance: drop the rows of tokens that expired before ``before``."""
        async with self.transaction() as conn:
            return len(await self.rows(conn, "portal_tokens_purge", (before,)))

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
        async with self.transaction() as conn:
            await self.rows(conn, "event_type_upsert", (name, description, schema, now, subject))

    async def event_type_list(self) -> list[EventTypeRow]:
        """The catalog, by name."""
        async with self.transaction() as conn:
            found = await self.rows(conn, "event_type_list")
        return [EventTypeRow(r[0], r[1], r[2], r[3]) for r in found]

    # -- API keys -----------------------------------------------------------------------

    async def api_key_create(
        self, key_id: str, tenant: str, name: str, key_hash: str, *, now: float
    ) -> None:
        async with self.transaction() as conn:
            await self.rows(conn, "api_key_insert", (key_id, tenant, name, key_hash, now))

    async def api_key_find(self, key_hash: str) -> str | None:
        """The tenant of the active key with this hash, or ``None``."""
        found = await self.api_key_match(key_hash)
        return None if found is None else found[1]

    async def api_key_match(self, key_hash: str) -> tuple[str, str] | None:
        """``(key id, tenant)`` of the active key with this hash, or ``None``."""
        async with self.transaction() as conn:
            row = await self.first(conn, "api_key_lookup", (key_hash,))
        return None if row is None else (str(row[0]), str(row[1]))

    async def api_key_list(self, tenant: str | None) -> list[ApiKey]:
        """Keys of ``tenant`` (``None``: every tenant), oldest first."""
        async with self.transaction() as conn:
            found = await self.rows(conn, "api_key_list", (tenant,))
        return [ApiKey(*r) for r in found]

    async def api_key_revoke(self, key_id: str, *, now: float) -> bool:
        """Revoke an active key; ``False`` when there is none with this id."""
        async with self.transaction() as conn:
            return await self.first(conn, "api_key_revoke", (key_id, now)) is not None
