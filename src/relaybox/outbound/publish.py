"""Publishing: one message plus one outbox row per subscribed endpoint, written in the
caller's own transaction.

    async with box.store.transaction() as conn:          # or the app's own connection
        await conn.execute(text("UPDATE pets SET status = 'adopted' ..."))
        await box.publish(conn, "pet.adopted", {"petId": ...}, tenant="client-42")

Either the adoption and its webhooks commit together, or neither exists: no webhook
for a change that rolled back, no change whose webhook was lost (the outbox pattern).
Nothing is sent here; the dispatcher delivers after COMMIT.
"""

from __future__ import annotations

import asyncio
import fnmatch
import functools
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox import tracing
from relaybox.outbound.catalog import InvalidMessage, check_event_type_name, check_schema
from relaybox.outbound.filters import CompiledFilter, compile_filter
from relaybox.outbound.registry import outbound
from relaybox.sources.base import MAX_SUBJECT_CHARS, extract, subject_digest
from relaybox.store.outbox_rows import Message, NewMessage, new_id
from relaybox.wire import NotJsonNumber, text_problem, write_json

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = [
    "Publication",
    "check_request",
    "envelope_time",
    "fan_out",
    "matches",
    "new_message",
    "publish",
    "publish_attributes",
    "published",
    "stored_filter",
    "subject_at",
    "subject_of",
    "targets",
    "wants",
]


def envelope_time(now: float) -> str:
    stamp = datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds")
    return stamp.replace("+00:00", "Z")


def matches(event_type: str, patterns: Sequence[str]) -> bool:
    """Does an endpoint subscribed to ``patterns`` (``*`` wildcards) get this type?"""
    return any(fnmatch.fnmatchcase(event_type, p) for p in patterns)


def wants(
    event_type: str,
    envelope: Callable[[], Any],
    patterns: Sequence[str],
    payload_filter: CompiledFilter | Mapping[str, Any] | None,
) -> bool:
    """Does an endpoint subscribed to ``patterns`` with ``payload_filter`` get this
    message? ``envelope`` gives the parsed envelope, read only when there is a filter
    (the one rule of a subscription: publish and replay missing both ask here). A
    caller asking about many messages passes the filter compiled once
    (:func:`~relaybox.outbound.filters.compile_filter`)."""
    if not matches(event_type, patterns):
        return False
    if payload_filter is None:
        return True
    if not isinstance(payload_filter, CompiledFilter):
        payload_filter = compile_filter(payload_filter)
    return payload_filter.holds(envelope())


SLICE = 0.002
"""Seconds of fan-out work a publish does on the event loop before it lets other tasks
run (:func:`fan_out_sliced`)."""


def fan_out(
    subscribers: Sequence[tuple[str, str, str | None]],
    event_type: str,
    body: str,
    *,
    envelope: Any = None,
) -> list[str]:
    """The endpoints among ``subscribers`` (id, event type patterns as JSON text, payload
    filter as JSON text or ``None``: :meth:`OutboxStore.publish_context`) that get a
    message of ``event_type`` whose envelope is the JSON text ``body`` (``envelope``:
    that text already parsed, when the caller has it)."""
    return [eid for eid in _choices(subscribers, event_type, body, envelope) if eid]


async def fan_out_sliced(
    subscribers: Sequence[tuple[str, str, str | None]],
    event_type: str,
    body: str,
    *,
    envelope: Any = None,
) -> list[str]:
    """:func:`fan_out` on the event loop, in slices: after each :data:`SLICE` of work
    (compiling filters this process has not seen yet, evaluating them) it lets the
    other tasks run, so that a tenant with many large filters delays nobody else by
    more than a slice. What a publish evaluates is bounded when filters are saved
    (``filter_max_cost``, ``filter_tenant_max_cost``); compiling is bounded per filter
    by its size and happens once per filter and process (:func:`stored_filter`)."""
    chosen: list[str] = []
    began = time.perf_counter()
    for eid in _choices(subscribers, event_type, body, envelope):
        if eid:
            chosen.append(eid)
        if time.perf_counter() - began >= SLICE:
            await asyncio.sleep(0)
            began = time.perf_counter()
    return chosen


def _choices(
    subscribers: Sequence[tuple[str, str, str | None]],
    event_type: str,
    body: str,
    envelope: Any,
) -> Iterator[str | None]:
    """Per subscriber in turn: its id when it gets the message, else ``None``. The
    envelope is parsed from ``body`` at most once, and only when a filter needs it."""
    parsed: list[Any] = [] if envelope is None else [envelope]
    for eid, patterns, flt in subscribers:
        if not _subscribed(event_type, patterns):
            yield None
        elif flt is None:
            yield eid
        else:
            compiled = stored_filter(flt)
            if not parsed:
                parsed.append(json.loads(body))
            yield eid if compiled.holds(parsed[0]) else None


@functools.lru_cache(maxsize=1024)
def _subscribed(event_type: str, patterns: str) -> bool:
    """:func:`matches` for patterns as stored (JSON text). A publish asks it of every
    enabled endpoint of its tenant: remembered, not parsed and matched again each
    time (the same rule as :func:`wants`). At most 1,024 answers kept: an endpoint's
    patterns are at most 100 of 200 characters, so the cache stays within ~21 MB
    however tenants name them."""
    return matches(event_type, json.loads(patterns))


@functools.lru_cache(maxsize=1024)
def stored_filter(text: str) -> CompiledFilter:
    """A payload filter as stored (JSON text, checked when it was saved), compiled
    once per process: a publish asks it of every filtered endpoint of its tenant, and
    parsing and compiling each again would cost in proportion to the filters' size,
    per message. At most 1,024 kept, ten tenants' worth of ``max_endpoints`` with
    every filter distinct: a filter within the defaults (4 KiB, 250 steps) takes at
    most ~100 KiB compiled (a few KiB as usually written), so the cache stays under
    ~100 MiB however tenants write them. One dropped and needed again costs its
    compile once more: bounded by its size and cost, and done in a slice of its own
    (:func:`fan_out_sliced`)."""
    return compile_filter(json.loads(text))


async def publish(
    box: Runtime,
    conn: AsyncConnection,
    event_type: str,
    data: Any,
    *,
    tenant: str,
    idempotency_key: str | None = None,
    endpoint_ids: Sequence[str] | None = None,
    api_version: str | None = None,
    ordering_key: str | None = None,
    json_data: bool = False,
    subject: str | None = None,
) -> Message:
    """Publish ``data`` as ``event_type`` to ``tenant``'s subscribed, enabled
    endpoints (or only to ``endpoint_ids`` among them, subscribed or not: test sends)
    in ``conn``'s transaction. Raises :class:`InvalidMessage` (bad type, data not
    matching the catalog's schema, data that is not JSON text (a lone surrogate),
    body over ``max_payload``, a bad ordering key).

    ``json_data``: ``data`` is what parsing JSON text gave (the tenant API's body), so
    payload filters read it as it is instead of parsing the message's text again
    (other Python values, tuples or keys that are not strings, read differently once
    written as JSON).

    ``ordering_key``: the message takes the key's next sequence number (the envelope's
    ``orderingKey`` and ``sequence``, the ``webhook-sequence`` header), and endpoints
    with ``ordered`` receive the key's messages one at a time, in that order. The
    number is taken in ``conn``'s transaction: a concurrent publish with the same key
    waits for it to end.

    ``subject``: whom the message is about (a customer id): the message is indexed
    under it in ``conn``'s transaction, and ``relaybox erase --subject`` empties it
    and its deliveries (:mod:`relaybox.erasure`). Without it, the value at the event
    type's subject path (``define_event_type(..., subject="data.customer.id")``), if
    the catalog gives one and the message has a value there (:func:`subject_at`).

    Traced as ``relaybox.publish`` (a child of the current span: the handler's, the
    request's), whose context the message keeps for its delivery attempts."""
    request = Publication(
        event_type,
        data,
        tenant,
        idempotency_key=idempotency_key,
        endpoint_ids=endpoint_ids,
        api_version=api_version,
        ordering_key=ordering_key,
        json_data=json_data,
        subject=subject,
    )
    # Runs when awaited: inside the span when there is one.
    publishing = _publish(box, conn, request)
    if not tracing.enabled():
        return await publishing
    with tracing.span("relaybox.publish", kind="producer") as span:
        message = await publishing
        if span.is_recording():
            span.set_attributes(publish_attributes(message))
        return message


def publish_attributes(message: Message) -> dict[str, str | int | bool]:
    """The attributes of a ``relaybox.publish`` span, once the message is checked and
    written: its id, type and tenant, how many endpoints it fans out to, and whether
    it is new (not an earlier publish with the same idempotency key)."""
    return {
        "relaybox.message_id": message.id,
        "relaybox.event_type": message.event_type,
        "relaybox.tenant": message.tenant,
        "relaybox.fan_out": len(message.endpoints),
        "relaybox.created": message.created,
    }


async def _publish(box: Runtime, conn: AsyncConnection, request: Publication) -> Message:
    store = box.store
    digest = request.check()
    tenant, key, ordering_key = request.tenant, request.idempotency_key, request.ordering_key
    if key is not None:
        existing = await store.outbox.message_get_by_key(conn, tenant, key)
        if existing is not None:
            return existing
    context = await store.outbox.publish_context(conn, tenant, request.event_type)
    check_schema(context.schema, request.event_type, request.data)
    sequence = None
    if ordering_key is not None:
        # Taken last before the insert: the counter's row lock is held from here to
        # the end of the caller's transaction.
        sequence = await store.outbox.message_sequence_next(conn, tenant, ordering_key)
    new = new_message(box, request, sequence)
    # Data parsed from JSON text is what parsing the envelope's text gives again: the
    # filters and the subject path read it in place.
    envelope = None
    if request.json_data:
        envelope = envelope_of(box, new.id, new.created_at, request, sequence)
    if digest is None and context.subject is not None:
        if envelope is None:
            envelope = json.loads(new.body)  # once: the filters read it too
        digest = subject_at(context.subject, envelope)
    if request.endpoint_ids is not None:
        found = targets(new, context.subscribers, request.endpoint_ids)
    else:
        found = await fan_out_sliced(
            context.subscribers, request.event_type, new.body, envelope=envelope
        )
    if not await store.outbox.message_publish(conn, new, found):
        # A concurrent publish with this key committed first.
        assert key is not None  # only a key conflicts
        existing = await store.outbox.message_get_by_key(conn, tenant, key)
        assert existing is not None  # the conflicting row is committed
        return existing
    if digest is not None:
        await store.erasure.subject_index(conn, digest, "message", new.id)
    return published(new, found)


# -- the pure parts of a publish, shared with the synchronous one (relaybox.sync) ------


@dataclass(frozen=True)
class Publication:
    """One publish as asked: :func:`publish`'s arguments (``box.publish_sync`` makes
    one for :func:`relaybox.sync.publish.publish_sync`)."""

    event_type: str
    data: Any
    tenant: str
    idempotency_key: str | None = None
    endpoint_ids: Sequence[str] | None = None
    api_version: str | None = None
    ordering_key: str | None = None
    json_data: bool = False
    subject: str | None = None

    def check(self) -> bytes | None:
        """The checks that need no database (:func:`check_request`, the subject's),
        made before anything is looked up; the digest the message is indexed under
        (:func:`subject_of`), or ``None``."""
        check_request(self.event_type, self.tenant, self.idempotency_key, self.ordering_key)
        return subject_of(self.subject)


def check_request(
    event_type: str, tenant: str, idempotency_key: str | None, ordering_key: str | None
) -> None:
    """The checks of a publish that need no database, made before anything is looked
    up (a repeated idempotency key with a bad value beside it is refused, not answered
    with the stored message): :class:`InvalidMessage` for a bad type, tenant,
    idempotency key or ordering key."""
    check_event_type_name(event_type)
    if not tenant:
        raise InvalidMessage("a message needs a tenant", code="tenant")
    if problem := text_problem(tenant, "tenant"):
        raise InvalidMessage(problem, code="tenant")
    if idempotency_key is not None:
        if not 0 < len(idempotency_key) <= 256:
            raise InvalidMessage("an idempotency key is 1-256 characters", code="idempotency_key")
        if problem := text_problem(idempotency_key, "idempotency key"):
            raise InvalidMessage(problem, code="idempotency_key")
    check_ordering_key(ordering_key)


def subject_of(subject: str | None) -> bytes | None:
    """The digest a message is indexed under (:func:`subject_digest`), or ``None``;
    :class:`InvalidMessage` for a subject no erasure could name."""
    if subject is None:
        return None
    if not 0 < len(subject) <= MAX_SUBJECT_CHARS:
        raise InvalidMessage(f"a subject is 1-{MAX_SUBJECT_CHARS} characters", code="subject")
    if problem := text_problem(subject, "subject"):
        raise InvalidMessage(problem, code="subject")
    return subject_digest(subject)


def subject_at(path: str, envelope: Any) -> bytes | None:
    """The digest of the subject at the event type's ``path`` in the message's
    ``envelope`` as its receivers read it (the body's JSON parsed: ``data.customer.id``),
    or ``None`` when there is no value there (the message is not indexed, as a source
    indexes no event without one). A value no erasure could name (over
    :data:`MAX_SUBJECT_CHARS` characters, a NUL) is :class:`InvalidMessage`: refused
    in the producer's transaction."""
    value = extract(path, {}, envelope)
    if value is None or value == "":
        return None
    try:
        return subject_of(value)
    except InvalidMessage as exc:
        raise InvalidMessage(
            f"the value at the subject path {path}: {exc}", code="subject"
        ) from None


def check_ordering_key(ordering_key: str | None) -> None:
    """:class:`InvalidMessage` for an ordering key that is empty, longer than 256
    characters or text no database stores; ``None`` is no key."""
    if ordering_key is not None:
        if not 0 < len(ordering_key) <= 256:
            raise InvalidMessage("an ordering key is 1-256 characters", code="ordering_key")
        if problem := text_problem(ordering_key, "ordering key"):
            raise InvalidMessage(problem, code="ordering_key")


def new_message(box: Runtime, request: Publication, sequence: int | None) -> NewMessage:
    """The message row: its id, and the envelope as JSON text within ``max_payload``
    (with ``orderingKey`` and ``sequence`` for a keyed message)."""
    ob = outbound(box)
    now = box.clock.now()
    msg_id = new_id("msg", now)
    envelope = envelope_of(box, msg_id, now, request, sequence)
    try:
        text = write_json(envelope, separators=(",", ":"), ensure_ascii=False)
        size = len(text.encode())
    except UnicodeEncodeError:
        # A lone surrogate ("\ud800" in JSON) is not Unicode text: no backend stores it.
        problem = text_problem(request.data, "data") or "data: not valid Unicode"
        raise InvalidMessage(problem, code="data") from None
    except NotJsonNumber as exc:  # a float NaN or infinity: receivers could not parse it
        raise InvalidMessage(f"data: {exc}", code="data") from None
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidMessage(f"data is not JSON-serialisable: {exc}"[:200], code="data") from None
    if size > ob.settings.max_payload:
        raise InvalidMessage(
            f"the message is over {ob.settings.max_payload} bytes", code="too_large"
        )
    return NewMessage(
        msg_id,
        request.tenant,
        request.event_type,
        request.idempotency_key,
        text,
        now,
        request.ordering_key,
        sequence,
        tracing.traceparent(),  # the publish's span (None untraced)
    )


def envelope_of(
    box: Runtime, msg_id: str, now: float, request: Publication, sequence: int | None
) -> dict[str, Any]:
    """The envelope a receiver gets (:func:`new_message` writes it as JSON text)."""
    envelope = {
        "id": msg_id,
        "type": request.event_type,
        "timestamp": envelope_time(now),
        "data": request.data,
        "apiVersion": request.api_version or outbound(box).settings.api_version,
    }
    if request.ordering_key is not None:
        envelope["orderingKey"] = request.ordering_key
        envelope["sequence"] = sequence
    return envelope


def targets(
    new: NewMessage,
    subscribers: Sequence[tuple[str, str, str | None]],
    endpoint_ids: Sequence[str] | None,
) -> list[str]:
    """The endpoints ``new`` goes to, of the tenant's enabled ``subscribers``: those
    named (a test send), or those whose types and payload filter want it
    (:func:`fan_out`)."""
    if endpoint_ids is not None:
        wanted = set(endpoint_ids)
        return [eid for eid, _, _ in subscribers if eid in wanted]
    return fan_out(subscribers, new.event_type, new.body)


def published(new: NewMessage, endpoints: Sequence[str]) -> Message:
    """What a publish returns for the message it inserted."""
    return Message(
        id=new.id,
        tenant=new.tenant,
        event_type=new.event_type,
        idempotency_key=new.idempotency_key,
        body=new.body.encode(),
        created_at=new.created_at,
        endpoints=tuple(endpoints),
        ordering_key=new.ordering_key,
        sequence=new.sequence,
    )
