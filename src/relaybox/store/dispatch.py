"""The store's statements of the dispatcher: leases, their release, and recording
finished attempts (their outcomes, the attempt log, the endpoints' failure streaks).

:class:`DispatchStore` is an area of :class:`~relaybox.store.base.Store`, beside
:class:`~relaybox.store.outbox.OutboxStore`, whose primitives it uses. What these
statements take and return is in :mod:`relaybox.store.dispatch_rows`; an attempt
reaches them as one :class:`~relaybox.store.dispatch_rows.Attempt` and becomes their
parameters through :func:`~relaybox.store.dispatch_rows.attempt_columns` alone.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, ClassVar

from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox.store.backend import Backend
from relaybox.store.dispatch_rows import (
    Attempt,
    Leased,
    LeaseRequest,
    attempt_columns,
    attempt_log,
)
from relaybox.store.outbox import OutboxStore
from relaybox.store.outbox_rows import (
    Delivery,
    FailureStreak,
    MessageBody,
    SecretOpener,
    Target,
)

__all__ = ["DispatchStore", "SecretOpener", "leased_delivery"]


class DispatchStore:
    """The dispatcher's statements (``store.dispatch``).

    ``lease_records``: :meth:`outbox_lease` records a :class:`LeaseRequest`'s plain
    successes and may lease ahead, in the one statement of the lease (PostgreSQL). A
    store without it leases in a transaction of a few statements and takes no
    ``sent``; the dispatcher records through :meth:`outbox_record` there.
    """

    lease_records: ClassVar[bool] = False

    def __init__(self, db: Backend, outbox: OutboxStore) -> None:
        self.db = db
        self.outbox = outbox

    # -- leases -------------------------------------------------------------------------

    async def outbox_lease(self, request: LeaseRequest, open_secrets: SecretOpener) -> Leased:
        """Lease up to ``request.slots`` due rows lane by lane (see
        :mod:`relaybox.outbound.leases`) with what the channels need (message bodies,
        endpoints with their secrets opened by ``open_secrets``), the deliveries in id
        order. Each backend leases its own way: PostgreSQL in one statement, SQLite in
        one transaction of a few."""
        raise NotImplementedError(f"{type(self).__name__} leases no rows")

    async def outbox_release(self, deliveries: Sequence[Delivery]) -> None:
        """Give back leases never started: the rows are due again at once, as if never
        leased."""
        params = (
            self.db.array([d.id for d in deliveries]),
            self.db.array([d.lease_token for d in deliveries]),
            self.db.array([d.uncertain for d in deliveries]),
        )
        async with self.db.transaction() as conn:
            await self.db.rows(conn, "outbox_release", params)

    async def outbox_next_due(self, *, channels: Sequence[str], now: float) -> float | None:
        """When the next pending row of ``channels`` comes due after ``now`` (``None``:
        no such row): a dispatcher wakes then rather than at its next poll."""
        async with self.db.transaction() as conn:
            row = await self.db.first(conn, "outbox_next_due", (now, self.db.array(channels)))
        return None if row is None or row[0] is None else float(row[0])

    # -- recording ----------------------------------------------------------------------

    async def outbox_record(
        self, conn: AsyncConnection, attempts: Sequence[Attempt], *, now: float
    ) -> set[tuple[int, int]]:
        """Record finished attempts in ``conn``'s transaction: each row's outcome,
        fenced by its lease token, then the attempt log (:func:`attempt_log`: an
        attempt whose outcome was not written is logged ``fenced``). Returns the
        (id, lease token) pairs written."""
        cols = attempt_columns(attempts)
        array = self.db.array
        params = (
            now,
            array(cols.id),
            array(cols.lease_token),
            array(cols.status),
            array(cols.next_at),
            array(cols.reason),
            array(cols.error),
            array(cols.status_code),
        )
        written = {(r[0], r[1]) for r in await self.db.rows(conn, "outbox_record", params)}
        log = attempt_log(attempts, written, now)
        if log:
            await self.outbox_attempts_insert(conn, log)
        return written

    async def outbox_attempts_insert(
        self, conn: AsyncConnection, attempts: Sequence[Attempt]
    ) -> None:
        """Append ``attempts`` to the attempt log as they are (their decisions' labels
        the outcomes), in ``conn``'s transaction."""
        cols = attempt_columns(attempts)
        array = self.db.array
        params = (
            array(cols.id),
            array(cols.attempt),
            array(cols.lease_token),
            array(cols.dispatcher),
            array(cols.started),
            array(cols.duration),
            array(cols.outcome),
            array(cols.status_code),
            array(cols.error),
            array(cols.response),
            array(cols.headers),
        )
        await self.db.rows(conn, "outbox_attempts_insert", params)

    async def endpoints_succeeded(
        self, conn: AsyncConnection, endpoint_ids: Sequence[str], *, now: float | None = None
    ) -> None:
        """End the endpoints' failure streaks, in ``conn``'s transaction, and note
        ``now`` as their last success (silence detection) where the one noted is over
        a minute old."""
        await self.db.rows(conn, "endpoints_succeeded", (self.db.array(endpoint_ids), now))

    async def endpoint_succeeded(
        self, conn: AsyncConnection, endpoint_id: str, *, now: float | None = None
    ) -> None:
        """End the endpoint's failure streak, in ``conn``'s transaction (``now``: as
        :meth:`endpoints_succeeded`)."""
        await self.db.rows(conn, "endpoint_succeeded", (endpoint_id, now))

    async def endpoint_failed(
        self, conn: AsyncConnection, endpoint_id: str, *, now: float
    ) -> FailureStreak | None:
        """Start the endpoint's failure streak at ``now`` unless one runs; ``None``
        when the endpoint is gone."""
        row = await self.db.first(conn, "endpoint_failed", (endpoint_id, now))
        return None if row is None else FailureStreak(row[0], row[1], row[2], row[3])


def leased_delivery(
    r: Any, deadline: float, message: MessageBody | None, endpoint: Target | None
) -> Delivery:
    """A leased row (read by column name) as the channels take it. Positional and
    without parsing a webhook row's payload (``null``: the body is the message's):
    this runs for every delivery."""
    payload = r["payload"]
    return Delivery(
        r["id"],
        r["channel"],
        r["key"],
        None if payload == "null" else json.loads(payload),
        r["tenant"],
        r["attempts"],
        r["lease_token"],
        bool(r["uncertain"]),
        deadline,
        message,
        endpoint,
        r["lane"] or r["channel"],
    )
