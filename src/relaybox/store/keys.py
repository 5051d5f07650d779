"""The keys that decide a duplicate across time, apart from the history (migration
0027): what the accept and the publish write to ``relaybox_event_keys`` and
``relaybox_message_keys``, computed here once for both backends.

* a key's **digest**: BLAKE2b-128 of its parts, each length-prefixed (so that no two
  different keys concatenate to the same bytes);
* an event's **fingerprint digest**: the first 8 bytes of the BLAKE2b-128 of the
  delivery's content fingerprint (whatever its source computes: a hash, or canonical
  bytes of any length), read as a signed 64-bit integer (migration 0038: the 16 bytes
  kept before, cut to their first 8); a changed payload under an event id already
  seen is told from a repeat unless the two collide (2^-64 a pair);
* the **day** first seen: whole days since 1970-01-01 UTC, for expiry by age;
* the **scope**: the source of an event, the tenant of a message, as the first 4 bytes
  of BLAKE2b of its name read as a signed 32-bit integer (migration 0038: the top half
  of the 8 bytes kept before). The scope serves only the expiry by a source's or a
  tenant's keys window: two names on one scope (2^-32 a pair) share their expiry.
  :func:`relaybox.retention.policy.keys_plan` gives every named scope on a shared
  number the longest of their windows, and two configured sources on one number are
  refused (:func:`check_scopes`).

Every 16-byte digest travels as ``bytes`` on both backends; PostgreSQL stores it as a
``uuid`` (no length header: migrations 0031 and 0035), its statements converting it
(``encode($1::bytea, 'hex')::uuid`` in, ``uuid_send(digest)`` out), SQLite as a blob.

An idempotency key names its message (:func:`message_ref`): an id relaybox made
(``msg_`` + 27 hex digits) as 16 bytes, the uuid of ``00000`` and those digits (the
statements give back the text: ``'msg_' || substr(replace(u::text, '-', ''), 6)``
on PostgreSQL, ``'msg_' || substr(lower(hex(u)), 6)`` on SQLite); any other id as its
text, in a column of its own that is NULL otherwise.

Business keys (``ctx.once()``) have their own narrow table since migration 0031,
``relaybox_business_keys``: the key's digest (its PRIMARY KEY decides), an 8-byte
digest of the operation's fingerprint as a signed integer (what tells a repeat from
a conflicting reuse of the key), the source's scope and the first day.
``relaybox_operations`` keeps the readable row (key, fingerprint, event) as history,
which retention drops with the event's payload.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "KEY_KINDS",
    "BackfillProgress",
    "KeyKind",
    "check_scopes",
    "day_of",
    "event_digest",
    "event_key_columns",
    "fingerprint_digest",
    "message_digest",
    "message_key_columns",
    "message_ref",
    "operation_digest",
    "operation_fingerprint",
    "operation_key_columns",
    "scope_of",
]

KeyKind = Literal["event", "message", "operation", "outbox"]
KEY_KINDS: tuple[KeyKind, ...] = ("event", "message", "operation", "outbox")
"""``event``: inbox event keys (scope: the source); ``message``: idempotency keys of
published messages (scope: the tenant); ``operation``: business keys of ``once()``
(scope: the source of the event whose handler recorded it); ``outbox``: PostgreSQL's
keys of the outbox's (channel, key), a delivery's and a handler's or the application's
row's (no scope)."""

DAY = 86400


def _digest(*parts: str) -> bytes:
    h = hashlib.blake2b(digest_size=16, person=b"relaybox-key")
    for part in parts:
        data = part.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(4, "big"))
        h.update(data)
    return h.digest()


def event_digest(source: str, account: str, event_id: str) -> bytes:
    """The 16-byte digest of an inbox event key."""
    return _digest("event", source, event_id, account)


def message_digest(tenant: str, idempotency_key: str) -> bytes:
    """The 16-byte digest of a message's idempotency key within its tenant."""
    return _digest("message", tenant, idempotency_key)


def operation_digest(business_key: str) -> bytes:
    """The 16-byte digest of a business key (business keys are global)."""
    return _digest("operation", business_key)


def operation_fingerprint(fingerprint: str) -> int:
    """The 8 bytes a business key keeps of its operation's fingerprint, as a signed
    64-bit integer: a reuse of the key with another fingerprint is told from a repeat
    unless the two collide (2^-64 a pair)."""
    raw = hashlib.blake2b(
        fingerprint.encode("utf-8", "surrogatepass"), digest_size=8, person=b"relaybox-opfp"
    ).digest()
    return int.from_bytes(raw, "big", signed=True)


def fingerprint_digest(fingerprint: bytes) -> int:
    """The 8 bytes an event key keeps of a delivery's content fingerprint, as a signed
    64-bit integer: the first 8 of its BLAKE2b-128 (the 16 bytes kept before migration
    0038, which cut the stored ones alike)."""
    raw = hashlib.blake2b(fingerprint, digest_size=16, person=b"relaybox-fp").digest()
    return int.from_bytes(raw[:8], "big", signed=True)


def scope_of(name: str) -> int:
    """The scope number of a source or tenant name: a signed 32-bit integer, the top
    half of the 64-bit number scopes had before migration 0038 (which shifted the
    stored ones alike)."""
    raw = hashlib.blake2b(
        name.encode("utf-8", "surrogatepass"), digest_size=8, person=b"relaybox-scope"
    ).digest()
    return int.from_bytes(raw[:4], "big", signed=True)


def check_scopes(names: Iterable[str], what: str = "sources") -> None:
    """Refuse two of ``names`` on one scope number (:func:`scope_of`): their keys would
    share the expiry of a keys window. Vanishingly rare (2^-32 a pair), but known
    before anything is stored: a ``ValueError`` naming both."""
    seen: dict[int, str] = {}
    for name in names:
        scope = scope_of(name)
        other = seen.setdefault(scope, name)
        if other != name:
            raise ValueError(
                f"{what} {other!r} and {name!r} share the keys scope {scope}: their keys "
                "could not expire apart; rename one of them"
            )


_MESSAGE_ID = re.compile(r"msg_[0-9a-f]{27}")


def message_ref(message_id: str) -> tuple[bytes | None, str | None]:
    """How an idempotency key names its message: (16 bytes, ``None``) for an id
    relaybox made (``msg_`` + 27 hex digits: the bytes of ``00000`` and those digits),
    else (``None``, the id as it is)."""
    if _MESSAGE_ID.fullmatch(message_id):
        return bytes.fromhex("00000" + message_id[4:]), None
    return None, message_id


def day_of(timestamp: float) -> int:
    """Whole days since 1970-01-01 UTC at ``timestamp`` (epoch seconds)."""
    return math.floor(timestamp / DAY)


@dataclass(frozen=True, slots=True)
class BackfillProgress:
    """Where the backfill of one kind of keys stands (:meth:`KeysStore.backfill`)."""

    kind: str
    rows: int
    """Keys copied so far (rows read; a row whose key existed counts too)."""
    finished: bool
    last_id: str | None = None
    read: int = 0
    """Rows the call that returned this read (0 for a status)."""


def event_key_columns(rows: Sequence[Any]) -> list[list[Any]]:
    """``event_keys_insert``'s arrays (inbox id, scope, first day, digest, fingerprint
    digest) for inbox rows read as (id, source, account, event_id, fingerprint,
    received_at)."""
    return [
        [r[0] for r in rows],
        [scope_of(r[1]) for r in rows],
        [day_of(r[5]) for r in rows],
        [event_digest(r[1], r[2], r[3]) for r in rows],
        [fingerprint_digest(bytes(r[4])) for r in rows],
    ]


def message_key_columns(rows: Sequence[Any]) -> list[list[Any]]:
    """The idempotency keys of messages read as (id, tenant, idempotency key,
    created_at), as arrays: digest, scope, first day, the message's 16 bytes and its
    id as text (:func:`message_ref`: one of the two is ``None``)."""
    refs = [message_ref(r[0]) for r in rows]
    return [
        [message_digest(r[1], r[2]) for r in rows],
        [scope_of(r[1]) for r in rows],
        [day_of(r[3]) for r in rows],
        [ref for ref, _ in refs],
        [text for _, text in refs],
    ]


def operation_key_columns(rows: Sequence[Any]) -> list[list[Any]]:
    """The business keys of operations read as (business key, fingerprint, source,
    created_at), as arrays: digest, fingerprint digest, scope, first day."""
    return [
        [operation_digest(r[0]) for r in rows],
        [operation_fingerprint(r[1]) for r in rows],
        [scope_of(r[2] or "") for r in rows],
        [day_of(r[3]) for r in rows],
    ]


def operation_params(
    business_key: str,
    fingerprint: str,
    inbox_id: int | None,
    source: str | None,
    tenant: str | None,
    now: float,
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``operation_insert``'s parameters: the key's (digest, fingerprint digest, scope,
    day), then its readable row's (key, fingerprint, inbox id, source, tenant, now)."""
    return (
        (
            operation_digest(business_key),
            operation_fingerprint(fingerprint),
            scope_of(source or ""),
            day_of(now),
        ),
        (business_key, fingerprint, inbox_id, source, tenant, now),
    )


def operation_stored(fingerprint: str, *, keyed: bool, found: Any) -> tuple[str, int | None]:
    """The fingerprint a business key that was not created answers with, from
    ``operation_get``'s row ``found`` (the stored fingerprint digest, the readable
    fingerprint or ``None``): ``fingerprint`` itself when the digests match (a repeat),
    else the stored one (its text while its readable row is kept). ``keyed``: the
    insert wrote the key's digest though its readable row, stored before migration
    0031 and not backfilled yet, decided (a repeat): the second value is then the
    fingerprint digest to correct the new key row with (``None``: it is right)."""
    code = operation_fingerprint(fingerprint)
    readable = found[1]
    if keyed:
        assert readable is not None  # the row that refused the insert is there
        stored_code = operation_fingerprint(readable)
        return readable, (None if stored_code == code else stored_code)
    stored = found[0]
    if stored is None:  # released or expired meanwhile (another transaction)
        return readable if readable is not None else fingerprint, None
    if int(stored) == code:
        return fingerprint, None
    if readable is not None:
        return readable, None
    return f"<fingerprint digest {int(stored) & (2**64 - 1):016x}>", None
