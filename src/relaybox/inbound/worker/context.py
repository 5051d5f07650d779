"""The handler API: what a handler gets (:class:`Context`, its :class:`Outbox`), how it
is registered (:class:`Registration`), and the worker's test :class:`Hooks`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from relaybox import tracing
from relaybox.errors import OperationConflict
from relaybox.inbound import projections
from relaybox.store import InboxEvent, OutboxRow
from relaybox.store.inbox_rows import NewOperation
from relaybox.wire import write_json

if TYPE_CHECKING:
    from relaybox.runtime import InboundRuntime, Runtime
    from relaybox.sync.context import SyncContext

__all__ = [
    "Context",
    "Handler",
    "Handling",
    "Hooks",
    "Outbox",
    "Registration",
    "SyncHandler",
    "process_attributes",
]


def process_attributes(event: InboxEvent) -> dict[str, str | int]:
    """The attributes of an event's ``relaybox.process`` span: its keys and attempt
    (bounded by the accept's checks; no payload)."""
    attributes: dict[str, str | int] = {
        "relaybox.inbox_id": event.id,
        "relaybox.source": event.source,
        "relaybox.event_id": event.event_id,
        "relaybox.event_type": event.event_type,
        "relaybox.attempt": event.attempts,
    }
    if event.tenant is not None:
        attributes["relaybox.tenant"] = event.tenant
    return attributes


log = structlog.get_logger("relaybox.worker")

S = TypeVar("S")

Handler = Callable[["Context"], Awaitable[None]]
SyncHandler = Callable[["SyncContext"], None]
"""A handler written as a plain ``def``: the worker runs it in a thread, in a
synchronous transaction (:mod:`relaybox.sync`)."""


class Registration(NamedTuple):
    """A handler as registered (:meth:`Relaybox.handler`). ``sync``: a plain ``def``
    (:data:`SyncHandler`), run in a thread in a synchronous transaction."""

    source: str
    event_type: str
    handler: Handler | SyncHandler
    business_key: Callable[[Any], str | None] | None = None
    fingerprint: str = ""
    sync: bool = False


class Outbox:
    """Outgoing actions recorded in the handler's transaction."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx

    async def add(self, channel: str, key: str, payload: Any) -> None:
        """Record an outgoing action, once per ``(channel, key)``: a key recorded
        before (by this event or any other) is left as it is. The row is written in
        the handler's transaction, with its COMMIT (on PostgreSQL in the COMMIT's own
        round trip), and delivered after it by the dispatcher, never before. A payload
        that is not JSON, or a channel or key that is not text, fails here."""
        _add_row(self._ctx, channel, key, payload)


def _add_row(ctx: Handling, channel: str, key: str, payload: Any) -> None:
    """``ctx.outbox.add``'s checks and its row, recorded in the context (both kinds)."""
    for name, value in (("channel", channel), ("key", key)):
        if not isinstance(value, str) or "\x00" in value:
            raise TypeError(f"outbox {name} must be text without NUL characters")
        value.encode()  # lone surrogates cannot be stored: fail in the handler
    event = ctx.event
    _check_channel(ctx.box, channel)
    # Strict JSON: a float NaN or infinity fails here (NotJsonNumber), in the handler,
    # not as a document no destination can parse.
    ctx.outbox_rows.append(OutboxRow(channel, key, write_json(payload), event.tenant, event.id))
    ctx.outbox_keys.append(f"{channel}:{key}")


_UNKNOWN_CHANNELS_SAID: set[str] = set()


def _check_channel(box: Runtime, channel: str) -> None:
    """Say once per process (an error line) that rows are recorded for a channel no
    dispatcher of this app delivers: they stay pending until it is registered.
    ``relaybox doctor`` names them too."""
    if channel in _UNKNOWN_CHANNELS_SAID:
        return
    if channel not in box.outbound.channels:
        _UNKNOWN_CHANNELS_SAID.add(channel)
        log.error(
            "outbox_channel_not_registered",
            channel=channel,
            detail="its rows stay pending until a channel of that name is registered"
            f" (box.outbound.channel({channel!r}, ...))",
        )


@dataclass
class Handling:
    """What every handler's context has, whatever its kind (:class:`Context` for
    ``async def`` handlers, :class:`relaybox.sync.SyncContext` for plain ``def``
    ones): the event, its payload, the declared business key, the outbox rows and
    business keys recorded. No I/O here. Each kind narrows ``conn`` to its
    connection's type and adds its ``outbox``."""

    box: InboundRuntime
    conn: Any
    event: InboxEvent
    business_keys: list[str] = field(default_factory=list)
    outbox_keys: list[str] = field(default_factory=list)
    outbox_rows: list[OutboxRow] = field(default_factory=list)  # written before COMMIT

    def __post_init__(self) -> None:
        self._payload: Any = None
        # The handler's declared business key (Relaybox.handler), its fingerprint, the
        # error its function raised, and whether the group's BEGIN inserted it and no
        # ctx.once() has answered for it yet.
        self._key: str | None = None
        self._fingerprint = ""
        self._key_error: Exception | None = None
        self._claimed = False
        self._session: Any = None
        # The handler's span (relaybox.process) as a traceparent, when traced: the
        # outcome's span (OutcomeRecorder.record) is its child.
        self._trace: str | None = None

    def _declare(self, registration: Registration) -> None:
        if registration.business_key is None:
            return
        self._fingerprint = registration.fingerprint
        try:
            key = registration.business_key(self)
        except Exception as exc:  # ctx.once() raises it, inside the handler
            self._key_error = exc
            return
        if key is not None and not isinstance(key, str):
            self._key_error = TypeError(f"business_key returned {type(key).__name__}, not str")
            return
        self._key = key

    @property
    def payload(self) -> Any:
        """The delivery's body as its source decodes it: JSON, or a dict for form,
        multipart and XML bodies (the raw bytes are ``ctx.event.payload``)."""
        if self._payload is None:
            event = self.event
            source = self.box.sources.get(event.source)
            if source is None or event.payload is None:
                self._payload = event.json()
            else:
                self._payload = source.decode(event.headers, event.payload)
        return self._payload

    @property
    def tenant(self) -> str | None:
        return self.event.tenant

    @property
    def outbox_created(self) -> bool:
        """Outbox rows were recorded: the worker wakes the dispatchers after COMMIT."""
        return bool(self.outbox_rows)

    def _once_asked(
        self, business_key: str | None, fingerprint: str | None
    ) -> tuple[str, str] | None:
        """The key and fingerprint ``once()`` inserts; ``None`` when the group's BEGIN
        inserted the declared key already (the answer is True)."""
        if business_key is None:
            if self._key_error is not None:
                raise self._key_error
            if self._key is None:
                raise TypeError("ctx.once() needs a business key: the handler declares none")
            business_key = self._key
        if business_key == self._key:
            if fingerprint is None:
                fingerprint = self._fingerprint
            elif fingerprint != self._fingerprint:
                raise ValueError(
                    f"business key {business_key!r} is declared with fingerprint "
                    f"{self._fingerprint!r}, not {fingerprint!r}"
                )
            if self._claimed:  # inserted by the group's BEGIN: the first time
                self._claimed = False
                self.business_keys.append(business_key)
                return None
        elif fingerprint is None:
            fingerprint = ""
        return business_key, fingerprint

    def _operation(self, business_key: str, fingerprint: str) -> NewOperation:
        """The row ``once()`` inserts for ``business_key`` (both kinds)."""
        return NewOperation(
            business_key=business_key,
            fingerprint=fingerprint,
            inbox_id=self.event.id,
            source=self.event.source,
            tenant=self.event.tenant,
            now=self.box.clock.now(),
        )

    def _bound_session(self, kind: Callable[..., S]) -> S:
        """The ORM session of ``kind`` on :attr:`conn`, made on first use (both kinds)."""
        if self._session is None:
            # SQLAlchemy's default joining: the session works inside the handler's
            # transaction (or its savepoint) and never commits it.
            self._session = kind(bind=self.conn)
        session: S = self._session
        return session

    def _once_answer(self, business_key: str, fingerprint: str, created: bool, stored: str) -> bool:
        """``once()``'s answer once the key's insert said ``created`` (and the stored
        fingerprint): :class:`OperationConflict` for another fingerprint."""
        self.business_keys.append(business_key)
        if not created and stored != fingerprint:
            raise OperationConflict(business_key, stored, fingerprint)
        return created


@dataclass
class Context(Handling):
    """What a handler gets: the event and the transaction it runs in."""

    conn: AsyncConnection

    def __post_init__(self) -> None:
        super().__post_init__()
        self.outbox = Outbox(self)

    @property
    def session(self) -> AsyncSession:
        """An ORM ``AsyncSession`` on :attr:`conn`, in the same transaction: what it
        writes commits with the handler's business keys and the event's completion,
        or rolls back with them. relaybox flushes it when the handler returns; the
        handler does not commit it."""
        return self._bound_session(AsyncSession)

    @property
    def driver(self) -> Any:
        """The database driver's own connection under :attr:`conn`, in the same
        transaction: asyncpg's ``Connection`` on PostgreSQL (``$1`` placeholders),
        aiosqlite's on SQLite (``?``). What it writes commits or rolls back with the
        event, as through :attr:`conn`. A statement here skips SQLAlchemy's layer,
        for handlers on the hot path: ``bench process``'s one-statement handler took
        ~70 µs of CPU less an event (bench/README.md)."""
        sync = self.conn.sync_connection
        if sync is None or sync.closed or sync.invalidated:
            raise RuntimeError("ctx.driver is only available while the handler runs")
        return sync.connection.driver_connection

    async def _flush_session(self) -> None:
        if self._session is not None:
            await self._session.flush()

    async def _close_session(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def once(
        self, business_key: str | None = None, *, fingerprint: str | None = None
    ) -> bool:
        """Record that the operation named by ``business_key`` happens now.

        Returns ``True`` the first time (apply the effect), ``False`` when the
        operation already happened (skip it). The UNIQUE key in the operations table
        decides, so two workers racing on one key cannot both get ``True``. Raises
        :class:`OperationConflict` when the key exists with another ``fingerprint``
        (a different operation is reusing this key). Keys are kept forever.

        Without ``business_key``: the key the handler's registration declares
        (``business_key=``, with its ``fingerprint``), which the worker may have
        claimed already with the group's BEGIN (then no round trip here).
        """
        asked = self._once_asked(business_key, fingerprint)
        if asked is None:
            return True
        business_key, fingerprint = asked
        with tracing.span("relaybox.once") as span:
            created, stored = await self.box.store.inbox.operation_insert(
                self.conn, self._operation(business_key, fingerprint)
            )
            first = self._once_answer(business_key, fingerprint, created, stored)
            span.set_attribute("relaybox.once.first", first)
            return first

    async def project(
        self, resource_key: str, version: str | int | None, state: Any, **options: Any
    ) -> bool:
        """Write ``state`` as ``resource_key``'s current state only if ``version`` is
        newer than the stored one; a stale event is marked superseded and still
        completes (:mod:`relaybox.inbound.projections`)."""
        return await projections.project(self, resource_key, version, state, **options)


class Hooks:
    """Points where tests wait or inject faults (a SIGKILL before or after COMMIT,
    a lost commit answer). Empty, and free, in production."""

    def __init__(self) -> None:
        self.before_commit: list[Callable[[list[int]], Awaitable[None]]] = []
        self.after_commit: list[Callable[[list[int]], Awaitable[None]]] = []

    async def fire(self, name: str, ids: list[int]) -> None:
        for hook in getattr(self, name):
            await hook(ids)
