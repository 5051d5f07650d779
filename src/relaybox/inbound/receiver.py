"""The receiving endpoint: ``POST /{source}`` → limits → verify → tenant → inbox → 2xx.

A plain ASGI app (mount it anywhere: ``app.mount("/webhooks", box.receiver)``).
Every answer is a small JSON document; no request ever gets a traceback, and no
2xx is sent before the COMMIT that holds the delivery:

    401 bad or missing signature, too many signature entries, timestamp outside tolerance
    400 malformed headers or JSON (or nested too deep), missing event id, an id, type,
        account or version no database can store (NUL, unpaired surrogate, too long)
    404 unknown source          405 not POST          413 body over the limit
    503 database unreachable or commit outcome uncertain (the sender retries), or an
        unexpected error in a source's code (logged with its traceback, never sent)
    200 accepted | duplicate | quarantined | ignored
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import structlog

from relaybox import tracing
from relaybox.errors import (
    TABLES_MISSING,
    PayloadTooLarge,
    RejectedDelivery,
    StoreUnavailable,
    tables_missing,
)
from relaybox.log import debug_enabled, short_error
from relaybox.sources.hooks import URL_HEADER, Answer
from relaybox.sources.requests import handshake, request_url, send_answer
from relaybox.store import NewDelivery
from relaybox.wire import json_as_is

if TYPE_CHECKING:
    from starlette.types import Receive, Scope, Send

    from relaybox.inbound.registry import Inbound
    from relaybox.runtime import ReceiverRuntime
    from relaybox.sources.base import Source

__all__ = ["Receiver", "Reply"]

Reply = tuple[int, "dict[str, Any] | Answer", list[tuple[bytes, bytes]]]
"""An answer: status, JSON body (or a source's own :class:`Answer`), extra headers."""

log = structlog.get_logger("relaybox.receiver")

_ROUTES_KEPT = 1024
"""Paths the receiver remembers the source name of (:meth:`Receiver.open`)."""

# Not kept with the delivery: credentials of the hop, not part of the provider's message.
_DROP_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})


class Receiver:
    """ASGI app answering ``POST /{source}`` relative to where it is mounted, for the
    sources of ``inbound``, storing through its acceptor (or inline acceptance)."""

    def __init__(self, box: ReceiverRuntime, inbound: Inbound) -> None:
        self.box = box
        self.inbound = inbound
        self._verify_pool: ThreadPoolExecutor | None = None
        # (root path, path) -> source name, for paths naming a registered source: the
        # same few paths come again and again (~30 of a request's Python opcodes).
        # Paths naming no source are not kept, so a client cannot grow it.
        self._names: dict[tuple[str, str], str] = {}

    def _verifier(self) -> ThreadPoolExecutor:
        """Threads for the verifications a source offloads. Two at a time: Ed25519
        holds the GIL while it hashes, so more threads would only take turns with the
        event loop more often; the requests beyond wait their turn without blocking."""
        if self._verify_pool is None:
            self._verify_pool = ThreadPoolExecutor(2, thread_name_prefix="relaybox-verify")
        return self._verify_pool

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # the receiver is the whole app
            await _lifespan(self.box, receive, send)
            return
        if scope["type"] != "http":
            return
        started = time.perf_counter()
        status, body, extra = await self._handle(scope, receive)
        if isinstance(body, Answer):
            await send_answer(send, body)
        else:
            await _send_json(send, status, body, extra)
        self.box.metrics.observe_accept(status, time.perf_counter() - started)

    async def _handle(self, scope: Scope, receive: Receive) -> Reply:
        source, headers, early = self.open(scope)
        if early is not None:
            return early
        assert source is not None
        try:
            body = await _read_body(receive, headers, source.max_body)
        except RejectedDelivery as exc:
            log.info("delivery_rejected", source=source.name, status=exc.status, reason=exc.code)
            return rejected(exc)
        return await self.answer(source, scope, headers, body)

    def open(self, scope: Scope) -> tuple[Source | None, dict[str, str], Reply | None]:
        """What a request's line and headers decide before its body is read: the
        source, the headers, and the answer if it is already known (unknown source,
        not POST, a GET handshake, a declared length over the source's limit). A
        host framework reading the body itself (the Django view) calls this, reads
        at most ``source.max_body`` bytes, then :meth:`answer`."""
        route = (scope.get("root_path", ""), scope.get("path", ""))
        name = self._names.get(route)
        if name is not None:
            source = self.inbound.sources.get(name)
        else:
            name = _source_name(scope)
            source = self.inbound.sources.get(name) if name else None
            if source is not None and name is not None and len(self._names) < _ROUTES_KEPT:
                self._names[route] = name
        if source is None:
            return None, {}, (404, _error("unknown_source", f"no source named {name!r}"), [])
        headers = _headers(scope)
        try:
            if scope["method"] != "POST":
                answer = handshake(source, scope, headers, b"")
                if answer is not None:
                    return source, headers, (answer.status, answer, [])
                reply: Reply = (
                    405,
                    _error("method_not_allowed", "use POST"),
                    [(b"allow", b"POST")],
                )
                return source, headers, reply
            check_length(headers, source.max_body)
        except RejectedDelivery as exc:
            log.info("delivery_rejected", source=name, status=exc.status, reason=exc.code)
            return source, headers, (exc.status, _error(exc.code, exc.message), [])
        except Exception as exc:  # a bug in a source's handshake: no traceback, no 2xx
            log.exception("verify_failed", source=name, error=type(exc).__name__)
            return source, headers, _internal()
        return source, headers, None

    async def answer(
        self, source: Source, scope: Scope, headers: dict[str, str], body: bytes
    ) -> Reply:
        """Verify, accept and answer a POST whose body is read: the answer is sent
        only after the COMMIT that holds the delivery. Traced as ``relaybox.receive``
        (a child of the ``traceparent`` the sender sent, if any), with the
        verification and the accept's commit as its children."""
        if not tracing.enabled():  # one call, no span objects: the accept's hot path
            return await self._answer(source, scope, headers, body, tracing.NO_SPAN)
        with tracing.span(
            "relaybox.receive",
            kind="server",
            headers=headers,
            attributes={"relaybox.source": source.name, "http.request.method": "POST"},
        ) as span:
            reply = await self._answer(source, scope, headers, body, span)
            span.set_attribute("http.response.status_code", reply[0])
            return reply

    async def _answer(
        self, source: Source, scope: Scope, headers: dict[str, str], body: bytes, span: Any
    ) -> Reply:
        name = source.name
        try:
            answer = handshake(source, scope, headers, body)
            if answer is not None:
                return answer.status, answer, []
            if source.signs_url:
                headers[URL_HEADER] = request_url(scope, headers)
            now = self.box.clock.now()
            if source.may_offload and source.offload(headers, body):
                # Public-key checks on a large body: in a thread, so that the loop
                # keeps answering other requests meanwhile.
                with tracing.child(span, "relaybox.verify", {"relaybox.offloaded": True}):
                    verified = await asyncio.get_running_loop().run_in_executor(
                        self._verifier(), functools.partial(source.verify, headers, body, now)
                    )
            elif not span.is_recording():  # off, or not sampled
                verified = source.verify(headers, body, now)
            else:
                with tracing.span("relaybox.verify"):
                    verified = source.verify(headers, body, now)
            answer = source.challenge(verified)
        except RejectedDelivery as exc:
            log.info("delivery_rejected", source=name, status=exc.status, reason=exc.code)
            return exc.status, _error(exc.code, exc.message), []
        except Exception as exc:  # a bug in a source: no traceback, no 2xx; retried
            log.exception("verify_failed", source=name, error=type(exc).__name__)
            return _internal()
        if answer is not None:
            return answer.status, answer, []

        delivery = NewDelivery(
            source=verified.source,
            account=verified.account,
            event_id=verified.event_id,
            event_type=verified.event_type,
            tenant=verified.tenant,
            fingerprint=verified.fingerprint,
            payload=body,
            headers=_headers_json(headers),
            version=verified.version,
            received_at=self.box.clock.now(),
            ignored=source.ignores(verified.event_type),
            subject=verified.subject,
            # The sender's traceparent, else this request's span (None untraced).
            traceparent=None if span is tracing.NO_SPAN else tracing.traceparent(headers),
        )
        if span.is_recording():
            span.set_attributes(_span_keys(delivery))
        inline = source.inline and not delivery.ignored
        try:
            if not span.is_recording():  # off, or not sampled: no span object
                outcome = await (
                    self.inbound.accept_inline(delivery)
                    if inline
                    else self.inbound.acceptor.accept(delivery)
                )
            else:
                with tracing.span("relaybox.accept") as accepting:
                    outcome = await (
                        self.inbound.accept_inline(delivery)
                        if inline
                        else self.inbound.acceptor.accept(delivery)
                    )
                    accepting.set_attributes(
                        {
                            "relaybox.accept.status": outcome.status,
                            "relaybox.inbox_id": outcome.inbox_id,
                        }
                    )
                span.set_attribute("relaybox.accept.status", outcome.status)
        except StoreUnavailable as exc:
            _key_log(delivery).warning("delivery_not_committed", error=str(exc))
            return 503, _error("unavailable", str(exc)), [(b"retry-after", b"5")]
        except Exception as exc:  # a bug must still not leak a traceback or ack
            if tables_missing(exc):  # inline mode on a database never migrated
                log.error("relaybox_tables_missing", hint=TABLES_MISSING)
                return 503, _error("unavailable", TABLES_MISSING), [(b"retry-after", b"5")]
            _key_log(delivery).exception("delivery_failed", error=type(exc).__name__)
            return (
                503,
                _error("unavailable", "the delivery was not stored"),
                [(b"retry-after", b"5")],
            )
        if debug_enabled():
            # One line per delivery would cost more than the accept itself at thousands
            # per second: debug only. Rejections, errors and processing outcomes log at
            # info and above.
            _key_log(delivery).debug("delivery_" + outcome.status, inbox_id=outcome.inbox_id)
        if outcome.status == "quarantined":
            try:
                await self._announce_quarantine(delivery, outcome.inbox_id)
            except Exception as exc:  # the quarantine is committed: still acknowledged
                _key_log(delivery).error("operational_event_failed", error=short_error(exc))
        answer = source.acknowledge(verified, outcome.status)
        if answer is not None:
            return answer.status, answer, []
        return 200, {"status": outcome.status, "event_id": delivery.event_id}, []

    async def _announce_quarantine(self, delivery: NewDelivery, inbox_id: int) -> None:
        """``relaybox.inbox.quarantined``, in a transaction of its own right after the
        accept (whose statement runs alone); once per conflicting content, as the
        sender may repeat it."""
        data = {
            "inboxId": inbox_id,
            "source": delivery.source,
            "account": delivery.account,
            "eventId": delivery.event_id,
            "eventType": delivery.event_type,
            "tenant": delivery.tenant,
            "receivedAt": delivery.received_at,
        }
        key = f"inbox.quarantined:{inbox_id}:{delivery.fingerprint.hex()}"
        async with self.box.store.transaction() as conn:
            await self.inbound.announce(conn, "relaybox.inbox.quarantined", data, key=key)


async def _lifespan(box: ReceiverRuntime, receive: Receive, send: Send) -> None:
    """ASGI lifespan of the bare receiver served as the whole app: the schema checked
    (or migrated, ``migrate = "auto"``) and the accept connections opened at startup,
    everything closed at shutdown. No background role starts here: the worker runs
    in ``relaybox worker``, or use ``box.lifespan`` in an app of your own."""
    running = box.running(roles=())
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            try:
                await running.__aenter__()
            except Exception as exc:
                await send({"type": "lifespan.startup.failed", "message": str(exc)})
                return
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await running.__aexit__(None, None, None)
            await send({"type": "lifespan.shutdown.complete"})
            return


def _headers_json(headers: dict[str, str]) -> str:
    """The headers kept with the delivery, as JSON (the credentials of the hop left
    out): the text ``json.dumps`` writes for a dict of strings. Nearly every request's
    names and values are printable ASCII without a quote or a backslash, which JSON
    writes as they are: joined in C (``str.join`` over the items) and checked in one
    pass, ~1.1 µs a request where escaping each name and value took ~1.7. Any other
    request's headers take the C string escaper for each."""
    if not _DROP_HEADERS.isdisjoint(headers):
        headers = {k: v for k, v in headers.items() if k not in _DROP_HEADERS}
    text = '{"' + '", "'.join(map('": "'.join, headers.items())) + '"}'
    if json_as_is(text, 4 * len(headers)):
        return text
    return (
        "{"
        + ", ".join([_json_string(k) + ": " + _json_string(v) for k, v in headers.items()])
        + "}"
    )


_json_string = json.encoder.encode_basestring_ascii


def _span_keys(delivery: NewDelivery) -> dict[str, str | bool]:
    """A delivery's keys as span attributes (each bounded by the accept's checks; no
    payload, no header)."""
    keys: dict[str, str | bool] = {
        "relaybox.source": delivery.source,
        "relaybox.event_id": delivery.event_id,
        "relaybox.event_type": delivery.event_type,
        "relaybox.ignored": delivery.ignored,
    }
    if delivery.account:
        keys["relaybox.account"] = delivery.account
    if delivery.tenant is not None:
        keys["relaybox.tenant"] = delivery.tenant
    return keys


def _key_log(delivery: NewDelivery) -> Any:
    return log.bind(
        source=delivery.source,
        account=delivery.account,
        event_id=delivery.event_id,
        event_type=delivery.event_type,
    )


def _source_name(scope: Scope) -> str | None:
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    name = path.strip("/")
    if name.startswith("webhooks/"):  # served at the top level: /webhooks/{source}
        name = name[len("webhooks/") :]
    return name if name and "/" not in name else None


def _headers(scope: Scope) -> dict[str, str]:
    """The request's headers by lower-case name; a name sent more than once has its
    values joined with commas, in order."""
    raw = scope["headers"]
    headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in raw}
    if len(headers) == len(raw):
        return headers  # no name repeated: the common case, one comprehension
    headers = {}
    for raw_name, raw_value in raw:
        name = raw_name.decode("latin-1").lower()
        value = raw_value.decode("latin-1")
        headers[name] = f"{headers[name]},{value}" if name in headers else value
    return headers


def check_length(headers: dict[str, str], limit: int) -> None:
    """Refuse a declared ``content-length`` that is not a number (400) or is over
    ``limit`` (413)."""
    declared = headers.get("content-length")
    if declared is not None:
        if not (declared.isascii() and declared.isdigit()):
            raise RejectedDelivery("content-length is not a number", code="malformed_headers")
        # Up to 18 digits is a cheap int(). Longer, without its leading zeros: more
        # digits than the limit has are over it (no int() of an endless number).
        if len(declared) > 18:
            declared = declared.lstrip("0") or "0"
            if len(declared) > len(str(limit)):
                raise over_limit(limit)
        if int(declared) > limit:
            raise over_limit(limit)


def over_limit(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"body is over the limit of {limit} bytes")


def rejected(exc: RejectedDelivery) -> Reply:
    """The answer to a delivery refused while its body was read."""
    return exc.status, _error(exc.code, exc.message), []


def _internal() -> Reply:
    return (
        503,
        _error("internal_error", "the delivery could not be verified"),
        [(b"retry-after", b"5")],
    )


async def _read_body(receive: Any, headers: dict[str, str], limit: int) -> bytes:
    """Read the body, refusing it as soon as it is known to exceed ``limit`` (the
    declared length was checked by :meth:`Receiver.open`)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise RejectedDelivery("client disconnected", code="disconnected")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise over_limit(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _error(code: str, message: str) -> dict[str, Any]:
    return {"error": code, "message": message}


async def _send_json(
    send: Any, status: int, body: dict[str, Any], extra: list[tuple[bytes, bytes]]
) -> None:
    if (
        status == 200
        and len(body) == 2
        and type(body.get("status")) is str
        and type(body.get("event_id")) is str
    ):
        # The 2xx of every accepted delivery, written as json.dumps writes it: the
        # same bytes, without the encoder's general path (~1.5 µs a request).
        payload = b'{"status": %s, "event_id": %s}' % (
            _json_string(body["status"]).encode(),
            _json_string(body["event_id"]).encode(),
        )
    else:
        payload = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                *extra,
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
