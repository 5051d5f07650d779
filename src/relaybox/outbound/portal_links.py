"""Portal links and sessions: signed tokens, no table.

The application makes a link for one tenant (:func:`portal_link`, or
``POST /api/v1/portal/sessions`` with the tenant's API key). Opening it starts a
session of ``portal.session_ttl`` seconds for that tenant; the session's token is the
first segment of every portal address after ``/portal/s/``, so the portal works in an
iframe of another site, where browsers withhold cookies.

A token is ``<kind>.<tenant, base64url>.<expires, epoch s>.<nonce>.<HMAC-SHA256>``;
the key is ``portal.signing_key``, or one derived from the endpoint secrets key
(:meth:`relaybox.outbound.vault.Vault.derive`), so every process of a deployment
reads the tokens of the others. A token's tenant and expiry cannot be changed
without the key; a link (``kind`` ``l``) is not a session (``s``) and the reverse.
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
    "csrf_token",
    "open_link",
    "portal_link",
    "read_session",
]

Kind = Literal["l", "s"]
_MAX_TOKEN = 600


class TokenRefused(RelayboxError):
    """A link or session token that is forged, malformed or past its expiry;
    ``expired`` tells the last apart (the page says so)."""

    def __init__(self, message: str, *, expired: bool = False) -> None:
        super().__init__(message)
        self.expired = expired


@dataclass(frozen=True)
class PortalLink:
    """A link to hand to one tenant's browser: open it before ``expires_at``."""

    url: str
    expires_at: float
    tenant: str

    def to_json(self) -> dict[str, object]:
        iso = datetime.fromtimestamp(self.expires_at, UTC).isoformat().replace("+00:00", "Z")
        return {"url": self.url, "expires_at": iso}


@dataclass(frozen=True)
class PortalSession:
    tenant: str
    expires_at: float
    nonce: str
    token: str


def _key(box: Runtime) -> bytes:
    configured = box.settings.portal.signing_key
    if configured is not None and configured.get_secret_value():
        raw = configured.get_secret_value().encode()
        return hashlib.sha256(b"relaybox-portal\0" + raw).digest()
    return outbound(box).vault.derive("portal")


def _sign(key: bytes, body: str) -> str:
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


def _issue(box: Runtime, kind: Kind, tenant: str, expires: int) -> tuple[str, str]:
    encoded = base64.urlsafe_b64encode(tenant.encode()).decode().rstrip("=")
    nonce = secrets.token_urlsafe(12)
    body = f"{kind}.{encoded}.{expires}.{nonce}"
    return f"{body}.{_sign(_key(box), body)}", nonce


def _read(box: Runtime, kind: Kind, token: str) -> tuple[str, int, str]:
    parts = token.split(".")
    if len(token) > _MAX_TOKEN or len(parts) != 5 or parts[0] != kind:
        raise TokenRefused("this link is not valid")
    body = ".".join(parts[:4])
    if not hmac.compare_digest(parts[4], _sign(_key(box), body)):
        raise TokenRefused("this link is not valid")
    try:
        padded = parts[1] + "=" * (-len(parts[1]) % 4)
        tenant = base64.urlsafe_b64decode(padded.encode()).decode()
        expires = int(parts[2])
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise TokenRefused("this link is not valid") from None
    if box.clock.now() >= expires:
        raise TokenRefused("this link has expired: ask for a new one", expired=True)
    return tenant, expires, parts[3]


def portal_link(
    box: Runtime, tenant: str, *, ttl: float | None = None, base_url: str | None = None
) -> PortalLink:
    """A signed link that opens ``tenant``'s portal, valid for ``ttl`` seconds
    (default ``portal.link_ttl``, at most ``portal.max_link_ttl``). ``base_url`` is
    where browsers reach relaybox (default ``portal.public_url``; without either the
    URL is a path, ``/portal/enter/…``, to put behind your own host)."""
    settings = box.settings.portal
    if not tenant or len(tenant) > 200:
        raise ValueError("a portal link needs a tenant of 1-200 characters")
    life = settings.link_ttl if ttl is None else ttl
    if not 0 < life <= settings.max_link_ttl:
        raise ValueError(f"ttl is seconds in (0, {settings.max_link_ttl:g}] (portal.max_link_ttl)")
    expires = int(box.clock.now() + life)
    token, _ = _issue(box, "l", tenant, expires)
    base = (base_url or settings.public_url or "").rstrip("/")
    return PortalLink(f"{base}/portal/enter/{token}", float(expires), tenant)


def open_link(box: Runtime, token: str) -> PortalSession:
    """Start a session from a link token (:class:`TokenRefused` when it is not valid).
    The session lasts ``portal.session_ttl`` from now."""
    tenant, _, _ = _read(box, "l", token)
    expires = int(box.clock.now() + box.settings.portal.session_ttl)
    session, nonce = _issue(box, "s", tenant, expires)
    return PortalSession(tenant, float(expires), nonce, session)


def read_session(box: Runtime, token: str) -> PortalSession:
    tenant, expires, nonce = _read(box, "s", token)
    return PortalSession(tenant, float(expires), nonce, token)


def csrf_token(box: Runtime, session: PortalSession) -> str:
    """The token every form of ``session`` carries (checked on every POST)."""
    return _sign(_key(box), "csrf." + session.nonce)
