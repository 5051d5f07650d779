"""Endpoint headers and credentials: what a tenant may set, how they are stored, and
how the webhook channel applies them to an attempt.

* **Headers**: custom request headers per endpoint. A name is an HTTP token; a value
  holds no CR, LF, NUL or other control character but tab; hop-by-hop headers,
  ``Host``, ``Content-Length``, ``Content-Type``, ``Authorization`` (set credentials
  instead: they are sealed) and the signature headers (``webhook-*``,
  ``X-Webhook-Signature``) are refused; their count and total size are bounded by
  ``outbound.max_endpoint_headers`` and ``outbound.max_endpoint_headers_bytes``.
* **Credentials**: HTTP Basic, a bearer token, or OAuth2 client credentials (RFC 6749
  section 4.4: the token is fetched from ``token_url`` through the SSRF guard, kept
  until ``expires_in`` minus ``outbound.oauth2_token_margin``, fetched again after
  that or once when the endpoint answers 401; a failed fetch is a failed attempt,
  retried on the schedule like a 5xx, but a ``token_url`` the SSRF guard refuses
  (an address it forbids, a URL it cannot read) is dead at once as ``blocked``, like
  the endpoint's own URL). Stored as JSON sealed by the vault like the signing
  secrets, and never shown again: answers say only which kind is set, and the
  attempt log shows the ``Authorization`` they add (and any custom header named as a
  credential) as ``[redacted]``.

Endpoints with neither pay nothing: the lease leaves their :class:`Target` without
them, and the channel checks two attributes.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar
from urllib.parse import quote_plus

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, TypeAdapter, field_validator

from relaybox.outbound.channels.base import Result
from relaybox.outbound.channels.http import credential_header
from relaybox.outbound.ssrf import UnsafeDestination

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

    from relaybox.config.outbound import OutboundSettings
    from relaybox.outbound.channels.http import HttpClient
    from relaybox.outbound.registry import Outbound
    from relaybox.outbound.vault import Vault
    from relaybox.runtime import Runtime
    from relaybox.store.outbox_rows import Target

__all__ = [
    "BasicCredentials",
    "BearerCredentials",
    "CredentialsSpec",
    "InvalidHeaders",
    "NoCredentials",
    "OAuth2Credentials",
    "TokenCache",
    "check_headers",
    "count_states",
    "credentials_at_rest",
    "each_page",
    "parse_credentials",
    "reseal_credentials",
    "reseal_pages",
]

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}")
"""An HTTP header name (RFC 9110 token), at most 100 characters."""

_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
"""Characters no header value may hold: CR, LF, NUL and the other controls but tab."""

FORBIDDEN_HEADERS = frozenset(
    {
        # hop-by-hop (RFC 9110 section 7.6.1) and framing: the client's to set
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "content-type",
        # credentials are sealed; a header would store them in plain text
        "authorization",
        # the signature relaybox computes
        "x-webhook-signature",
    }
)


class InvalidHeaders(ValueError):
    """Headers relaybox refuses (the message says which and why)."""


def check_headers(headers: dict[str, str], settings: OutboundSettings) -> None:
    """Refuse headers that are malformed, reserved, too many or too large."""
    if len(headers) > settings.max_endpoint_headers:
        raise InvalidHeaders(
            f"an endpoint has at most {settings.max_endpoint_headers} custom headers"
            f" ({len(headers)} given)"
        )
    seen: set[str] = set()
    size = 0
    for name, value in headers.items():
        lower = name.lower()
        if not _TOKEN.fullmatch(name):
            raise InvalidHeaders(
                f"header name {name[:100]!r} is not an HTTP token (letters, digits and"
                " !#$%&'*+.^_`|~- only, at most 100 characters)"
            )
        if lower in FORBIDDEN_HEADERS or lower.startswith("webhook-"):
            why = "set credentials instead" if lower == "authorization" else "relaybox sets it"
            raise InvalidHeaders(f"header {name!r} may not be set ({why})")
        if lower in seen:
            raise InvalidHeaders(f"header {name!r} is given twice")
        seen.add(lower)
        if _CONTROL.search(value):
            raise InvalidHeaders(
                f"header {name!r}: the value holds a control character (CR, LF, NUL, ...)"
            )
        size += len(name.encode()) + len(value.encode())
    if size > settings.max_endpoint_headers_bytes:
        raise InvalidHeaders(
            f"custom headers total {size} bytes, more than the"
            f" {settings.max_endpoint_headers_bytes} allowed"
        )


def _no_controls(value: str) -> str:
    if _CONTROL.search(value):
        raise ValueError("holds a control character (CR, LF, NUL, ...)")
    return value


_Text = Annotated[str, AfterValidator(_no_controls)]
"""Text sent in a header: no control characters."""


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class NoCredentials(_Spec):
    """Remove the endpoint's credentials."""

    type: Literal["none"]


class BasicCredentials(_Spec):
    """HTTP Basic (RFC 7617): ``Authorization: Basic base64(username:password)``."""

    type: Literal["basic"]
    username: str = Field(min_length=1, max_length=256)
    password: _Text = Field(max_length=1024)

    @field_validator("username")
    @classmethod
    def _username(cls, value: str) -> str:
        if ":" in value:
            raise ValueError("a Basic username may not contain ':'")
        return _no_controls(value)


class BearerCredentials(_Spec):
    """A static token: ``Authorization: Bearer <token>``."""

    type: Literal["bearer"]
    token: _Text = Field(min_length=1, max_length=4096)


class OAuth2Credentials(_Spec):
    """OAuth2 client credentials: a token from ``token_url``, sent as a bearer token."""

    type: Literal["oauth2"]
    token_url: str = Field(min_length=1, max_length=2000)
    client_id: _Text = Field(min_length=1, max_length=1024)
    client_secret: _Text = Field(min_length=1, max_length=4096)
    scope: _Text | None = Field(None, max_length=1024)


CredentialsSpec = Annotated[
    NoCredentials | BasicCredentials | BearerCredentials | OAuth2Credentials,
    Field(discriminator="type"),
]
"""What the API, the CLI and :func:`~relaybox.outbound.endpoints.create_endpoint` take
as ``credentials`` (``{"type": "none"}`` removes them)."""

_Stored = BasicCredentials | BearerCredentials | OAuth2Credentials
_ADAPTER: TypeAdapter[_Stored] = TypeAdapter(Annotated[_Stored, Field(discriminator="type")])


def parse_credentials(text: str) -> _Stored:
    """Stored credentials (opened JSON text) as their model."""
    return _ADAPTER.validate_json(text)


def _basic(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


NO_EXPIRY_TTL = 3600.0
"""Seconds a token whose answer has no ``expires_in`` is kept (a 401 drops it sooner)."""

_MAX_CACHED = 10_000


class TokenCache:
    """OAuth2 tokens of one channel, per endpoint and credentials: kept until their
    expiry minus the margin, one fetch at a time per endpoint (concurrent attempts
    wait for it)."""

    def __init__(self, outbound: Outbound) -> None:
        self.outbound = outbound
        self._tokens: dict[tuple[str, str], tuple[str, float]] = {}
        self._fetching: dict[tuple[str, str], asyncio.Future[str | Result]] = {}

    @staticmethod
    def key(endpoint_id: str, credentials: str) -> tuple[str, str]:
        return endpoint_id, hashlib.sha256(credentials.encode()).hexdigest()

    def drop(self, key: tuple[str, str], token: str) -> None:
        """Forget ``token`` (the endpoint refused it), unless a newer one replaced it."""
        kept = self._tokens.get(key)
        if kept is not None and kept[0] == token:
            del self._tokens[key]

    async def token(
        self, key: tuple[str, str], spec: OAuth2Credentials, client: HttpClient, *, seconds: float
    ) -> str | Result:
        """A valid token, or the ``retry`` result of a failed fetch."""
        now = self.outbound.box.clock.now()
        kept = self._tokens.get(key)
        if kept is not None and kept[1] > now:
            return kept[0]
        pending = self._fetching.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._fetch(key, spec, client, seconds))
            self._fetching[key] = pending
            pending.add_done_callback(lambda _: self._fetching.pop(key, None))
        try:
            async with asyncio.timeout(seconds):
                return await asyncio.shield(pending)
        except TimeoutError:
            return Result("retry", error=f"OAuth2 token: no answer within {seconds:g} s")

    async def _fetch(
        self, key: tuple[str, str], spec: OAuth2Credentials, client: HttpClient, seconds: float
    ) -> str | Result:
        settings = self.outbound.settings
        fields = {"grant_type": "client_credentials"}
        if spec.scope:
            fields["scope"] = spec.scope
        # client_secret_basic (RFC 6749 section 2.3.1): every server must take it.
        headers = {
            "Authorization": _basic(_form(spec.client_id), _form(spec.client_secret)),
            "Accept": "application/json",
        }
        try:
            status, body = await client.form_post(
                spec.token_url,
                fields,
                headers,
                seconds=seconds,
                limit=settings.oauth2_token_bytes,
            )
        except UnsafeDestination as exc:  # as for the endpoint's own URL: dead now, nothing
            # was sent, and every retry would be refused the same way
            return Result("blocked", error=f"OAuth2 token: refused by the SSRF guard: {exc}")
        except TimeoutError:
            return Result("retry", error=f"OAuth2 token: no answer within {seconds:g} s")
        except Exception as exc:  # DNS, connection, protocol: a transient failure
            text = (str(exc) or type(exc).__name__).splitlines()[0][:200]
            return Result("retry", error=f"OAuth2 token: {text}")
        if status != 200:
            return Result("retry", error=f"OAuth2 token: HTTP {status} from the token URL")
        try:
            answer: Any = json.loads(body)
            token = answer["access_token"]
            expires_in = answer.get("expires_in")
            kind = str(answer.get("token_type") or "bearer")
        except (ValueError, KeyError, TypeError, AttributeError):
            return Result("retry", error="OAuth2 token: the answer has no access_token")
        if not isinstance(token, str) or not token or _CONTROL.search(token):
            return Result("retry", error="OAuth2 token: the access_token is not usable text")
        if kind.lower() != "bearer":
            return Result("retry", error=f"OAuth2 token: token_type {kind[:40]!r}, not bearer")
        ttl = NO_EXPIRY_TTL
        if isinstance(expires_in, int | float) and not isinstance(expires_in, bool):
            ttl = float(expires_in)
        until = self.outbound.box.clock.now() + ttl - settings.oauth2_token_margin
        if len(self._tokens) >= _MAX_CACHED:
            self._tokens.pop(next(iter(self._tokens)))
        self._tokens[key] = (token, until)
        return token


def _form(value: str) -> str:
    """A client id or secret as client_secret_basic encodes it (RFC 6749 appendix B)."""
    return quote_plus(value)


async def authorized_post(
    cache: TokenCache,
    client: HttpClient,
    endpoint: Target,
    body: bytes,
    headers: dict[str, str],
    *,
    seconds: float,
) -> Result:
    """One attempt to an endpoint with custom headers or credentials: the headers
    first (the signature headers win), then the credentials' ``Authorization``. With
    OAuth2, a 401 drops the token and the attempt is made once more with a new one,
    within the same time.

    The attempt log shows the value of the ``Authorization`` the credentials add,
    and of every custom header named as a credential (``X-Api-Key``, ``Cookie``, ...:
    :func:`~relaybox.outbound.channels.http.credential_header`), as ``[redacted]``."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    sent = {**dict(endpoint.headers), **headers}
    hidden = {name for name, _ in endpoint.headers if credential_header(name)}

    async def once() -> Result:  # with the headers as they are set then
        return await client.post(
            endpoint.url,
            body,
            sent,
            seconds=seconds,
            hidden=hidden,
            trace_context=endpoint.trace_context,
        )

    if endpoint.credentials is None:
        return await once()
    hidden.add("Authorization")
    spec = parse_credentials(endpoint.credentials)
    if isinstance(spec, BasicCredentials):
        sent["Authorization"] = _basic(spec.username, spec.password)
        return await once()
    if isinstance(spec, BearerCredentials):
        sent["Authorization"] = f"Bearer {spec.token}"
        return await once()
    key = cache.key(endpoint.id, endpoint.credentials)
    result: Result | None = None
    for _ in range(2):  # a 401: once more with a fresh token
        left = end - loop.time()
        if left <= 0:
            break
        token = await cache.token(key, spec, client, seconds=left)
        if isinstance(token, Result):
            return token
        sent["Authorization"] = f"Bearer {token}"
        left = end - loop.time()
        if left <= 0:
            break
        result = await client.post(endpoint.url, body, sent, seconds=left, hidden=hidden)
        if result.status_code != 401:
            return result
        cache.drop(key, token)
    return result or Result("retry", error=f"timed out after {seconds:g} s", timed_out=True)


_PAGE = 500
"""Credentials read and sealed per transaction by the sealing passes."""


K = TypeVar("K", int, str)
Stored = list[tuple[K, str]]
"""A page of (key, stored secret) pairs, ordered by key."""


async def each_page(
    box: Runtime,
    read: Callable[[AsyncConnection, K], Awaitable[Stored[K]]],
    size: int,
    after: K,
    visit: Callable[[AsyncConnection, Stored[K]], Awaitable[None]] | None = None,
) -> int:
    """Every pair ``read`` gives after the key ``after``, a page (``size`` at most)
    per transaction, handed to ``visit`` with that transaction's connection. Returns
    how many pairs were read."""
    seen = 0
    while True:
        async with box.store.transaction() as conn:
            page = await read(conn, after)
            if visit is not None:
                await visit(conn, page)
        seen += len(page)
        if len(page) < size:
            return seen
        after = page[-1][0]


async def reseal_pages(
    box: Runtime,
    vault: Vault,
    read: Callable[[AsyncConnection, K], Awaitable[Stored[K]]],
    swap: Callable[[AsyncConnection, K, str, str], Awaitable[bool]],
    size: int,
    after: K,
) -> tuple[int, int]:
    """Seal stored secrets with the vault's first key, a page per transaction
    (:func:`each_page`); ``swap`` replaces one if it is still the one read
    (compare-and-set, so several processes may run at once). Returns (sealed now,
    read)."""
    sealed = 0

    async def reseal(conn: AsyncConnection, page: Stored[K]) -> None:
        nonlocal sealed
        for key, stored in page:
            again = vault.reseal(stored)
            if again is not None and await swap(conn, key, stored, again):
                sealed += 1

    seen = await each_page(box, read, size, after, reseal)
    return sealed, seen


def count_states(
    vault: Vault, counts: dict[str, int]
) -> Callable[[AsyncConnection, Stored[Any]], Awaitable[None]]:
    """A visitor for :func:`each_page` that adds each stored secret to ``counts`` by
    :meth:`Vault.state`."""

    async def count(conn: AsyncConnection, page: Stored[Any]) -> None:
        for _, stored in page:
            counts[vault.state(stored)] += 1

    return count


def _credentials(box: Runtime) -> Callable[[AsyncConnection, str], Awaitable[Stored[str]]]:
    """Reads a page of endpoints' stored credentials (by endpoint id)."""
    return lambda conn, after: box.store.endpoint_credentials_page(conn, after, _PAGE)


async def reseal_credentials(box: Runtime, vault: Vault) -> tuple[int, int]:
    """Seal every endpoint's credentials with the first key (``relaybox endpoints
    seal-secrets``, with the signing secrets): (sealed now, already were). Safe with
    several processes at once (compare-and-set)."""
    swap = box.store.endpoint_credentials_swap
    sealed, seen = await reseal_pages(box, vault, _credentials(box), swap, _PAGE, "")
    return sealed, seen - sealed


async def credentials_at_rest(box: Runtime, vault: Vault, counts: dict[str, int]) -> None:
    """Add the stored credentials to ``counts`` by :meth:`Vault.state`."""
    await each_page(box, _credentials(box), _PAGE, "", count_states(vault, counts))
