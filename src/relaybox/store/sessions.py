"""The store's session statements: the dashboard's revoked sessions (logouts, for
every process) and the portal's revoked tokens (sessions logged out of, single-use
links once opened, links of a revoked API key).

:class:`SessionStore` is an area of :class:`~relaybox.store.base.Store`.
"""

from __future__ import annotations

from typing import Literal

from relaybox.store.backend import Backend

__all__ = ["SessionStore"]


class SessionStore:
    """Revoked dashboard sessions and portal tokens (``store.sessions``)."""

    def __init__(self, db: Backend) -> None:
        self.db = db

    # -- admin sessions -----------------------------------------------------------------

    async def admin_session_revoke(
        self, session_id: str, *, expires_at: float, purge_before: float
    ) -> None:
        """Revoke a dashboard session until ``expires_at`` (idempotent), and drop the
        revocations that expired before ``purge_before``, in one transaction."""
        async with self.db.transaction() as conn:
            await self.db.rows(conn, "admin_session_revoke", (session_id, expires_at))
            await self.db.rows(conn, "admin_session_purge", (purge_before,))

    async def admin_session_revoked(self, session_id: str) -> bool:
        """Whether the dashboard session was revoked (one primary-key lookup)."""
        async with self.db.transaction() as conn:
            return await self.db.first(conn, "admin_session_revoked", (session_id,)) is not None

    # -- portal tokens ------------------------------------------------------------------

    async def portal_token_revoke(
        self, token_id: str, *, expires_at: float, purge_before: float
    ) -> bool:
        """Revoke a portal token until ``expires_at``: whether this call did (``False``:
        it was revoked before, e.g. a single-use link opened already). Drops a few rows
        of tokens that expired before ``purge_before`` in the same transaction."""
        async with self.db.transaction() as conn:
            done = await self.db.first(conn, "portal_token_revoke", (token_id, expires_at))
            await self.db.rows(conn, "portal_token_trim", (purge_before,))
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
        async with self.db.transaction() as conn:
            if key_id is not None:
                if await self.db.first(conn, "portal_key_active", (key_id,)) is None:
                    return "revoked"
            if not single_use:
                return "ok"
            spent = await self.db.first(conn, "portal_token_revoke", (token_id, expires_at))
            await self.db.rows(conn, "portal_token_trim", (purge_before,))
        return "ok" if spent is not None else "used"

    async def portal_session_live(self, token_id: str, key_id: str | None) -> bool:
        """Whether a portal session goes on: not logged out of, and its API key (if an
        API key asked for its link) not revoked. One statement per portal request."""
        async with self.db.transaction() as conn:
            row = await self.db.first(conn, "portal_session_live", (token_id, key_id))
        return bool(row[0])

    async def portal_tokens_purge(self, before: float) -> int:
        """Maintenance: drop the rows of tokens that expired before ``before``."""
        async with self.db.transaction() as conn:
            return len(await self.db.rows(conn, "portal_tokens_purge", (before,)))
