"""The store's sending side: messages, deliveries, attempts, event types, API keys.

:class:`OutboxStore` is an area of :class:`~relaybox.store.base.Store`. Its methods
run the named queries of ``sql/<backend>_outbound.sql`` through the store's
primitives (:meth:`Backend.rows`, :meth:`Backend.first`): on PostgreSQL these run on the
asyncpg connection beneath the caller's ``AsyncConnection``, in its transaction, with
asyncpg's prepared-statement cache, so that :meth:`publish`'s statements cost no more
than a driver call each and no extra round trip. Methods taking ``conn`` run in the
caller's transaction; the others open their own. Lists travel as the backend takes
them (arrays on PostgreSQL, JSON text on SQLite: :meth:`Backend.array`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox.store import statements as st
from relaybox.store.backend import Backend
from relaybox.store.credentials import KEEP, CredentialsStore, Keep
from relaybox.store.outbox_rows import (
    AttemptRow,
    BlockedKey,
    DeliveryRow,
    Endpoint,
    EndpointAttempt,
    EndpointBacklog,
    EndpointHealth,
    EndpointQuotaReached,
    EndpointStatusChange,
    EndpointWrite,
    Message,
    NewMessage,
    PublishContext,
    StoredSecret,
    filter_text,
)

__all__ = [
    "OutboxStore",
]


class OutboxStore:
    """The sending side's statements (``store.outbox``).

    The dispatcher's statements (leases, recording attempts) are
    :class:`~relaybox.store.dispatch.DispatchStore`'s.
    """

    def __init__(self, db: Backend, credentials: CredentialsStore) -> None:
        self.db = db
        self.credentials = credentials

    # -- endpoints ----------------------------------------------------------------------

    def _endpoint_params(self, e: EndpointWrite, now: float) -> tuple[Any, ...]:
        schedule = None if e.schedule is None else json.dumps(list(e.schedule))
        payload_filter = None if e.payload_filter is None else filter_text(e.payload_filter)
        return (
            e.id,
            e.tenant,
            e.url,
            e.description,
            json.dumps(list(e.event_types)),
            e.signature,
            e.timeout,
            schedule,
            now,
            payload_filter,
            self.db.flag(e.ordered),
            e.on_dead,
            self.db.flag(e.trace_context),
        )

    async def endpoint_create(
        self,
        endpoint: EndpointWrite,
        sealed_secret: str,
        *,
        quota: int,
        now: float,
        headers: str | None = None,
        credentials: tuple[str, str] | None = None,
        filters_check: Callable[[list[str]], None] | None = None,
    ) -> Endpoint:
        """Create an enabled endpoint, its lane and its first (sealed) secret, with its
        headers and credentials
        (:meth:`~relaybox.store.credentials.CredentialsStore.endpoint_extras_write`).
        Creates of one tenant
        run one at a time, so the quota holds: raises :class:`EndpointQuotaReached`
        when the tenant has ``quota`` endpoints. ``filters_check`` as in
        :meth:`endpoint_update`."""
        async with self.db.transaction() as conn:
            await self.db.first(conn, "endpoint_quota_lock", (endpoint.tenant,))
            count = await self.db.first(conn, "endpoint_count", (endpoint.tenant,))
            if count[0] >= quota:
                raise EndpointQuotaReached(int(count[0]))
            if filters_check is not None:
                await self._check_filters(conn, endpoint, filters_check)
            await self.db.rows(conn, "endpoint_insert", self._endpoint_params(endpoint, now))
            await self.lane_upsert(conn, endpoint.id, endpoint.max_in_flight, endpoint.rate_limit)
            await self.db.rows(conn, "endpoint_secret_insert", (endpoint.id, sealed_secret, now))
            if headers is not None or credentials is not None:
                await self.credentials.endpoint_extras_write(
                    conn, endpoint.id, headers=headers, credentials=credentials
                )
            row = await self.db.first(conn, "endpoint_get", (endpoint.id, endpoint.tenant))
        return Endpoint.from_row(row)

    async def endpoint_get(self, endpoint_id: str, tenant: str | None) -> Endpoint | None:
        """One endpoint with its lane settings (``tenant`` ``None``: of any tenant)."""
        async with self.db.transaction() as conn:
            row = await self.db.first(conn, "endpoint_get", (endpoint_id, tenant))
        return None if row is None else Endpoint.from_row(row)

    async def endpoint_list(self, tenant: str | None, *, limit: int) -> list[Endpoint]:
        """Endpoints of ``tenant`` (``None``: every tenant), oldest first."""
        async with self.db.transaction() as conn:
            found = await self.db.rows(conn, "endpoint_list", (tenant, limit))
        return [Endpoint.from_row(r) for r in found]

    async def endpoint_update(
        self,
        endpoint: EndpointWrite,
        *,
        now: float,
        headers: str | Keep | None = KEEP,
        credentials: tuple[str, str] | Keep | None = KEEP,
        filters_check: Callable[[list[str]], None] | None = None,
    ) -> None:
        """Write every mutable field and the lane settings of the tenant's endpoint, and
        its headers and credentials unless :data:`KEEP`
        (:meth:`~relaybox.store.credentials.CredentialsStore.endpoint_extras_write`).
        ``filters_check``, given when the endpoint's payload filter changes, is called
        first with the payload filters (JSON text) of the tenant's other endpoints,
        under the tenant's lock (one create or filter change per tenant at a time, as
        the quota): it raises to refuse the write."""
        async with self.db.transaction() as conn:
            if filters_check is not None:
                await self.db.first(conn, "endpoint_quota_lock", (endpoint.tenant,))
                await self._check_filters(conn, endpoint, filters_check)
            await self.db.rows(conn, "endpoint_update", self._endpoint_params(endpoint, now))
            await self.lane_upsert(conn, endpoint.id, endpoint.max_in_flight, endpoint.rate_limit)
            await self.credentials.endpoint_extras_write(
                conn, endpoint.id, headers=headers, credentials=credentials
            )
            if not endpoint.ordered:  # nothing of it waits for its key any more
                await self.db.rows(conn, "ordering_clear", (endpoint.id,))

    async def _check_filters(
        self,
        conn: AsyncConnection,
        endpoint: EndpointWrite,
        filters_check: Callable[[list[str]], None],
    ) -> None:
        found = await self.db.rows(conn, "endpoint_filters", (endpoint.tenant, endpoint.id))
        filters_check([str(r[0]) for r in found])

    async def endpoint_delete(
        self, endpoint_id: str, tenant: str, *, reason: str, now: float
    ) -> bool:
        """Delete the tenant's endpoint, its secrets and lane; its waiting deliveries
        become dead letters (``reason``). ``False``: no such endpoint."""
        async with self.db.transaction() as conn:
            if await self.db.first(conn, "endpoint_delete", (endpoint_id, tenant)) is None:
                return False
            await self.db.rows(conn, "lane_delete", (endpoint_id,))
            await self.delivery_kill_endpoint(conn, endpoint_id, reason, now=now)
        return True

    async def endpoint_set_status(
        self,
        conn: AsyncConnection,
        endpoint_id: str,
        status: str,
        *,
        reason: str | None,
        now: float,
    ) -> EndpointStatusChange | None:
        """Switch the endpoint to ``status`` (``enabled`` clears its failure streak) in
        ``conn``'s transaction; ``None`` when it has that status already (or is gone)."""
        row = await self.db.first(conn, "endpoint_set_status", (endpoint_id, status, reason, now))
        return None if row is None else EndpointStatusChange(row[0], row[1], row[2], row[3])

    async def delivery_kill_endpoint(
        self, conn: AsyncConnection, endpoint_id: str, reason: str, *, now: float
    ) -> None:
        """The endpoint's waiting deliveries become dead letters (``reason``), in
        ``conn``'s transaction; those under a live lease are left to their dispatcher.
        Two statements: the rows are locked first, so that the second one's snapshot
        sees every lease taken of them (a lease does not write the outbox row on
        PostgreSQL)."""
        ids = [r[0] for r in await self.db.rows(conn, "delivery_lock_endpoint", (endpoint_id,))]
        if ids:
            params = (endpoint_id, reason, now, self.db.array(ids))
            await self.db.rows(conn, "delivery_kill_endpoint", params)

    async def delivery_sweep_disabled(self, *, now: float, limit: int) -> int:
        """Waiting deliveries of disabled endpoints that no live lease holds become dead
        letters (``endpoint_disabled``), at most ``limit`` in one transaction; how many.
        Disabling kills an endpoint's waiting rows but leaves those a dispatcher holds,
        and the lease only takes rows of enabled endpoints: a row whose attempt was then
        retried, whose dispatcher died, or that a publish committed after the disabling
        transaction began, would otherwise wait for good (maintenance runs this)."""
        async with self.db.transaction() as conn:
            found = await self.db.rows(conn, "delivery_strays", (now, limit))
            by_endpoint: dict[str, list[int]] = {}
            for outbox_id, endpoint_id in found:
                by_endpoint.setdefault(str(endpoint_id), []).append(int(outbox_id))
            killed = 0
            for endpoint_id, ids in by_endpoint.items():
                locked = [
                    r[0]
                    for r in await self.db.rows(conn, "delivery_lock_ids", (self.db.array(ids),))
                ]
                if locked:
                    params = (endpoint_id, "endpoint_disabled", now, self.db.array(locked))
                    killed += len(await self.db.rows(conn, "delivery_kill_strays", params))
        return killed

    async def lane_upsert(
        self, conn: AsyncConnection, lane: str, max_in_flight: int, rate_limit: float | None
    ) -> None:
        """Set a lane's settings (its flow state stays), in ``conn``'s transaction."""
        await self.db.rows(conn, "lane_upsert", (lane, max_in_flight, rate_limit))

    # -- endpoint secrets ---------------------------------------------------------------

    async def endpoint_secrets_active(
        self, conn: AsyncConnection, endpoint_ids: Sequence[str], *, now: float
    ) -> list[StoredSecret]:
        """The endpoints' secrets not expired at ``now``, by endpoint, newest first."""
        params = (self.db.array(endpoint_ids), now)
        found = await self.db.rows(conn, "endpoint_secrets_active", params)
        return [StoredSecret(r[0], r[1], r[2], r[3]) for r in found]

    async def endpoint_secrets_reveal(
        self, conn: AsyncConnection, endpoint_id: str, *, now: float
    ) -> list[StoredSecret]:
        """The endpoint's active secrets not revealed before, newest first, now marked
        revealed (at ``now``): a second call, or one racing this one, gets none of them."""
        found = await self.db.rows(conn, "endpoint_secrets_reveal", (endpoint_id, now))
        rows = [StoredSecret(r[0], r[1], r[2], r[3]) for r in found]
        return sorted(rows, key=lambda r: r.created_at, reverse=True)

    async def endpoint_secret_rotate(
        self, conn: AsyncConnection, endpoint_id: str, sealed: str, *, until: float, now: float
    ) -> None:
        """Add a secret; every one still active keeps signing until ``until``."""
        await self.db.rows(conn, "endpoint_secret_expire", (endpoint_id, until))
        await self.db.rows(conn, "endpoint_secret_insert", (endpoint_id, sealed, now))

    async def endpoint_secret_sealed_any(self) -> bool:
        """Whether any stored secret is sealed."""
        async with self.db.transaction() as conn:
            return await self.db.first(conn, "endpoint_secret_sealed_any") is not None

    async def endpoint_secrets_page(
        self, conn: AsyncConnection, after: int, limit: int, *, plaintext: bool = False
    ) -> list[tuple[int, str]]:
        """Up to ``limit`` stored secrets (only plaintext ones: ``plaintext``) after id
        ``after``, in id order, as (id, stored value)."""
        name = "endpoint_secrets_plaintext_page" if plaintext else "endpoint_secrets_page"
        return [(r[0], r[1]) for r in await self.db.rows(conn, name, (after, limit))]

    async def endpoint_secret_swap(
        self, conn: AsyncConnection, secret_id: int, old: str, new: str
    ) -> bool:
        """Compare-and-set: the stored value becomes ``new`` only while it is ``old``."""
        return await self.db.first(conn, "endpoint_secret_swap", (secret_id, old, new)) is not None

    # -- messages -----------------------------------------------------------------------

    async def message_get_by_key(
        self, conn: AsyncConnection, tenant: str, idempotency_key: str
    ) -> Message | None:
        """The tenant's message published with ``idempotency_key``, if any: its keys
        table decides (``relaybox_message_keys``), whether or not the message row still
        exists (:meth:`Message.from_key_row`)."""
        row = await self.db.first(conn, *st.message_get_by_key(tenant, idempotency_key))
        return None if row is None else Message.from_key_row(row, tenant, idempotency_key)

    async def message_insert(self, conn: AsyncConnection, message: NewMessage) -> bool:
        """Insert ``message``; ``False`` when a message with its (tenant, idempotency
        key) exists already: the key's row in ``relaybox_message_keys``, inserted
        first in the same transaction, decides which publish is first."""
        return await st.run(self.db, conn, st.message_insert(message))

    async def message_publish(
        self, conn: AsyncConnection, message: NewMessage, endpoint_ids: Sequence[str]
    ) -> bool:
        """:meth:`message_insert`, then, if the message was inserted,
        :meth:`delivery_insert` for ``endpoint_ids`` (with the message's ordering key and
        sequence); ``False`` when its (tenant, idempotency key) exists already. (One
        statement with data-modifying CTEs on PostgreSQL cost the database more than
        the round trip it saved: bench/README.md.)"""
        if not await self.message_insert(conn, message):
            return False
        if endpoint_ids:
            await self.delivery_insert(
                conn,
                message.id,
                message.tenant,
                endpoint_ids,
                now=message.created_at,
                ordering_key=message.ordering_key,
                sequence=message.sequence,
            )
        return True

    async def message_sequence_next(
        self, conn: AsyncConnection, tenant: str, ordering_key: str
    ) -> int:
        """The next sequence number of the tenant's ``ordering_key``, in ``conn``'s
        transaction. A concurrent publish with the same key waits until this
        transaction ends (PostgreSQL: the counter's row lock), so a key's numbers
        increase in commit order."""
        row = await self.db.first(conn, *st.message_sequence_next(tenant, ordering_key))
        return int(row[0])

    async def message_get(self, message_id: str, tenant: str | None) -> Message | None:
        """One message (``tenant`` ``None``: of any tenant)."""
        async with self.db.transaction() as conn:
            row = await self.db.first(conn, "message_get", (message_id, tenant))
        return None if row is None else Message.from_row(row)

    async def message_list(
        self,
        tenant: str | None,
        *,
        event_type: str | None,
        before: tuple[float, str] | None,
        limit: int,
        idempotency_key: str | None = None,
    ) -> list[Message]:
        """Newest first; ``before`` is the ``(created_at, id)`` of the last one seen;
        ``idempotency_key`` matches exactly (case and spaces too)."""
        after_time, after_id = before if before else (None, None)
        params = (tenant, event_type, after_time, after_id, limit, idempotency_key)
        async with self.db.transaction() as conn:
            found = await self.db.rows(conn, "message_list", params)
        return [Message.from_row(r) for r in found]

    # -- deliveries ---------------------------------------------------------------------

    async def publish_context(
        self, conn: AsyncConnection, tenant: str, event_type: str
    ) -> PublishContext:
        """What a publish of ``event_type`` to ``tenant`` reads, in one statement in
        ``conn``'s transaction: the catalog's schema of the type (JSON text, ``None``
        without one) and the tenant's enabled endpoints as (id, event type patterns as
        JSON text, payload filter as JSON text or ``None``), by id."""
        found = await self.db.rows(conn, *st.publish_context(tenant, event_type))
        return PublishContext.from_rows(found)

    async def delivery_insert(
        self,
        conn: AsyncConnection,
        message_id: str,
        tenant: str,
        endpoint_ids: Sequence[str],
        *,
        now: float,
        ordering_key: str | None = None,
        sequence: int | None = None,
    ) -> None:
        """One pending outbox row per endpoint for the message, in ``conn``'s
        transaction, and a wake for the dispatchers when it commits. The rows of
        ordered endpoints carry ``ordering_key`` and ``sequence``."""
        statement = st.delivery_insert(
            message_id,
            tenant,
            endpoint_ids,
            self.db.array,
            now=now,
            ordering_key=ordering_key,
            sequence=sequence,
        )
        await self.db.rows(conn, *statement)
        await self.db.notify(conn, "outbox")

    async def delivery_list(
        self,
        tenant: str | None,
        *,
        message_id: str | None,
        endpoint_id: str | None,
        undelivered: bool,
        limit: int,
    ) -> list[DeliveryRow]:
        """Outbox rows, newest first; ``undelivered``: only those not sent."""
        params = (tenant, message_id, endpoint_id, undelivered, limit)
        async with self.db.transaction() as conn:
            found = await self.db.rows(conn, "delivery_list", params)
        return [DeliveryRow(*r) for r in found]

    async def delivery_search(
        self,
        tenant: str | None,
        *,
        status: str | None = None,
        event_type: str | None = None,
        message_id: str | None = None,
        idempotency_key: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int,
    ) -> list[DeliveryRow]:
        """The delivery log: outbox rows newest first, filtered by whatever is given
        (a tenant's own rows only when ``tenant`` is set)."""
        params = (tenant, status, event_type, message_id, idempotency_key, since, until, limit)
        async with self.db.transaction() as conn:
            found = await self.db.rows(conn, "delivery_log_list", params)
        return [DeliveryRow(*r) for r in found]

    async def attempt_minutes(self, since: float) -> list[tuple[float, str, int]]:
        """Attempts started since ``since``: (minute start, outcome, count), oldest first."""
        async with self.db.transaction() as conn:
            found = await self.db.rows(conn, "ops_attempt_minutes", (since,))
        return [(float(r[0]), str(r[1]), int(r[2])) for r in found]

    async def attempt_list(self, message_id: str, tenant: str | None) -> list[AttemptRow]:
        """The recorded attempts of a message's deliveries, in the order they ran."""
        async with self.db.transaction() as conn:
            found = await self.db.rows(conn, "delivery_attempts", (message_id, tenant))
        return [AttemptRow(*r) for r in found]

    async def delivery_redeliver(
        self, message_id: str, *, tenant: str | None, endpoint_id: str | None, now: float
    ) -> int:
        """Put the message's finished deliveries (to ``endpoint_id`` or every enabled
        endpoint) back to pending with a fresh budget; returns how many."""
        async with self.db.transaction() as conn:
            found = await self.db.rows(
                conn, "delivery_redeliver", (message_id, tenant, endpoint_id, now)
            )
            if found:
                await self.db.notify(conn, "outbox")
        return len(found)

    async def delivery_recover(
        self, endpoint_id: str, *, since: float, until: float | None, now: float
    ) -> int:
        """Retry every dead delivery of the endpoint created in ``[since, until)``;
        returns how many."""
        async with self.db.transaction() as conn:
            found = await self.db.rows(conn, "delivery_recover", (endpoint_id, since, until, now))
            if found:
                await self.db.notify(conn, "outbox")
        return len(found)

    async def ordering_blocked_keys(
        self, *, endpoint_id: str | None, tenant: str | None, limit: int
    ) -> list[BlockedKey]:
        """Ordering keys that dead deliveries hold back on endpoints with ``on_dead``
        ``hold`` (of ``endpoint_id`` / ``tenant``, or all), by endpoint and key."""
        async with self.db.transaction() as conn:
            found = await self.db.rows(conn, "ordering_blocked_keys", (endpoint_id, tenant, limit))
        return [BlockedKey(r[0], r[1], r[2], int(r[3]), int(r[4]), int(r[5])) for r in found]

    async def ordering_blocked_count(self) -> int:
        """How many (endpoint, key) pairs dead deliveries hold back."""
        async with self.db.transaction() as conn:
            return int((await self.db.first(conn, "ordering_blocked_count"))[0])

    async def ordering_key_release(self, endpoint_id: str, ordering_key: str, *, now: float) -> int:
        """Release a key held by dead deliveries: they stay dead letters but no longer
        hold the endpoint's later deliveries of the key back; returns how many."""
        async with self.db.transaction() as conn:
            found = await self.db.rows(
                conn, "ordering_key_release", (endpoint_id, ordering_key, now)
            )
            if found:
                await self.db.notify(conn, "outbox")
        return len(found)

    # -- operator views -----------------------------------------------------------------

    async def endpoint_health(self, *, since: float) -> dict[str, EndpointHealth]:
        """Per endpoint id, its delivery attempts started since ``since``."""
        async with self.db.transaction() as conn:
            found = await self.db.rows(conn, "ops_endpoint_health", (since,))
        return {r[0]: EndpointHealth(int(r[1]), int(r[2] or 0), r[3]) for r in found}

    async def endpoint_backlog(self) -> dict[str, EndpointBacklog]:
        """Per endpoint id with undelivered rows, how many of each status."""
        async with self.db.transaction() as conn:
            found = await self.db.rows(conn, "ops_endpoint_backlog")
        return {
            r[0]: EndpointBacklog(int(r[1] or 0), int(r[2] or 0), int(r[3] or 0), r[4])
            for r in found
        }

    async def endpoint_attempts(self, endpoint_id: str, *, limit: int) -> list[EndpointAttempt]:
        """The endpoint's most recent attempts, newest first."""
        async with self.db.transaction() as conn:
            found = await self.db.rows(conn, "ops_endpoint_attempts", (endpoint_id, limit))
        return [EndpointAttempt(*r) for r in found]

    async def message_purged_at(self, message_id: str) -> float | None:
        """When retention emptied the message's body; ``None``: it is there (or there
        is no such message)."""
        async with self.db.transaction() as conn:
            row = await self.db.first(conn, "ops_message_purged_at", (message_id,))
        return None if row is None else row[0]
