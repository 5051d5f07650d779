"""Endpoint signing secrets at rest: always sealed with Fernet.

A signing secret in the database lets whoever reads the database forge webhooks that
the endpoint's owner will trust, so relaybox never stores one in plaintext. Every
secret is sealed (Fernet: AES-128-CBC + HMAC-SHA256, from ``cryptography``) and kept
as ``fernet:<token>``. The key comes from, in this order:

- ``outbound.secrets_key``: one or more comma-separated keys; the first seals, every
  one opens, so keys rotate without downtime;
- on SQLite without it, a key file beside the database (``<database>.key``, mode
  0600), made on first need and read from then on (:class:`KeyFile`). A key file that
  exists but cannot be read or holds no valid key is an error: relaybox never
  replaces it, since every sealed secret needs it;
- an in-memory SQLite database gets a key that lives as long as the process (as the
  database does).

On PostgreSQL (any database that is not a file) without ``outbound.secrets_key``,
relaybox refuses to store a secret (:class:`SecretsKeyMissing`): several machines
share that database, and a key each of them made for itself would open nothing the
others sealed.

Rotation:

1. ``relaybox endpoints new-key`` prints a fresh key;
2. set ``RELAYBOX_OUTBOUND__SECRETS_KEY=new,old`` (old: the current setting, or the
   key file's content) and restart;
3. ``relaybox endpoints seal-secrets`` seals every stored secret with the new key;
4. drop the old key.

Secrets stored in plaintext by older versions are still read as they are, and
sealed by ``relaybox migrate`` (:func:`relaybox.outbound.endpoints.seal_plaintext`).
A sealed secret that no key opens is a configuration error: the endpoint's
deliveries are retried with that reason (nothing is sent unsigned) and the API
answers 503.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import hmac
import os
import secrets
import stat
import time
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

from relaybox.config.outbound import parse_keys
from relaybox.errors import ConfigurationError

__all__ = [
    "PREFIX",
    "KeyFile",
    "KeyFileError",
    "SecretsKeyMissing",
    "SecretsLocked",
    "Vault",
    "new_key",
]

PREFIX = "fernet:"

_CACHE = 4096
"""Secrets kept opened (the dispatcher opens an endpoint's secrets on every lease)."""

_KEY_FILE_MAX = 64 * 1024
"""The longest key file read (a key is 44 characters; a list of them stays far below)."""

_PARTIAL_WAIT = 10.0
"""Seconds to wait for another process to finish writing a key file that it has just
created (only where the file system has no hard links, see :meth:`KeyFile.create`)."""

_KEY_LINE = 45
"""A Fernet key (44 characters) and its newline, as :meth:`KeyFile.create` writes it."""

MISSING_HINT = (
    "set outbound.secrets_key (RELAYBOX_OUTBOUND__SECRETS_KEY) on every relaybox process;"
    " make a key with `relaybox endpoints new-key`"
)


class SecretsLocked(Exception):
    """A stored secret is sealed and no key relaybox has opens it."""

    code = "secrets_locked"


class SecretsKeyMissing(SecretsLocked, ConfigurationError):
    """No key to seal with: the database is not a file (PostgreSQL) and
    ``outbound.secrets_key`` is not set. Nothing is stored in plaintext instead."""

    code = "secrets_key_missing"


class KeyFileError(SecretsLocked, ConfigurationError):
    """The key file exists but cannot be read or holds no valid key, or it cannot be
    made."""

    code = "secrets_key_file"


def new_key() -> str:
    """A fresh key for ``outbound.secrets_key``."""
    return Fernet.generate_key().decode()


class KeyFile:
    """The key(s) kept in a file (``<database>.key`` beside a SQLite database).

    :meth:`create` makes it atomically with mode 0600: the key is written and synced
    to a private temporary file, then linked to the final name, which fails when the
    name exists (like ``O_CREAT | O_EXCL``). Of processes starting at once, one link
    wins and every other one reads the winner's key: all end with the same key, and
    no reader ever sees a half-written file.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def read(self) -> str | None:
        """The file's keys, or ``None`` when there is no file; :class:`KeyFileError`
        when it cannot be read or holds no valid key."""
        try:
            with open(self.path, "rb") as f:
                raw = f.read(_KEY_FILE_MAX + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise KeyFileError(
                f"the endpoint secrets key file {self.path} cannot be read"
                f" ({exc.strerror or exc}): fix its permissions, or restore it from"
                " your backup; relaybox never replaces it, since every sealed secret"
                " needs it"
            ) from None
        return self._parse(raw)

    def _parse(self, raw: bytes) -> str:
        problem = None
        if len(raw) > _KEY_FILE_MAX:
            problem = "it is too large to be a key file"
        else:
            try:
                text = raw.decode("ascii").strip()
                if not parse_keys(text):
                    problem = "it is empty"
            except UnicodeDecodeError:
                problem = "it is not text"
            except ValueError as exc:
                problem = str(exc)
        if problem is not None:
            raise KeyFileError(
                f"the endpoint secrets key file {self.path} holds no valid key ({problem}):"
                " restore it from your backup; relaybox never replaces it, since every"
                " sealed secret needs it"
            )
        return text

    def read_or_create(self) -> str:
        """The file's keys, made first (a fresh key) when there is no file."""
        try:
            found = self.read()
        except KeyFileError:
            if self._maybe_being_written():
                # another process made the name a moment ago, without hard links, and
                # has not finished writing its key: wait for it as a losing creator does
                found = self._read_theirs(partial=True)
            else:
                # Whole now, or old: that creator may have finished writing between the
                # read and the look. Read once more; a file that still holds no key
                # raises the same error.
                found = self.read()
        if found is not None:
            return found
        try:
            return self.create()
        except KeyFileError:
            raise
        except OSError as exc:
            raise KeyFileError(
                f"the endpoint secrets key file {self.path} cannot be made"
                f" ({exc.strerror or exc}): let relaybox write to {self.path.parent},"
                " or set outbound.secrets_key"
            ) from None

    def create(self) -> str:
        """Make the file with a fresh key, or read the one another process made."""
        key = new_key()
        directory = self.path.parent
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".{self.path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                os.write(fd, (key + "\n").encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                return self._read_theirs(partial=False)
            except OSError as exc:
                if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EXDEV, errno.EMLINK):
                    raise
                return self._create_without_link(key)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        _sync_directory(directory)
        return key

    def _create_without_link(self, key: str) -> str:
        """``O_CREAT | O_EXCL`` on the final name (file systems without hard links)."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return self._read_theirs(partial=True)
        try:
            os.write(fd, (key + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        _sync_directory(self.path.parent)
        return key

    def _read_theirs(self, *, partial: bool) -> str:
        """The key of the process that created the file first. A linked file is whole
        from the start; one made without hard links (``partial``) may be half-written
        for a moment: read again for up to ``_PARTIAL_WAIT`` seconds."""
        deadline = time.monotonic() + _PARTIAL_WAIT
        while True:
            try:
                found = self.read()
            except KeyFileError:
                if not partial or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)
                continue
            if found is None:  # removed in between: an operator's doing; start over
                return self.create()
            return found

    def _maybe_being_written(self) -> bool:
        """Shorter than one key and its newline, and changed within the last
        ``_PARTIAL_WAIT`` seconds: a creator without hard links may still be writing
        it. An old or whole file that holds no key is an operator's problem instead."""
        try:
            found = self.path.stat()
        except OSError:
            return False
        return found.st_size < _KEY_LINE and time.time() - found.st_mtime < _PARTIAL_WAIT

    def mode(self) -> int | None:
        """The file's permission bits, ``None`` when it cannot be found (missing, or
        its directory cannot be searched: reading it then says why)."""
        try:
            return stat.S_IMODE(self.path.stat().st_mode)
        except OSError:
            return None


def _sync_directory(directory: Path) -> None:
    """Make the new name durable (a key lost in a crash loses every secret)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class Vault:
    """Seals secrets with the first key, opens them with any key.

    ``keys``: configured keys (``outbound.secrets_key``); else ``key_file``, read on
    first need and made when something must be sealed; with neither, :meth:`seal`
    raises :class:`SecretsKeyMissing`.
    """

    def __init__(self, keys: str | None, *, key_file: KeyFile | None = None) -> None:
        found = parse_keys(keys)
        self.configured = bool(found)
        self.key_file = None if found else key_file
        self._first: Fernet | None = None
        self._all: MultiFernet | None = None
        self._material = b""  # the first key's 32 bytes (derive)
        self._opened: dict[str, str] = {}
        if found:
            self._use(keys or "")

    def _use(self, keys: str) -> None:
        found = parse_keys(keys)
        self._first, self._all = found[0], MultiFernet(found)
        # Fernet's own halves of it (signing, encryption) are not readable since
        # cryptography 51 implements Fernet in Rust.
        first = next(part.strip() for part in keys.split(",") if part.strip())
        self._material = base64.urlsafe_b64decode(first.encode())

    def _load(self, *, create: bool) -> bool:
        """Whether a key is at hand, reading (or making) the key file if need be."""
        if self._all is not None:
            return True
        if self.key_file is None:
            return False
        found = self.key_file.read_or_create() if create else self.key_file.read()
        if found is None:
            return False
        self._use(found)
        return True

    @property
    def loaded(self) -> bool:
        """Whether a key is at hand already (configured, or read from the key file)."""
        return self._all is not None

    @property
    def sealing(self) -> bool:
        """Whether secrets can be sealed (a key is configured or kept in a file)."""
        return self._all is not None or self.key_file is not None

    def check(self) -> None:
        """Read the key file when there is one (:class:`KeyFileError` when it is
        broken), without making it."""
        self._load(create=False)

    def ensure(self) -> None:
        """Have a key to seal with (making the key file if need be), or raise
        :class:`SecretsKeyMissing`; called before a transaction that seals."""
        if not self._load(create=True):
            raise SecretsKeyMissing(
                "endpoint signing secrets are stored sealed and no key is configured:"
                f" {MISSING_HINT}"
            )

    def seal(self, secret: str) -> str:
        """What to store for ``secret``: always sealed, never the secret itself."""
        self.ensure()
        assert self._first is not None
        return PREFIX + self._first.encrypt(secret.encode()).decode()

    def derive(self, label: str) -> bytes:
        """A key for another purpose (``label``), derived one way from the sealing
        key: the portal signs its links with it when it has no key of its own."""
        self.ensure()
        assert self._first is not None
        message = b"relaybox-derive\0" + label.encode()
        return hmac.new(self._material, message, hashlib.sha256).digest()

    def open(self, stored: str) -> str:
        """The secret behind a stored value (a plaintext one is returned as it is)."""
        if not stored.startswith(PREFIX):
            return stored
        found = self._opened.get(stored)
        if found is not None:
            return found
        if not self._load(create=False) or self._all is None:
            if self.key_file is not None:
                raise SecretsLocked(
                    f"endpoint secrets are sealed and the key file {self.key_file.path} is"
                    " missing: restore it from your backup, or set outbound.secrets_key"
                )
            raise SecretsLocked("endpoint secrets are sealed and outbound.secrets_key is not set")
        try:
            found = self._all.decrypt(stored[len(PREFIX) :].encode()).decode()
        except InvalidToken:
            raise SecretsLocked(f"no key in {self.source} opens this endpoint's secret") from None
        if len(self._opened) >= _CACHE:
            self._opened.clear()
        self._opened[stored] = found
        return found

    @property
    def source(self) -> str:
        """Where the keys come from, for messages."""
        if self.key_file is not None:
            return f"the key file {self.key_file.path}"
        return "outbound.secrets_key"

    def state(self, stored: str) -> str:
        """``plaintext``, ``current`` (sealed with the first key), ``older`` (with
        another key) or ``locked`` (no key opens it)."""
        if not stored.startswith(PREFIX):
            return "plaintext"
        if not self._load(create=False) or self._first is None or self._all is None:
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
        """``stored`` sealed with the first key, or ``None`` when it already is.
        Raises :class:`SecretsLocked` when no key opens it and
        :class:`SecretsKeyMissing` when there is no key to seal with."""
        self.ensure()
        if self.state(stored) == "current":
            return None
        return self.seal(self.open(stored))
