"""A box under test on SQLite with a frozen clock: deliveries through its receiver
in process, the worker and the dispatcher a step at a time, assertions on what was
stored."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relaybox.app import Relaybox
from relaybox.clock import FrozenClock
from relaybox.config import Settings
from relaybox.store import Store
from relaybox.testing.deliveries import Delivery, signed_delivery

__all__ = ["TEST_START", "Harness", "Response", "make_harness"]

TEST_START = 1_800_000_000.0
"""Where a test's :class:`FrozenClock` starts (2027-01-15T08:00:00Z)."""


@dataclass(frozen=True)
class Response:
    """The receiver's answer."""

    status: int
    body: bytes
    content_type: str

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def outcome(self) -> str | None:
        """``accepted``, ``duplicate``, ``quarantined``, ``ignored`` (or ``None``)."""
        if not self.content_type.startswith("application/json"):
            return None
        answer = self.json()
        return answer.get("status") if isinstance(answer, dict) else None


@dataclass
class Harness:
    """A box under test: deliveries in, worker and dispatcher steps, assertions."""

    box: Relaybox
    clock: FrozenClock
    _worker: Any = field(default=None, repr=False)
    _dispatcher: Any = field(default=None, repr=False)
    _restore: Callable[[], None] | None = field(default=None, repr=False)

    @property
    def store(self) -> Store:
        """The box's store, on the test's database: ``async with kit.store.transaction()
        as conn`` reads (or prepares) the application's own tables."""
        return self.box.store

    @classmethod
    def of(cls, box: Relaybox) -> Harness:
        """A harness around a box the test built itself (its clock must be frozen)."""
        if not isinstance(box.clock, FrozenClock):
            raise TypeError("the box needs a FrozenClock: Relaybox(..., clock=FrozenClock())")
        return cls(box, box.clock)

    # -- deliveries ------------------------------------------------------------------

    def signed(self, source: str, **options: Any) -> Delivery:
        """:func:`signed_delivery` for the box's source named ``source``, at the
        box's clock."""
        found = self.box.sources.get(source)
        if found is None:
            raise KeyError(
                f"no source named {source!r} (configured: {', '.join(self.box.sources)})"
            )
        options.setdefault("now", self.clock.now())
        return signed_delivery(found, **options)

    async def deliver(self, delivery: Delivery, *, method: str = "POST") -> Response:
        """POST ``delivery`` through the box's receiver, in process."""
        return await self.request(
            delivery.url, method=method, headers=delivery.headers, body=delivery.body
        )

    async def send(self, source: str, **options: Any) -> Response:
        """Sign (:meth:`signed`) and deliver; the answer must be a 2xx."""
        response = await self.deliver(self.signed(source, **options))
        if not 200 <= response.status < 300:
            raise AssertionError(f"{source}: {response.status} {response.body!r}")
        return response

    async def request(
        self,
        url: str,
        *,
        method: str = "POST",
        headers: Mapping[str, str] | None = None,
        body: bytes = b"",
    ) -> Response:
        """Any request to the receiver (``url``: ``http://host/webhooks/{source}?...``)."""
        scheme, _, rest = url.partition("://")
        host, _, target = rest.partition("/")
        path, _, query = ("/" + target).partition("?")
        sent_headers = {"host": host, **{k.lower(): v for k, v in (headers or {}).items()}}
        sent_headers["content-length"] = str(len(body))
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": scheme,
            "path": path,
            "raw_path": path.encode(),
            "root_path": "",
            "query_string": query.encode(),
            "headers": [
                (k.encode("latin-1"), v.encode("latin-1")) for k, v in sent_headers.items()
            ],
            "server": ("127.0.0.1", 8000),
        }
        pending = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> MutableMapping[str, Any]:
            if pending:
                return pending.pop()
            await asyncio.Event().wait()  # the receiver never reads past the body
            return {"type": "http.disconnect"}

        messages: list[dict[str, Any]] = []

        async def send(message: MutableMapping[str, Any]) -> None:
            messages.append(dict(message))

        await self.box.receiver(scope, receive, send)
        start, payload = messages[0], messages[1]
        content_type = dict(start["headers"]).get(b"content-type", b"").decode()
        return Response(start["status"], payload.get("body", b""), content_type)

    # -- steps ------------------------------------------------------------------------

    async def run_worker(self) -> int:
        """One worker step: claim the due inbox rows and run their handlers; returns
        how many were claimed."""
        if self._worker is None:
            self._worker = self.box.worker()
        return int(await self._worker.run_once())

    async def drain_worker(self, *, max_steps: int = 100) -> int:
        """Worker steps until nothing is due now; returns the rows processed."""
        return await _drain(self.run_worker, "the worker", max_steps)

    async def run_dispatcher(self) -> int:
        """One dispatcher step: lease due outbox rows and deliver them."""
        if self._dispatcher is None:
            self._dispatcher = self.box.dispatcher()
        return int(await self._dispatcher.run_once())

    async def drain_dispatcher(self, *, max_steps: int = 100) -> int:
        """Dispatcher steps until nothing in the outbox is due now (at the frozen
        clock: a failed attempt's retry waits for :meth:`advance`); returns the rows
        leased."""
        return await _drain(self.run_dispatcher, "the dispatcher", max_steps)

    def advance(self, seconds: float) -> None:
        """Move the frozen clock (retries come due, tolerances pass)."""
        self.clock.advance(seconds)

    # -- what was stored --------------------------------------------------------------

    async def inbox(
        self, source: str | None = None, event_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Inbox rows (one per stored event), oldest first."""
        rows = await self.box.store.operator.testing_inbox(source, event_id)
        for row in rows:
            if row["payload"] is not None:
                row["payload"] = bytes(row["payload"])
        return rows

    async def business_keys(self, prefix: str | None = None) -> list[str]:
        """Business keys recorded by handlers (``ctx.once``)."""
        return [r["business_key"] for r in await self.box.store.operator.testing_operations(prefix)]

    async def outbox(self, channel: str | None = None) -> list[dict[str, Any]]:
        """Outbox rows: outgoing actions and webhook deliveries."""
        rows = await self.box.store.operator.testing_outbox(channel)
        for row in rows:
            if isinstance(row["payload"], str):
                row["payload"] = json.loads(row["payload"])
        return rows

    async def dead_letters(self, source: str | None = None) -> list[dict[str, Any]]:
        """Inbox rows in dead letters."""
        return [r for r in await self.inbox(source) if r["status"] == "dead"]

    async def deliveries(
        self,
        *,
        status: str | None = None,
        message_id: str | None = None,
        tenant: str | None = None,
    ) -> list[dict[str, Any]]:
        """Outbound webhook deliveries (outbox rows of the ``webhook`` channel, one per
        message and endpoint), optionally only those with ``status``, of one published
        message (``message_id``, the ``id`` its receivers see) or of one ``tenant``."""
        rows = await self.outbox("webhook")
        return [
            r
            for r in rows
            if (status is None or r["status"] == status)
            and (message_id is None or r["message_id"] == message_id)
            and (tenant is None or r["tenant"] == tenant)
        ]

    # -- assertions -------------------------------------------------------------------

    async def assert_business_key(self, key: str, *, fingerprint: str | None = None) -> None:
        """``key`` was recorded exactly once (with ``fingerprint``, when given)."""
        found = await self.box.store.operator.testing_operations(key)
        rows = [r for r in found if r["business_key"] == key]
        if len(rows) != 1:
            keys = await self.business_keys()
            raise AssertionError(f"business key {key!r} recorded {len(rows)} times; keys: {keys}")
        if fingerprint is not None and rows[0]["fingerprint"] != fingerprint:
            raise AssertionError(
                f"business key {key!r} has fingerprint {rows[0]['fingerprint']!r},"
                f" not {fingerprint!r}"
            )

    async def assert_no_business_key(self, key: str) -> None:
        if key in await self.business_keys():
            raise AssertionError(f"business key {key!r} was recorded")

    async def assert_outbox(
        self, channel: str, *, key: str | None = None, count: int | None = None
    ) -> list[dict[str, Any]]:
        """Outbox rows of ``channel`` (with ``key``); exactly ``count`` when given, at
        least one otherwise. Returns them."""
        rows = [r for r in await self.outbox(channel) if key is None or r["key"] == key]
        if (count is None and not rows) or (count is not None and len(rows) != count):
            keys = [r["key"] for r in await self.outbox(channel)]
            want = "at least 1" if count is None else str(count)
            raise AssertionError(f"{len(rows)} outbox rows in {channel!r}, want {want}: {keys}")
        return rows

    async def assert_stored(
        self, delivery: Delivery | str, *, source: str | None = None
    ) -> dict[str, Any]:
        """Exactly one inbox row for the delivery (or event id); returns it."""
        event_id = delivery.event_id if isinstance(delivery, Delivery) else delivery
        name = delivery.source if isinstance(delivery, Delivery) else source
        rows = await self.inbox(name, event_id)
        if len(rows) != 1:
            raise AssertionError(f"{len(rows)} inbox rows for event {event_id!r}, want 1")
        return rows[0]

    async def assert_status(self, event_id: str, status: str, *, reason: str | None = None) -> None:
        """The inbox row of ``event_id`` is ``status`` (``done``, ``pending``, ``dead``
        with ``reason``)."""
        rows = await self.inbox(event_id=event_id)
        if len(rows) != 1:
            raise AssertionError(f"{len(rows)} inbox rows for event {event_id!r}, want 1")
        row = rows[0]
        if row["status"] != status or (reason is not None and row["dead_reason"] != reason):
            raise AssertionError(
                f"event {event_id!r} is {row['status']!r} ({row['dead_reason']!r},"
                f" {row['last_error']!r}), want {status!r} ({reason!r})"
            )

    async def assert_dead(self, event_id: str, reason: str | None = None) -> None:
        await self.assert_status(event_id, "dead", reason=reason)

    async def close(self) -> None:
        """Close the box (and its test database); an application's box that the
        harness borrowed gets its own database URL, clock and sources back."""
        if self._dispatcher is not None:
            await self._dispatcher.close()
            self._dispatcher = None
        self._worker = None
        await self.box.close()
        if self._restore is not None:
            self._restore()
            self._restore = None


async def _drain(step: Callable[[], Awaitable[int]], what: str, max_steps: int) -> int:
    """``step`` until it finds nothing due; the rows it took in all."""
    total = 0
    for _ in range(max_steps):
        count = await step()
        if count == 0:
            return total
        total += count
    raise AssertionError(f"{what} still had due rows after {max_steps} steps")


Configure = Callable[[Relaybox], Any]
Setup = Callable[[Relaybox], Awaitable[Any]]


async def make_harness(
    directory: Path,
    target: Relaybox | Configure | None = None,
    *,
    setup: Setup | None = None,
    inline: bool = False,
    start: float = TEST_START,
    settings: Settings | None = None,
    name: str = "relaybox",
) -> Harness:
    """A migrated box on a new SQLite file in ``directory``, with a
    :class:`FrozenClock` at ``start``.

    ``target`` is the application's own :class:`Relaybox` (its sources and handlers
    as registered, its settings but for the database) or a ``configure(box)``
    function that registers them on a new box. The application's box is *borrowed*:
    until :meth:`Harness.close` it works on the test database with the frozen clock
    (so code that refers to it, such as ``box.publish`` in a handler, does too), and
    then gets its own back. The box's :meth:`~relaybox.Relaybox.on_ready` functions
    run after relaybox's migrations, as at the app's startup; ``await setup(box)``
    then does what else the test needs.
    ``inline`` runs handlers in the accept's transaction (no worker step needed)."""
    url = f"sqlite:///{directory / f'{name}-{uuid.uuid4().hex[:8]}.db'}"
    clock = FrozenClock(start)
    restore: Callable[[], None] | None = None
    if isinstance(target, Relaybox):
        box = target
        restore = await _borrow(box, url, clock, settings)
    else:
        settings = (settings or Settings()).model_copy(update={"database_url": url})
        box = Relaybox(settings=settings, clock=clock)
        if target is not None:
            target(box)
    try:
        await box.migrate()
        await box.run_on_ready()
        if setup is not None:
            await setup(box)
    except BaseException:
        await box.close()
        if restore is not None:
            restore()
        raise
    if inline:
        for source in box.sources.values():
            source.inline = True
    return Harness(box, clock, _restore=restore)


async def _borrow(
    box: Relaybox, url: str, clock: FrozenClock, settings: Settings | None
) -> Callable[[], None]:
    """Point the application's ``box`` at the test database and clock; returns what
    gives it its own back."""
    if box.started:
        raise RuntimeError(
            "the box is running (its lifespan or box.start()): the harness steps the worker"
            " and the dispatcher itself; give it the box before the app starts"
        )
    await box.close()  # a connection the app opened stays on its own database
    saved_settings, saved_clock = box.settings, box.clock
    saved_inline = {name: source.inline for name, source in box.sources.items()}
    box.settings = (settings or box.settings).model_copy(update={"database_url": url})
    box.clock = clock

    def restore() -> None:
        box.settings, box.clock = saved_settings, saved_clock
        for name, source in box.sources.items():
            if name in saved_inline:
                source.inline = saved_inline[name]

    return restore
