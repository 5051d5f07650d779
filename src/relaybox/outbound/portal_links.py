"""Portal links and sessions: signed tokens, and a table of the ones ended early.

The application makes a link for one tenant (:func:`portal_link`, or
``POST /api/v1/portal/sessions`` with the tenant's API key). Opening it starts a
session of ``portal.session_ttl`` seconds for that tenant; the session's token is the
first segment of every portal address after ``/portal/s/``, so the portal works in an
iframe of another site, where browsers withhold cookies.

A token is ``<kind>.<tenant, base64url>.<expires, epoch s>.<nonce>.<key id>.<HMAC-SHA256>``;
the key is ``portal.signing_key``, or one derived from the endpoint secrets key
(:meth:`relaybox.outbound.vault.Vault.derive`), so every process of a deployment
reads the tokens of the others. A token's tenant, expiry and key id cannot be changed
without the key; a link (``kind`` ``l``, or ``u`` for a single-use link) is not a
session (``s``) and the reverse. The key id is the API key that asked for the link
(``-``: the application made it), and its sessions carry it on.

A signature cannot be taken back, so what ends a token before its expiry is written
to ``relaybox_portal_revoked_tokens``, which every process reads: a session its tenant
logged out of (:func:`end_session`), and a single-use link once opened (the INSERT
that records the opening lets exactly one opening through). Every portal request
checks its session there and checks that its API key is not revoked
(:func:`check_session`: one statement); revoking the key ends its sessions at once.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Literal

from relaybox.errors import RelayboxError
from relaybox.outbound.registry import outbound

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = [
    "PortalLink",
    "PortalSession",
    "TokenRefused",
    "check_session",
    "csrf_token",
    "end_session",
    "open_link",
    "portal_link",
    "read_session",
]

Kind = Literal["l", "u", "s"]
Reason = Literal["invalid", "expired", "used", "ended"]
_LINKS: tuple[Kind, ...] = ("l", "u")
_NO_KEY = "-"
_MAX_TOKEN = 600
_MARGIN = 60.0
"""Seconds a revocation is kept past its token's expiry: room for processes whose
clocks differ a little."""


class TokenRefused(RelayboxError):
    """A link or session token that is refused, and why (``reason``): ``invalid``
    (forged, malformed), ``expired``, ``used`` (a single-use link opened before) or
    ``ended`` (a session logged out of, or the API key behind it revoked)."""

    def __init__(self, message: str, *, reason: Reason = "invalid") -> None:
        super().__init__(message)
        self.reason: Reason = reason

    @property
    def expired(self) -> bool:
        return self.reason == "expired"

    @property
    def status(self) -> int:
        """The page's status: 410 for a link spent by time or use, else 401."""
        return 410 if self.reason in ("expired", "used") else 401


@dataclass(frozen=True)
class PortalLink:
    """A link to hand to one tenant's browser: open it before ``expires_at`` (once,
    when ``single_use``)."""

    url: str
    expires_at: float
    tenant: str
    single_use: bool = False

    def to_json(self) -> dict[str, object]:
        iso = datetime.fromtimestamp(self.expires_at, UTC).isoformat().replace("+00:00", "Z")
        return {"url": self.url, "expires_at": iso, "single_use": self.single_use}


@dataclass(frozen=True)
class PortalSession:
    tenant: str
    expires_at: float
    nonce: str
    token: str
    key_id: str | None = None
    """The API key that asked for the session's link (``None``: the application)."""


def _key(box: Runtime) -> bytes:
    configured = box.settings.portal.signing_key
    if configured is not None and configured.get_secret_value():
        raw = configured.get_secret_value().encode()
        return hashlib.sha256(b"relaybox-portal\0" + raw).digest()
    return outbound(box).vault.derive("portal")


def _sign(key: bytes, body: str) -> str:
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def _token_id(kind: Kind, nonce: str) -> str:
    """The token's row in ``relaybox_portal_revoked_tokens`` (not the token itself)."""
    return hashlib.sha256(f"relaybox-portal-token\0{kind}\0{nonce}".encode()).hexdigest()


def _issue(
    box: Runtime, kind: Kind, tenant: str, expires: int, key_id: str | None
) -> tuple[str, str]:
    encoded = base64.urlsafe_b64encode(tenant.encode()).decode().rstrip("=")
    nonce = secrets.token_urlsafe(12)
    body = f"{kind}.{encoded}.{expires}.{nonce}.{key_id or _NO_KEY}"
    return f"{body}.{_sign(_key(box), body)}", nonce


def _read(
    box: Runtime, kinds: tuple[Kind, ...], token: str, noun: str
) -> tuple[Kind, str, int, str, str | None]:
    """(kind, tenant, expires, nonce, key id) of a token of one of ``kinds``."""
    invalid = TokenRefused(f"this {noun} is not valid")
    parts = token.split(".")
    if len(token) > _MAX_TOKEN or len(parts) != 6 or parts[0] not in kinds:
        raise invalid
    body = ".".join(parts[:5])
    if not hmac.compare_digest(parts[5], _sign(_key(box), body)):
        raise invalid
    try:
        padded = parts[1] + "=" * (-len(parts[1]) % 4)
        tenant = base64.urlsafe_b64decode(padded.encode()).decode()
        expires = int(parts[2])
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise invalid from None
    if box.clock.now() >= expires:
        raise TokenRefused(f"this {noun} has expired: ask for a new link", reason="expired")
    kind: Kind = "s" if parts[0] == "s" else ("u" if parts[0] == "u" else "l")
    return kind, tenant, expires, parts[3], None if parts[4] == _NO_KEY else parts[4]


def portal_link(
    box: Runtime,
    tenant: str,
    *,
    ttl: float | None = None,
    base_url: str | None = None,
    single_use: bool | None = None,
    key_id: str | None = None,
) -> PortalLink:
    """A signed link that opens ``tenant``'s portal, valid for ``ttl`` seconds
    (default ``portal.link_ttl``, at most ``portal.max_link_ttl``). ``base_url`` is
    where browsers reach relaybox (default ``portal.public_url``; without either the
    URL is a path, ``/portal/enter/…``, to put behind your own host). ``single_use``:
    the link opens one session only (default ``portal.single_use_links``). ``key_id``:
    the API key that asks for it (the tenant API passes it); its sessions end when
    that key is revoked."""
    settings = box.settings.portal
    if not tenant or len(tenant) > 200:
        raise ValueError("a portal link needs a tenant of 1-200 characters")
    life = settings.link_ttl if ttl is None else ttl
    if not 0 < life <= settings.max_link_ttl:
        raise ValueError(f"ttl is seconds in (0, {settings.max_link_ttl:g}] (portal.max_link_ttl)")
    once = settings.single_use_links if single_use is None else single_use
    expires = int(box.clock.now() + life)
    token, _ = _issue(box, "u" if once else "l", tenant, expires, key_id)
    base = (base_url or settings.public_url or "").rstrip("/")
    return PortalLink(f"{base}/portal/enter/{token}", float(expires), tenant, once)


async def open_link(box: Runtime, token: str) -> PortalSession:
    """Start a session from a link token, or raise :class:`TokenRefused`: forged or
    malformed, expired, made by an API key revoked since, or single-use and opened
    before (this call spends it). The session lasts ``portal.session_ttl`` from now and
    carries the link's API key."""
    kind, tenant, expires, nonce, key_id = _read(box, _LINKS, token, "link")
    now = box.clock.now()
    outcome = await box.store.sessions.portal_link_open(
        _token_id(kind, nonce),
        key_id=key_id,
        single_use=kind == "u",
        expires_at=expires + _MARGIN,
        purge_before=now,
    )
    if outcome == "used":
        raise TokenRefused("this link has been used: ask for a new one", reason="used")
    if outcome == "revoked":
        raise TokenRefused("this link is no longer valid: ask for a new one", reason="ended")
    ends = int(now + box.settings.portal.session_ttl)
    session, session_nonce = _issue(box, "s", tenant, ends, key_id)
    return PortalSession(tenant, float(ends), session_nonce, session, key_id)


def read_session(box: Runtime, token: str) -> PortalSession:
    """The session a token proves by its signature and expiry alone (no database):
    :func:`check_session` also refuses one that ended early."""
    _, tenant, expires, nonce, key_id = _read(box, ("s",), token, "session")
    return PortalSession(tenant, float(expires), nonce, token, key_id)


async def check_session(box: Runtime, token: str) -> PortalSession:
    """The session of a portal request: signed, not expired, not logged out of, and
    its API key (if one asked for its link) not revoked. :class:`TokenRefused` else."""
    session = read_session(box, token)
    if not await box.store.sessions.portal_session_live(
        _token_id("s", session.nonce), session.key_id
    ):
        raise TokenRefused("this session has ended: ask for a new link", reason="ended")
    return session


async def end_session(box: Runtime, session: PortalSession) -> None:
    """Log out: ``session`` is refused from now on, by every process (idempotent)."""
    await box.store.sessions.portal_token_revoke(
        _token_id("s", session.nonce),
        expires_at=session.expires_at + _MARGIN,
        purge_before=box.clock.now(),
    )


def csrf_token(box: Runtime, session: PortalSession) -> str:
    """The token every form of ``session`` carries (checked on every POST)."""
    return _sign(_key(box), "csrf." + session.nonce)
