"""Publishing from synchronous code: :meth:`Relaybox.publish_sync`.

    with engine.begin() as conn:                 # or a Session, or box.sync_transaction()
        conn.execute(text("UPDATE pets SET status = 'adopted' ..."))
        box.publish_sync(conn, "pet.adopted", {"petId": ...}, tenant="client-42")

The same rows, checks and answers as the async :func:`relaybox.outbound.publish.publish`
(whose pure parts it shares), over a synchronous ``Connection`` in the caller's
transaction: the change and its webhooks commit together, or neither exists.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from relaybox import tracing
from relaybox.errors import ConfigurationError
from relaybox.outbound.catalog import check_schema
from relaybox.outbound.publish import (
    Publication,
    new_message,
    publish_attributes,
    published,
    subject_at,
    targets,
)
from relaybox.store.outbox_rows import Message

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = ["connection_of", "publish_sync"]


def connection_of(conn_or_session: Connection | Session) -> Connection:
    """The ``Connection`` to run on: ``conn_or_session`` itself, or the session's
    connection in its transaction (begun if it has none yet)."""
    if isinstance(conn_or_session, Session):
        return conn_or_session.connection()
    if isinstance(conn_or_session, Connection):
        return conn_or_session
    raise ConfigurationError(
        "publish_sync takes a sqlalchemy Connection or orm Session in a transaction,"
        f" not {type(conn_or_session).__name__} (async code uses box.publish)"
    )


def publish_sync(
    box: Runtime, conn_or_session: Connection | Session, request: Publication
) -> Message:
    """Publish ``request`` (its data as its event type) to the tenant's subscribed,
    enabled endpoints in the transaction of ``conn_or_session``; nothing is committed
    here. Raises :class:`~relaybox.outbound.InvalidMessage` as ``publish`` does; with
    an idempotency key already used by the tenant, returns that message. An ordering
    key as in ``publish``: the key's next sequence number, taken in this transaction
    (a concurrent publish with the same key waits for it to end). Traced as
    ``relaybox.publish``, like ``publish``."""
    with tracing.span("relaybox.publish", kind="producer") as span:
        message = _publish_sync(box, connection_of(conn_or_session), request)
        if span.is_recording():
            span.set_attributes(publish_attributes(message))
        return message


def _publish_sync(box: Runtime, conn: Connection, request: Publication) -> Message:
    store = box.store.sync
    digest = request.check()
    tenant, key, ordering_key = request.tenant, request.idempotency_key, request.ordering_key
    if key is not None:
        existing = store.outbox.message_get_by_key(conn, tenant, key)
        if existing is not None:
            return existing
    context = store.outbox.publish_context(conn, tenant, request.event_type)
    check_schema(context.schema, request.event_type, request.data)
    sequence = None
    if ordering_key is not None:  # last before the insert, as publish() takes it
        sequence = store.outbox.message_sequence_next(conn, tenant, ordering_key)
    new = new_message(box, request, sequence)
    if not store.outbox.message_insert(conn, new):
        # A concurrent publish with this key committed first.
        assert key is not None  # only a key conflicts
        existing = store.outbox.message_get_by_key(conn, tenant, key)
        assert existing is not None  # the conflicting row is committed
        return existing
    if digest is None and context.subject is not None:
        digest = subject_at(context.subject, json.loads(new.body))
    found = targets(new, context.subscribers, request.endpoint_ids)
    if found:
        store.outbox.delivery_insert(
            conn,
            new.id,
            tenant,
            found,
            now=new.created_at,
            ordering_key=ordering_key,
            sequence=sequence,
        )
    if digest is not None:
        store.erasure.subject_index(conn, digest, "message", new.id)
    return published(new, found)
