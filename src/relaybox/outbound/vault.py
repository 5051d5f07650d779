"""Endpoint signing secrets at rest: sealed with Fernet when a key is configured.

A signing secret in the database lets whoever reads the database forge webhooks that
the endpoint's owner will trust. With ``outbound.secrets_key`` set, every secret that
relaybox stores is sealed (Fernet: AES-128-CBC + HMAC-SHA256, from ``cryptography``)
and kept as ``fernet:<token>``; the key lives in the environment or a secret manager,
not next to the data. ``secrets_key`` holds one or more comma-separated keys: the
first seals, every one opens, so keys rotate without downtime:

1. ``relaybox endpoints new-key`` prints a fresh key;
2. set ``RELAYBOX_OUTBOUND__SECRETS_KEY=new,old`` and restart;
3. ``relaybox endpoints seal-secrets`` seals every stored secret with the new key
   (plaintext ones from before a key was set too);
4. drop the old key.

Secrets stored in plaintext (before a key was set) keep working. A sealed secret that
no configured key opens is a configuration error: the endpoint's deliveries are
retried with that reason (nothing is sent unsigned) and the API answers 503.
"""

from __future__ import annotations

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

__all__ = ["PREFIX", "SecretsLocked", "Vault", "new_key", "parse_keys"]

PREFIX = "fernet:"

_CACHE = 4096
"""Secrets kept opened (the dispatcher opens an endpoint's secrets on every lease)."""


class SecretsLocked(Exception):
    """A stored secret is sealed and no configured key opens it."""


def new_key() -> str:
    """A fresh key for ``outbound.secrets_key``."""
    return Fernet.generate_key().decode()


def parse_keys(value: str | None) -> list[Fernet]:
    """``secrets_key``'s comma-separated keys; ``ValueError`` names a bad one."""
    keys: list[Fernet] = []
    for n, part in enumerate((value or "").split(","), start=1):
        if not part.strip():
            continue
        try:
            keys.append(Fernet(part.strip().encode()))
        except (ValueError, TypeError):
            raise ValueError(
                f"key {n} is not a Fernet key (32 url-safe base64-encoded bytes;"
                " make one with `relaybox endpoints new-key`)"
            ) from None
    return keys


class Vault:
    """Seals secrets with the first key, opens them with any key."""

    def __init__(self, keys: str | None) -> None:
        found = parse_keys(keys)
        self._first = found[0] if found else None
        self._all = MultiFernet(found) if found else None
        self._opened: dict[str, str] = {}

    @property
    def sealing(self) -> bool:
        return self._all is not None

    def seal(self, secret: str) -> str:
        """What to store for ``secret``: sealed when a key is set, else as it is."""
        if self._first is None:
            return secret
        return PREFIX + self._first.encrypt(secret.encode()).decode()

    def open(self, stored: str) -> str:
        """The secret behind a stored value (a plaintext one is returned as it is)."""
        if not stored.startswith(PREFIX):
            return stored
        found = self._opened.get(stored)
        if found is not None:
            return found
        if self._all is None:
            raise SecretsLocked("endpoint secrets are sealed and outbound.secrets_key is not set")
        try:
            found = self._all.decrypt(stored[len(PREFIX) :].encode()).decode()
        except InvalidToken:
            raise SecretsLocked(
                "no key in outbound.secrets_key opens this endpoint's secret"
            ) from None
        if len(self._opened) >= _CACHE:
            self._opened.clear()
        self._opened[stored] = found
        return found

    def state(self, stored: str) -> str:
        """``plaintext``, ``current`` (sealed with the first key), ``older`` (with
        another configured key) or ``locked`` (no configured key opens it)."""
        if not stored.startswith(PREFIX):
            return "plaintext"
        if self._first is None or self._all is None:
            return "locked"
        token = stored[len(PREFIX) :].encode()
        for fernet, state in ((self._first, "current"), (self._all, "older")):
            try:
                fernet.decrypt(token)
                return state
            except InvalidToken:
                pass
        return "locked"

    def reseal(self, stored: str) -> str | None:
        """``stored`` sealed with the first key, or ``None`` when it already is (or no
        key is set). Raises :class:`SecretsLocked` when no key opens it."""
        if self._first is None or self.state(stored) == "current":
            return None
        return self.seal(self.open(stored))
