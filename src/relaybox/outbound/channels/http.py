"""HTTP out: the guarded client every HTTP channel uses, and the plain POST channel.

:class:`HttpClient` makes one POST per attempt through the SSRF guard and connects only
to the addresses the guard checked (:class:`VettedResolver`), never follows redirects,
keeps no cookies between destinations, ignores proxy environment variables and
reads at most the first bytes of the answer. :func:`classify` turns what happened into
a :class:`~relaybox.outbound.channels.base.Result`:

    2xx                              sent
    408, 429, 5xx                    retry (Retry-After honoured within the clamp)
    timeout, connection, DNS error   retry
    SSRF guard refused, invalid URL  blocked (dead now: nothing was sent, and retrying
                                     the same URL is refused the same way)
    410                              gone (the endpoint is disabled)
    3xx                              failed: a redirect is not followed
    other 4xx, 1xx                   failed: the receiver rejected it; retrying won't help

What an attempt records never holds a credential: the value of every header that
carries one (the ``Authorization`` the endpoint's credentials add, and any header named
as a credential, :func:`credential_header`) is written as :data:`REDACTED`, so is a
``Set-Cookie`` of the answer, and a credential value the answer echoes is cut out of
its first bytes. The signature headers are shown: an HMAC or Ed25519 signature of one
body is no key, and signs nothing else.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Collection, Mapping, Sequence
from json.encoder import encode_basestring_ascii as _quoted  # what json.dumps quotes with
from typing import Any, Unpack
from urllib.parse import urlsplit, urlunsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from relaybox import tracing
from relaybox.outbound.channels.base import Channel, ChannelPolicy, Result
from relaybox.outbound.ssrf import Guard, UnsafeDestination, Vetted
from relaybox.retry import parse_retry_after
from relaybox.store.outbox_rows import Delivery
from relaybox.wire import json_as_is

__all__ = [
    "REDACTED",
    "HttpBase",
    "HttpChannel",
    "HttpClient",
    "VettedResolver",
    "classify",
    "credential_header",
    "record_headers",
    "scrub",
]

USER_AGENT = "relaybox-webhooks/1"

REDACTED = "[redacted]"
"""What the attempt log shows instead of a credential."""

CREDENTIAL_WORDS = (
    "auth",
    "token",
    "secret",
    "passw",
    "apikey",
    "api-key",
    "api_key",
    "cookie",
    "session",
    "credential",
)
"""A header whose name holds one of these (any case) carries a credential:
``Authorization``, ``Proxy-Authorization``, ``Cookie``, ``X-Api-Key``,
``X-Auth-Token``, ``Private-Token``, ... Migration 0021 redacted the attempts older
versions stored by the same words."""

SCRUB_MIN = 8
"""Credential values at least this long are cut out of an answer's first bytes (a
shorter value would cut ordinary words out of it)."""


def credential_header(name: str) -> bool:
    """Whether a request header named ``name`` carries a credential by its name
    (:data:`CREDENTIAL_WORDS`)."""
    lower = name.lower()
    return any(word in lower for word in CREDENTIAL_WORDS)


def scrub(snippet: bytes, values: Collection[str], *, cut: bool) -> bytes:
    """``snippet`` (an answer's first bytes) with every credential of ``values`` at
    least :data:`SCRUB_MIN` characters long, and its part after an auth scheme
    (``Bearer <token>``: the token), replaced by :data:`REDACTED`: a receiver that
    echoes the request (httpbin's ``/anything``, a debugging endpoint) would
    otherwise put them in the attempt log. ``cut``: the answer went on past
    ``snippet``, which may end with the start of one; that start goes too (from 4
    bytes on)."""
    secrets: set[bytes] = set()
    for value in values:
        secrets.add(value.encode())
        scheme, _, rest = value.partition(" ")
        if rest and scheme.isalpha():
            secrets.add(rest.encode())
    marker = REDACTED.encode()
    for secret in sorted(secrets, key=len, reverse=True):  # "Bearer t" before "t"
        if len(secret) < SCRUB_MIN:
            continue
        if secret in snippet:
            snippet = snippet.replace(secret, marker)
        if cut:
            # A start of 4 bytes or more in the last len(secret) - 1 bytes (a shorter
            # one tells little, and would cut a snippet's last letters too often).
            at = snippet.find(secret[:4], max(len(snippet) - len(secret) + 1, 0))
            while at != -1:
                if secret.startswith(snippet[at:]):
                    snippet = snippet[:at] + marker
                    break
                at = snippet.find(secret[:4], at + 1)
    return snippet


def classify(
    status: int, retry_after: str | None, snippet: bytes, headers: str | None = None
) -> Result:
    """The outcome of an answer; ``headers``: the attempt log's (:func:`record_headers`)."""
    text = snippet.decode("utf-8", errors="replace")
    if 200 <= status < 300:
        return Result("sent", status_code=status, response=text, headers=headers)
    if status == 410:
        return Result("gone", status_code=status, error="410 Gone", response=text, headers=headers)
    if status in (408, 429) or status >= 500:
        wait = parse_retry_after(retry_after, time.time())
        return Result(
            "retry",
            status_code=status,
            error=f"HTTP {status}",
            response=text,
            retry_after=wait,
            headers=headers,
        )
    if 300 <= status < 400:
        return Result(
            "failed",
            status_code=status,
            error=f"HTTP {status}: redirects are not followed",
            headers=headers,
        )
    return Result(
        "failed", status_code=status, error=f"HTTP {status}", response=text, headers=headers
    )


def _bounded(pairs: Sequence[tuple[str, str]], limit: int) -> str:
    """Header fields in order while their bytes (name, value, ``: `` and CRLF) fit
    ``limit``, as a JSON list of ``[name, value]`` pairs; a field that would pass it
    ends the list. Nearly every attempt's fields are printable ASCII without a quote
    or a backslash, which JSON writes as they are, and fit: joined in C and checked in
    one pass (as the receiver keeps a delivery's headers); any other list takes the
    C string escaper field by field."""
    if not pairs:
        return "[]"
    text = '[["' + '"], ["'.join(map('", "'.join, pairs)) + '"]]'
    quotes = 4 * len(pairs)
    # An ASCII text's length is its bytes; the fields' bytes are the text's less its
    # brackets, quotes and separators (10 a field), and each field counts 4 more (the
    # quotes' number again).
    if json_as_is(text, quotes) and len(text) - 10 * len(pairs) + quotes <= limit:
        return text
    kept: list[str] = []
    size = 0
    for name, value in pairs:
        # Bytes as UTF-8: an ASCII string's length is its size (no encoding per field).
        size += (len(name) if name.isascii() else len(name.encode())) + 4
        size += len(value) if value.isascii() else len(value.encode())
        if size > limit:
            break
        kept.append(f"[{_quoted(name)}, {_quoted(value)}]")
    return "[" + ", ".join(kept) + "]"


def record_headers(
    request: Sequence[tuple[str, str]], response: Sequence[tuple[str, str]], limit: int
) -> str:
    """The attempt log's ``headers``: each side's fields, at most ``limit`` bytes each.
    The text ``json.dumps`` makes of ``{"request": [[name, value], …], "response": …}``,
    written directly: ``json.dumps`` set up an encoder for every attempt (3 of the 6 µs
    this took per delivery, bench/README.md)."""
    return f'{{"request": {_bounded(request, limit)}, "response": {_bounded(response, limit)}}}'


class VettedResolver(AbstractResolver):
    """An aiohttp resolver that answers only with addresses the guard checked, so the
    connection goes where the check said (no DNS rebinding between check and connect).
    An unchecked host fails closed."""

    def __init__(self) -> None:
        self._vetted: dict[str, tuple[str, ...]] = {}

    def vet(self, vetted: Vetted) -> None:
        self._vetted[vetted.host] = vetted.addresses

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        addresses = self._vetted.get(host)
        if not addresses:
            raise OSError(f"{host} was not checked by the SSRF guard")
        return [
            ResolveResult(
                hostname=host,
                host=address,
                port=port,
                family=socket.AF_INET6 if ":" in address else socket.AF_INET,
                proto=0,
                flags=socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
            )
            for address in addresses
        ]

    async def close(self) -> None:
        self._vetted.clear()


WATCH_INTERVAL = 0.05
"""Seconds between two looks of an HttpClient's watch at its attempts' deadlines: an
attempt ends at most this much after its timeout."""


class HttpClient:
    """One aiohttp session (created in the running loop) behind the SSRF guard.

    Attempts are timed by one watch per client, not a timer each: while attempts run,
    a callback every :data:`WATCH_INTERVAL` seconds cancels those past their deadline,
    and :meth:`post` turns that cancellation into a timed-out result (as
    ``asyncio.timeout`` would, which armed and cancelled a loop timer per attempt:
    ~4 % of the dispatcher's CPU, bench/README.md)."""

    def __init__(
        self,
        guard: Guard,
        *,
        connect_timeout: float,
        response_bytes: int,
        headers_bytes: int = 0,
    ) -> None:
        self.guard = guard
        self.response_bytes = response_bytes
        self.headers_bytes = headers_bytes
        self._resolver = VettedResolver()
        self._session: aiohttp.ClientSession | None = None
        # The attempt's total is the watch's; aiohttp times the connecting only (and
        # sets no timer for a pooled connection).
        self._limits = aiohttp.ClientTimeout(total=None, connect=connect_timeout)
        self._deadlines: dict[asyncio.Task[Any], float] = {}  # attempts running
        self._expired: set[asyncio.Task[Any]] = set()  # cancelled by the watch
        self._watch: asyncio.TimerHandle | None = None
        # The session's loop, remembered (asyncio.get_running_loop() and current_task()
        # without a loop are a getpid() system call each on Python 3.11).
        self._loop: asyncio.AbstractEventLoop | None = None

    def _look(self) -> None:
        """The watch: cancel the attempts past their deadline; look again while any run."""
        loop = self._loop
        assert loop is not None
        now = loop.time()
        for task, deadline in self._deadlines.items():
            if deadline <= now and task not in self._expired:
                self._expired.add(task)
                task.cancel()
        self._watch = loop.call_later(WATCH_INTERVAL, self._look) if self._deadlines else None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(resolver=self._resolver, use_dns_cache=False, limit=0)
            self._session = aiohttp.ClientSession(
                connector=connector,
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False,
                auto_decompress=False,
                headers={"User-Agent": USER_AGENT},
            )
        return self._session

    async def post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        seconds: float,
        hidden: Collection[str] | None = None,
        trace_context: bool = True,
    ) -> Result:
        """One POST; the guard's check (DNS included), connecting, sending and reading
        the answer all end within ``seconds`` (give or take :data:`WATCH_INTERVAL`).
        Traced as an HTTP client span (the semantic conventions' ``POST``), whose
        context the request carries as ``traceparent`` unless ``trace_context`` is
        false (an endpoint whose receiver must not see it).

        ``hidden``: the names (as keys of ``headers``) of the headers that carry a
        credential, which the attempt log shows as :data:`REDACTED` (and whose values
        are cut out of the answer's first bytes). ``None``: every name
        :func:`credential_header` flags; a caller that knows its headers says which
        (the webhook channel: none of its own, the endpoint's credentials'
        ``Authorization``)."""
        if hidden is None:
            hidden = [name for name in headers if credential_header(name)]
        if not tracing.enabled():
            return await self._post(url, body, headers, seconds, hidden)
        if not tracing.current_span().is_recording():
            # Not sampled: no span of its own (it would not be sampled either); the
            # request still carries the context, and with it the decision.
            if trace_context:
                headers = dict(headers)
                tracing.inject(headers)
            return await self._post(url, body, headers, seconds, hidden)
        with tracing.span("POST", kind="client", attributes=http_attributes(url)) as span:
            if trace_context:
                headers = dict(headers)
                tracing.inject(headers)
            result = await self._post(url, body, headers, seconds, hidden)
            if span.is_recording():
                span.set_attributes(result_attributes(result))
            return result

    async def _post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        seconds: float,
        hidden: Collection[str],
    ) -> Result:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)
        assert task is not None
        self._deadlines[task] = loop.time() + seconds
        if self._watch is None:
            self._watch = loop.call_later(WATCH_INTERVAL, self._look)
        try:
            try:
                vetted = await self.guard.check(url)
            except UnsafeDestination as exc:
                return Result("blocked", error=f"refused by the SSRF guard: {exc}")
            except OSError as exc:
                return Result("retry", error=f"DNS: {_short(exc)}")
            self._resolver.vet(vetted)
            async with self._open().post(
                vetted.parsed or url,
                data=body,
                headers=headers,
                allow_redirects=False,
                timeout=self._limits,
            ) as response:
                snippet = await response.content.read(self.response_bytes)
                if hidden:
                    values = [headers[name] for name in hidden]
                    cut = len(snippet) == self.response_bytes
                    snippet = scrub(snippet, values, cut=cut)
                kept = None
                if self.headers_bytes:
                    sent = list({"User-Agent": USER_AGENT, **headers}.items())
                    if hidden:
                        sent = [(n, REDACTED if n in hidden else v) for n, v in sent]
                    received = list(response.headers.items())
                    if "Set-Cookie" in response.headers:  # the receiver's session: a credential
                        received = [
                            (n, REDACTED if n.lower() == "set-cookie" else v) for n, v in received
                        ]
                    kept = record_headers(sent, received, self.headers_bytes)
                # The headers go into the result as it is made (no copy of it per attempt).
                return classify(response.status, response.headers.get("Retry-After"), snippet, kept)
        except asyncio.CancelledError:
            if task not in self._expired:
                raise  # not the watch's: the caller is being cancelled
            return Result("retry", error=f"timed out after {seconds:g} s", timed_out=True)
        except TimeoutError:  # aiohttp's connect timeout
            return Result("retry", error=f"timed out after {seconds:g} s", timed_out=True)
        except aiohttp.InvalidURL as exc:  # the same URL fails the same way every time
            return Result("blocked", error=f"invalid URL: {_short(exc)}")
        except aiohttp.ClientConnectorError as exc:
            return Result("retry", error=f"connection failed: {_short(exc)}")
        except (aiohttp.ClientError, OSError) as exc:
            return Result("retry", error=f"{type(exc).__name__}: {_short(exc)}")
        finally:
            del self._deadlines[task]
            if task in self._expired:  # the watch's cancellation is spent here, whatever
                self._expired.discard(task)  # became of it (as asyncio.timeout does)
                task.uncancel()

    async def form_post(
        self,
        url: str,
        fields: Mapping[str, str],
        headers: Mapping[str, str],
        *,
        seconds: float,
        limit: int,
    ) -> tuple[int, bytes]:
        """A form POST through the same guard (an OAuth2 token request): the status and
        the whole answer, within ``seconds``. Raises :class:`UnsafeDestination`,
        ``TimeoutError``, ``OSError``, aiohttp's errors, or ``ValueError`` for an
        answer over ``limit`` bytes."""
        async with asyncio.timeout(seconds):
            vetted = await self.guard.check(url)
            self._resolver.vet(vetted)
            async with self._open().post(
                vetted.parsed or url,
                data=dict(fields),
                headers=headers,
                allow_redirects=False,
                timeout=self._limits,
            ) as response:
                body = bytearray()
                async for chunk in response.content.iter_chunked(8192):
                    body += chunk
                    if len(body) > limit:
                        raise ValueError(f"the answer is over {limit} bytes")
                return response.status, bytes(body)

    async def close(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if self._session is not None:
            await self._session.close()
            self._session = None


def http_attributes(url: str) -> dict[str, str | int]:
    """An HTTP client span's attributes for a POST to ``url`` (the semantic
    conventions'): the URL without its credentials and query, which may carry a
    token; the server's address and port."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        port = 0
    shown = f"{host}:{parts.port}" if parts.port else host
    attributes: dict[str, str | int] = {
        "http.request.method": "POST",
        "url.full": urlunsplit((parts.scheme, shown, parts.path, "", ""))[:2048],
        "server.address": host[:255],
    }
    if port:
        attributes["server.port"] = port
    return attributes


def result_attributes(result: Result) -> dict[str, str | int]:
    """An HTTP client span's attributes for the answer: its status code, and
    ``error.type`` for a failed attempt (the status code, or what went wrong)."""
    attributes: dict[str, str | int] = {"relaybox.result": result.outcome}
    if result.status_code is not None:
        attributes["http.response.status_code"] = result.status_code
    if result.outcome != "sent":
        if result.status_code is not None:
            attributes["error.type"] = str(result.status_code)
        else:
            attributes["error.type"] = "timeout" if result.timed_out else result.outcome
    return attributes


def _short(exc: BaseException) -> str:
    return (str(exc) or type(exc).__name__).splitlines()[0][:300]


class HttpBase(Channel):
    """A channel speaking HTTP through the outbound's guard (one client per channel)."""

    _client: HttpClient | None = None

    def client(self) -> HttpClient:
        if self._client is None:
            assert self.outbound is not None, "register the channel first"
            s = self.outbound.settings
            self._client = HttpClient(
                self.outbound.guard,
                connect_timeout=s.connect_timeout,
                response_bytes=s.response_bytes,
                headers_bytes=s.attempt_headers_bytes,
            )
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()


class HttpChannel(HttpBase):
    """A plain JSON POST with an ``Idempotency-Key`` header (the outbox key, stable
    across attempts), for APIs that deduplicate on it (Stripe-style).

    With ``url`` the payload is the JSON body; without it the payload is
    ``{"url": ..., "body": ...}``. The URL passes the same SSRF guard as webhooks.
    """

    kind = "http"
    bounded = True  # post() times the whole attempt, within delivery.deadline

    def __init__(
        self,
        url: str | None = None,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        **policy: Unpack[ChannelPolicy],
    ) -> None:
        super().__init__(**policy)
        self.url = url
        self.headers = dict(headers or {})
        self.timeout = timeout
        # Names checked once (an operator's Authorization, X-Api-Key, ...): the
        # attempt log shows their values as REDACTED.
        self._hidden = frozenset(name for name in self.headers if credential_header(name))

    async def deliver(self, delivery: Delivery) -> Result:
        payload: Any = delivery.payload
        if self.url is not None:
            url, body = self.url, payload
        elif isinstance(payload, Mapping) and isinstance(payload.get("url"), str):
            url, body = payload["url"], payload.get("body")
        else:
            return Result("failed", error='payload needs "url" (the channel has no url)')
        headers = {
            "Content-Type": "application/json",
            "Idempotency-Key": delivery.key,
            **self.headers,
        }
        assert self.outbound is not None
        timeout = min(self.timeout or self.outbound.settings.timeout, delivery.deadline)
        data = json.dumps(body, separators=(",", ":")).encode()
        result = await self.client().post(url, data, headers, seconds=timeout, hidden=self._hidden)
        if result.outcome == "gone":  # no endpoint to disable: a plain permanent failure
            return Result("failed", status_code=410, error="410 Gone", response=result.response)
        return result
