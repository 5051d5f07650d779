"""The statements the asynchronous store and the synchronous one both run, written
once: for each, the named SQL block with its parameters (a :data:`Statement`) and
what its rows mean.

A statement of one step is a function returning its :data:`Statement`; the areas of
:mod:`relaybox.store.base` run it with ``await db.rows(conn, *statement)``, those of
:mod:`relaybox.store.sync` with ``db.rows(conn, *statement)``. A use of several
steps, each depending on the rows of the one before (a key inserted, else read), is
a generator (a :data:`Steps`): it yields each statement, is sent its rows, and
returns the answer; :func:`run` and :func:`run_sync` drive it. Lists travel as each
backend takes them: the caller's ``array`` (a PostgreSQL array, JSON text on SQLite).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from relaybox.store import keys
from relaybox.store.inbox_rows import InboxEvent, NewAttempt, NewOperation, OutboxRow
from relaybox.store.keys import message_digest

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection
    from sqlalchemy.ext.asyncio import AsyncConnection

    from relaybox.store.backend import Backend
    from relaybox.store.outbox_rows import NewMessage
    from relaybox.store.sync import SyncStore

__all__ = ["Statement", "Steps", "run", "run_sync"]

T = TypeVar("T")

Statement = tuple[str, tuple[Any, ...]]
"""A named SQL block and its parameters."""

Steps = Generator[Statement, list[Any], T]
"""Statements that depend on each other's rows, and the answer they make."""

Array = Callable[[Sequence[Any]], Any]
"""How the backend takes a list parameter (:meth:`Backend.array
<relaybox.store.backend.Backend.array>`)."""


async def run(db: Backend, conn: AsyncConnection, steps: Steps[T]) -> T:
    """Run ``steps`` in ``conn``'s transaction (asynchronous store)."""
    try:
        statement = next(steps)
        while True:
            statement = steps.send(await db.rows(conn, *statement))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def run_sync(db: SyncStore, conn: Connection, steps: Steps[T]) -> T:
    """Run ``steps`` in ``conn``'s transaction (synchronous store)."""
    try:
        statement = next(steps)
        while True:
            statement = steps.send(db.rows(conn, *statement))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


# -- the inbox's processing ---------------------------------------------------------------


def inbox_begin(inbox_id: int, *, attempt: int, now: float) -> Statement:
    """Mark the row done if it is still pending at ``attempt``."""
    return "inbox_begin_done", (inbox_id, now, attempt)


def inbox_lock(ids: Sequence[int], array: Array) -> Statement:
    """Lock rows still pending (:func:`inbox_events` reads them)."""
    return "inbox_lock", (array(ids),)


def inbox_events(rows: Sequence[Any]) -> list[InboxEvent]:
    return [InboxEvent.from_row(r) for r in rows]


def inbox_retry_later(inbox_id: int, *, at: float, error: str, now: float) -> Statement:
    return "inbox_retry_later", (inbox_id, at, error, now)


def inbox_kill(inbox_id: int, *, reason: str, error: str, now: float) -> Statement:
    return "inbox_kill", (inbox_id, reason, error, now)


def attempt_insert(attempt: NewAttempt) -> Statement:
    return "attempt_insert", (
        attempt.inbox_id,
        attempt.attempt,
        attempt.outcome,
        attempt.error,
        attempt.worker,
        attempt.started_at,
        attempt.finished_at,
    )


def operation_insert(operation: NewOperation, backend: str) -> Steps[tuple[bool, str]]:
    """Insert a business key (its digest decides, its readable row follows); (created,
    stored fingerprint). PostgreSQL runs both halves in one statement, SQLite in two."""
    o = operation
    key, row = keys.operation_params(
        o.business_key, o.fingerprint, o.inbox_id, o.source, o.tenant, o.now
    )
    if backend == "postgres":
        found = (yield ("operation_insert", (*key, *row)))[0]
        keyed, created = bool(found[0]), bool(found[1])
    else:
        keyed = bool((yield ("operation_insert", key)))
        created = keyed and bool((yield ("operation_record", row)))
    if created:
        return True, o.fingerprint
    existing = yield ("operation_get", (key[0], o.business_key))
    stored, fix = keys.operation_stored(
        o.fingerprint, keyed=keyed, found=existing[0] if existing else None
    )
    if fix is not None:
        yield ("operation_key_fix", (key[0], fix))
    return False, stored


def outbox_insert(row: OutboxRow, *, now: float) -> Statement:
    """A handler's outbox row; no row back when (channel, key) exists."""
    channel, key, payload, tenant, inbox_id = row
    return "outbox_insert", (channel, key, payload, tenant, inbox_id, now)


def outbox_insert_rows(rows: Sequence[OutboxRow], *, now: float) -> Steps[None]:
    """Handlers' outbox rows one by one; a (channel, key) that exists is left alone."""
    for row in rows:
        yield outbox_insert(row, now=now)


# -- publishing ----------------------------------------------------------------------------


def message_get_by_key(tenant: str, idempotency_key: str) -> Statement:
    digest = message_digest(tenant, idempotency_key)
    return "message_get_by_key", (digest, tenant, idempotency_key)


def message_insert(message: NewMessage) -> Steps[bool]:
    """Insert ``message``; ``False`` when its (tenant, idempotency key) exists: the
    key's row in ``relaybox_message_keys``, inserted first, decides."""
    key = message.key_params()
    if key is not None and not (yield ("message_key_insert", key)):
        return False
    if (yield ("message_insert", message.params())):
        return True
    if key is not None:  # an old message under this key, stored before its key
        yield ("message_key_adopt", (key[0], message.tenant, message.idempotency_key))
    return False


def publish_context(tenant: str, event_type: str) -> Statement:
    return "publish_context", (tenant, event_type)


def message_sequence_next(tenant: str, ordering_key: str) -> Statement:
    return "message_sequence_next", (tenant, ordering_key)


def delivery_insert(
    message_id: str,
    tenant: str,
    endpoint_ids: Sequence[str],
    array: Array,
    *,
    now: float,
    ordering_key: str | None,
    sequence: int | None,
) -> Statement:
    """One pending outbox row per endpoint for the message."""
    return "delivery_insert", (message_id, tenant, now, array(endpoint_ids), ordering_key, sequence)


# -- handlers' other statements -------------------------------------------------------------


def inbox_mark_superseded(inbox_id: int, by: str) -> Statement:
    return "inbox_mark_superseded", (inbox_id, by)


def subject_index(digest: bytes, kind: str, ref: str) -> Statement:
    return "subject_index", (digest, kind, ref)
