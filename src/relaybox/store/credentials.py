"""The store's statements for endpoint headers and credentials, and for the failure
thresholds behind the operational events (``relaybox.endpoint.failing`` /
``relaybox.endpoint.recovered``).

:class:`CredentialsStore` is an area of :class:`~relaybox.store.base.Store`; its
statements are in ``sql/<backend>_credentials.sql``. Every method runs in the
caller's transaction (``conn``).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox.store.backend import Backend

__all__ = ["KEEP", "CredentialsStore", "EndpointRecovered", "Keep"]


class Keep(enum.Enum):
    """A value an update leaves as it is."""

    KEEP = "keep"


KEEP = Keep.KEEP


@dataclass(frozen=True, slots=True)
class EndpointRecovered:
    """An endpoint announced failing whose delivery succeeded."""

    id: str
    tenant: str
    url: str


class CredentialsStore:
    """Endpoint headers, credentials and failure thresholds (``store.credentials``)."""

    def __init__(self, db: Backend) -> None:
        self.db = db

    async def endpoint_extras_write(
        self,
        conn: AsyncConnection,
        endpoint_id: str,
        *,
        headers: str | Keep | None = KEEP,
        credentials: tuple[str, str] | Keep | None = KEEP,
    ) -> None:
        """Set the endpoint's headers (a JSON object as text; ``None``: none) and its
        credentials ((kind, sealed JSON); ``None``: none); :data:`KEEP` leaves one."""
        if headers is not KEEP:
            await self.db.rows(conn, "endpoint_headers_set", (endpoint_id, headers))
        if credentials is not KEEP:
            kind, sealed = credentials if credentials is not None else (None, None)
            await self.db.rows(conn, "endpoint_credentials_set", (endpoint_id, kind, sealed))

    async def endpoint_failing_level(
        self, conn: AsyncConnection, endpoint_id: str, level: int
    ) -> tuple[str, str, float | None] | None:
        """Raise the failure threshold announced for the endpoint to ``level``; its
        (tenant, url, failing since) when this call raised it, ``None`` when it was
        there already (another batch announced it)."""
        row = await self.db.first(conn, "endpoint_failing_level", (endpoint_id, level))
        return None if row is None else (row[1], row[2], row[3])

    async def endpoints_recovered(
        self, conn: AsyncConnection, endpoint_ids: Sequence[str]
    ) -> list[EndpointRecovered]:
        """End the failure runs of endpoints that succeeded; those that were announced
        failing come back (each once: their threshold goes back to 0)."""
        found = await self.db.rows(
            conn, "endpoints_recovered", (self.db.array(list(endpoint_ids)),)
        )
        return [EndpointRecovered(r[0], r[1], r[2]) for r in found]

    async def endpoint_credentials_page(
        self, conn: AsyncConnection, after: str, limit: int
    ) -> list[tuple[str, str]]:
        """Up to ``limit`` stored credentials of endpoints after id ``after``, in id
        order, as (endpoint id, sealed value)."""
        return [
            (r[0], r[1])
            for r in await self.db.rows(conn, "endpoint_credentials_page", (after, limit))
        ]

    async def endpoint_credentials_swap(
        self, conn: AsyncConnection, endpoint_id: str, old: str, new: str
    ) -> bool:
        """Compare-and-set: the stored credentials become ``new`` only while ``old``."""
        found = await self.db.first(conn, "endpoint_credentials_swap", (endpoint_id, old, new))
        return found is not None
