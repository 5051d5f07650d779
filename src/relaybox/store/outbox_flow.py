"""The store's statements of an endpoint's flow: pause and resume, and replay missing.

:class:`FlowStore` is a mixin of :class:`~relaybox.store.base.Store`, beside
:class:`~relaybox.store.outbox.OutboxStore`, whose primitives it uses. A paused
endpoint's lane is skipped by the lease (``outbox_lease``), so its deliveries wait,
pending, and go out oldest first once it is resumed. Replay missing gives an endpoint
one delivery for each message it never had one for: the delivery key (message id and
endpoint id, UNIQUE in ``relaybox_outbox``) makes a second replay, or two at once,
insert nothing twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncConnection

__all__ = ["FlowStore", "MissingMessage"]


@dataclass(frozen=True, slots=True)
class MissingMessage:
    """A message an endpoint has no delivery of (``body``: the envelope's JSON text)."""

    id: str
    event_type: str
    body: str
    created_at: float


class FlowStore:
    """Pause, resume and replay-missing statements (a base of :class:`Store`)."""

    if TYPE_CHECKING:

        def transaction(self) -> AbstractAsyncContextManager[AsyncConnection]: ...

        async def rows(
            self, conn: AsyncConnection, name: str, params: Sequence[Any] = ()
        ) -> list[Any]: ...

        async def first(
            self, conn: AsyncConnection, name: str, params: Sequence[Any] = ()
        ) -> Any: ...

        def _array(self, values: Sequence[Any]) -> Any: ...

        async def notify(self, conn: AsyncConnection, channel: str) -> None: ...

    async def endpoint_pause(
        self, endpoint_id: str, tenant: str | None, *, paused: bool, now: float
    ) -> bool:
        """Pause (``paused``) or resume the endpoint (``tenant`` ``None``: of any
        tenant). ``True`` when this call changed it; a resume wakes the dispatchers."""
        params = (endpoint_id, tenant, now if paused else None, now)
        async with self.transaction() as conn:
            changed = await self.first(conn, "endpoint_pause", params) is not None
            if changed and not paused:
                await self.notify(conn, "outbox")
        return changed

    async def endpoint_paused_backlog(self) -> dict[str, int]:
        """Per paused endpoint id, how many of its deliveries wait (pending)."""
        async with self.transaction() as conn:
            found = await self.rows(conn, "endpoint_paused_backlog")
        return {r[0]: int(r[1]) for r in found}

    async def message_missing_page(
        self,
        conn: AsyncConnection,
        tenant: str,
        endpoint_id: str,
        *,
        since: float,
        after: tuple[float, str] | None,
        limit: int,
    ) -> list[MissingMessage]:
        """Up to ``limit`` of the tenant's messages published at or after ``since``
        (and after the ``(created_at, id)`` keyset ``after``), oldest first, with their
        body still there and no delivery to the endpoint, in ``conn``'s transaction."""
        after_time, after_id = after if after else (None, None)
        params = (tenant, endpoint_id, since, after_time, after_id, limit)
        found = await self.rows(conn, "message_missing_page", params)
        return [MissingMessage(r[0], r[1], r[2], r[3]) for r in found]

    async def delivery_insert_missing(
        self,
        conn: AsyncConnection,
        endpoint_id: str,
        tenant: str,
        message_ids: Sequence[str],
        *,
        now: float,
    ) -> int:
        """One pending delivery to the endpoint per message, in the given order, for
        those that have none yet (and whose body retention has not emptied), in
        ``conn``'s transaction; returns how many were inserted. A wake for the
        dispatchers goes with the COMMIT."""
        if not message_ids:
            return 0
        params = (endpoint_id, tenant, now, self._array(list(message_ids)))
        found = await self.rows(conn, "delivery_insert_missing", params)
        if found:
            await self.notify(conn, "outbox")
        return len(found)
