"""Tenant API keys for ``/api/v1``: ``rbk_`` + 256 random bits, shown once, stored as
SHA-256. A key is high-entropy, so a plain hash is enough (no password KDF) and the
lookup is one indexed equality."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from relaybox.store.outbox_rows import new_id

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = ["authenticate", "authenticate_key", "create_api_key", "list_api_keys", "revoke_api_key"]

PREFIX = "rbk_"


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


async def create_api_key(box: Runtime, tenant: str, name: str = "") -> tuple[str, str]:
    """A new key for ``tenant``: returns ``(key id, key)``. The key is not stored."""
    if not tenant:
        raise ValueError("an API key needs a tenant")
    now = box.clock.now()
    key_id = new_id("key", now)
    key = PREFIX + secrets.token_urlsafe(32)
    await box.store.catalog.api_key_create(key_id, tenant, name, _hash(key), now=now)
    return key_id, key


async def authenticate(box: Runtime, key: str) -> str | None:
    """The tenant of an active key, or ``None``."""
    found = await authenticate_key(box, key)
    return None if found is None else found[1]


async def authenticate_key(box: Runtime, key: str) -> tuple[str, str] | None:
    """``(key id, tenant)`` of an active key, or ``None``."""
    if not key.startswith(PREFIX):
        return None
    return await box.store.catalog.api_key_match(_hash(key))


async def list_api_keys(box: Runtime, tenant: str | None) -> list[dict[str, Any]]:
    return [asdict(k) for k in await box.store.catalog.api_key_list(tenant)]


async def revoke_api_key(box: Runtime, key_id: str) -> bool:
    """Revoke a key: the API refuses it at once, and the portal sessions opened by links
    it asked for end (each portal request checks the key)."""
    return await box.store.catalog.api_key_revoke(key_id, now=box.clock.now())
