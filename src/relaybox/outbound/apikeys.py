"""Tenant API keys for ``/api/v1``: ``rbk_`` + 256 random bits, shown once, stored as
SHA-256. A key is high-entropy, so a plain hash is enough (no password KDF) and the
lookup is one indexed equality."""

from __future__ import annotations

import hashlib
import secrets
from typing import TYPE_CHECKING, Any

from relaybox.outbound import db

if TYPE_CHECKING:
    from relaybox.app import Relaybox

__all__ = ["authenticate", "create_api_key", "list_api_keys", "revoke_api_key"]

PREFIX = "rbk_"


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


async def create_api_key(box: Relaybox, tenant: str, name: str = "") -> tuple[str, str]:
    """A new key for ``tenant``: returns ``(key id, key)``. The key is not stored."""
    if not tenant:
        raise ValueError("an API key needs a tenant")
    store, now = box.store, box.clock.now()
    key_id = db.new_id("key", now)
    key = PREFIX + secrets.token_urlsafe(32)
    async with store.transaction() as conn:
        await db.execute(conn, store, "api_key_insert", key_id, tenant, name, _hash(key), now)
    return key_id, key


async def authenticate(box: Relaybox, key: str) -> str | None:
    """The tenant of an active key, or ``None``."""
    if not key.startswith(PREFIX):
        return None
    store = box.store
    async with store.transaction() as conn:
        row = await db.first(conn, store, "api_key_lookup", _hash(key))
    return row["tenant"] if row else None


async def list_api_keys(box: Relaybox, tenant: str | None) -> list[dict[str, Any]]:
    store = box.store
    async with store.transaction() as conn:
        return [dict(r) for r in await db.rows(conn, store, "api_key_list", tenant)]


async def revoke_api_key(box: Relaybox, key_id: str) -> bool:
    store = box.store
    async with store.transaction() as conn:
        row = await db.first(conn, store, "api_key_revoke", key_id, box.clock.now())
    return row is not None
