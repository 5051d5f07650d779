"""Standard Webhooks (https://www.standardwebhooks.com), also sent by Svix.

What is signed: ``f"{webhook-id}.{webhook-timestamp}.".encode() + body``, the raw
body bytes. ``webhook-signature`` holds space-separated ``<version>,<base64>``
entries so a sender can sign with an old and a new key during rotation:

* ``v1``: HMAC-SHA256 with a symmetric secret ``whsec_<base64 key>`` (a bare
  base64 key without the prefix is accepted too, as the reference library does);
* ``v1a``: Ed25519, verified with ``whpk_<base64 32-byte raw public key>``. A
  ``whsk_<base64 32-byte raw private key>`` secret can sign (``send-test``, tests)
  and verifies with the public key derived from it.

Svix sends the same scheme under ``svix-id``/``svix-timestamp``/``svix-signature``.

The timestamp is checked in both directions (the reference library does so too);
it is checked only after a signature matched, so an unauthenticated sender only
ever learns "bad signature". The event id is the ``webhook-id`` header (stable
across retries per the spec) and the type is the envelope's ``"type"``. The
scheme carries no account: it comes from the secret that matched or the config.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from relaybox.errors import BadSignature, ConfigurationError, MalformedHeaders, MalformedPayload
from relaybox.sources.base import (
    Headers,
    Identity,
    Secret,
    Signing,
    Source,
    check_timestamp,
    parse_int_timestamp,
)
from relaybox.sources.scheme import Sample

__all__ = ["StandardSource", "standard"]

_NAME_SETS = (
    ("webhook-id", "webhook-timestamp", "webhook-signature"),
    ("svix-id", "svix-timestamp", "svix-signature"),
)


@dataclass(frozen=True)
class _Key:
    """A secret decoded once at configuration time."""

    hmac_key: bytes | None = None
    public: Ed25519PublicKey | None = None
    private: Ed25519PrivateKey | None = None

    @property
    def material(self) -> bytes:
        """What verifies: the HMAC key or the raw public key (tagged by kind)."""
        if self.hmac_key is not None:
            return b"hmac:" + self.hmac_key
        assert self.public is not None
        return b"ed25519:" + self.public.public_bytes_raw()


# What an Ed25519 verification costs, as bytes of message: ~100 µs fixed (about the
# time to hash 75 KB) plus the hashing of the signed content. Beyond ~1 ms of such
# work a request is verified in a thread, so that the event loop keeps serving others
# (the one-signature, small-body case stays on the loop: a thread hop costs more).
_ED25519_BASE_BYTES = 75_000
_OFFLOAD_ABOVE_BYTES = 750_000


def _b64(text: str, what: str) -> bytes:
    # Svix and the reference library accept unpadded base64: pad before strict decoding.
    text = text.strip()
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except ValueError:
        raise ConfigurationError(f"standard source: {what} secret is not valid base64") from None


def parse_key(secret: Secret) -> _Key:
    value = secret.value.strip()
    if value.startswith("whpk_"):
        raw = _b64(value[5:], "whpk_")
        if len(raw) != 32:
            raise ConfigurationError("standard source: whpk_ key must be a 32-byte Ed25519 key")
        return _Key(public=Ed25519PublicKey.from_public_bytes(raw))
    if value.startswith("whsk_"):
        raw = _b64(value[5:], "whsk_")
        # 64 bytes is libsodium's seed+public layout; the halves must agree.
        if len(raw) not in (32, 64):
            raise ConfigurationError("standard source: whsk_ key must be a 32-byte Ed25519 key")
        private = Ed25519PrivateKey.from_private_bytes(raw[:32])
        public = private.public_key()
        if len(raw) == 64 and not hmac.compare_digest(raw[32:], public.public_bytes_raw()):
            raise ConfigurationError("standard source: whsk_ key halves do not match")
        return _Key(public=public, private=private)
    if value.startswith("whsec_"):
        value = value[6:]
    key = _b64(value, "whsec_")
    if not key:
        raise ConfigurationError("standard source: empty secret")
    return _Key(hmac_key=key)


_ID_IN_HEADERS = frozenset({"event_id"})


def _header_names(headers: Headers) -> tuple[str, str, str]:
    for names in _NAME_SETS:
        if not headers.keys().isdisjoint(names):  # any of them present (no generator)
            return names
    return _NAME_SETS[0]


def _signatures(entries: list[str]) -> list[tuple[str, bytes]]:
    """Distinct ``(version, raw signature)`` pairs, each once; unknown versions and
    garbage entries are skipped so a future scheme next to ``v1`` does not break
    verification."""
    found: dict[tuple[str, bytes], None] = {}
    for entry in entries:
        version, sep, encoded = entry.partition(",")
        if not sep or version not in ("v1", "v1a"):
            continue
        try:
            found[(version, base64.b64decode(encoded, validate=True))] = None
        except ValueError:
            continue
    return list(found)


def signed_content(msg_id: str, timestamp: int, body: bytes) -> bytes:
    return f"{msg_id}.{timestamp}.".encode() + body


class StandardSource(Source):
    """Standard Webhooks / Svix: ``v1`` HMAC-SHA256 and ``v1a`` Ed25519."""

    provider = "standard"
    sample: ClassVar[Sample] = Sample(
        body=lambda event: {
            "type": event.type,
            "timestamp": event.iso,
            "data": {"id": event.id, "message": "relaybox test event"},
        }
    )
    """The test event :meth:`example` builds (a sender's own envelope in a preset)."""

    def __init__(
        self, *, secrets: Iterable[Secret | str] | Secret | str = (), **options: Any
    ) -> None:
        self._keys: dict[Secret, _Key] = {}
        super().__init__(secrets=secrets, **options)
        # The secrets checked, in order: not one whose key an earlier one has (checking
        # it again could only repeat that one's answer).
        seen: set[bytes] = set()
        distinct: list[Secret] = []
        for secret in self.secrets:
            material = self._keys[secret].material
            if material not in seen:
                seen.add(material)
                distinct.append(secret)
        self._distinct = tuple(distinct)
        self._ed25519_keys = sum(1 for s in distinct if self._keys[s].public is not None)
        self.may_offload = self._ed25519_keys > 0

    def check_secret(self, secret: Secret) -> None:
        self._keys[secret] = parse_key(secret)

    def offload(self, headers: Headers, body: bytes) -> bool:
        """Whether the ``v1a`` entries times the Ed25519 keys, on this body, are more
        work than the event loop should do in one go (see ``_OFFLOAD_ABOVE_BYTES``)."""
        header = headers.get(_header_names(headers)[2]) or ""
        if len(header) > self.max_signature_chars:
            return False  # refused at once by authenticate()
        pairs = min(header.count("v1a,"), self.max_signatures) * self._ed25519_keys
        return pairs * (len(body) + _ED25519_BASE_BYTES) > _OFFLOAD_ABOVE_BYTES

    def _key(self, secret: Secret) -> _Key:
        return self._keys.get(secret) or parse_key(secret)

    def authenticate(
        self, headers: Headers, body: bytes, now: float, check_time: bool
    ) -> tuple[Secret, float | None]:
        id_name, ts_name, sig_name = _header_names(headers)
        raw_signature = self.signature_header(headers, sig_name, sig_name)
        if not raw_signature:
            raise BadSignature(f"missing {sig_name} header", code="missing_signature")
        msg_id = (headers.get(id_name) or "").strip()
        if not msg_id:
            raise MalformedHeaders(f"missing {id_name} header")
        timestamp = parse_int_timestamp(headers.get(ts_name), ts_name)
        entries = raw_signature.split()
        self.check_signature_count(len(entries), sig_name)
        signatures = _signatures(entries)
        if not signatures:
            raise BadSignature(f"no v1 or v1a signature in {sig_name} header")
        # The reference library signs the re-formatted integer, not the raw header text.
        content = signed_content(msg_id, timestamp, body)

        # At most one check per distinct (signature, key): max_signatures x keys.
        def matches(secret: Secret) -> bool:
            key = self._key(secret)
            if key.hmac_key is not None:
                expected = hmac.new(key.hmac_key, content, hashlib.sha256).digest()
                return any(
                    hmac.compare_digest(expected, sig) for ver, sig in signatures if ver == "v1"
                )
            for ver, sig in signatures:
                if ver != "v1a" or key.public is None:
                    continue
                try:
                    key.public.verify(sig, content)
                except InvalidSignature:
                    continue
                return True
            return False

        secret = self.try_secrets(matches, self._distinct)
        if check_time:
            check_timestamp(timestamp, now, self.tolerance)
        return secret, float(timestamp)

    def identify(self, headers: Headers, payload: Any) -> Identity:
        id_name = _header_names(headers)[0]
        msg_id = (headers.get(id_name) or "").strip()
        if not msg_id:
            raise MalformedHeaders(f"missing {id_name} header")
        if type(payload) is not dict and not isinstance(payload, Mapping):
            raise MalformedPayload("standard webhook payload must be a JSON object")
        event_type = payload.get("type")
        if not isinstance(event_type, str) or not event_type:
            raise MalformedPayload('payload has no "type"', code="missing_event_type")
        return Identity(event_id=msg_id, event_type=event_type, from_headers=_ID_IN_HEADERS)

    def signed_headers(self, body: bytes, signing: Signing) -> dict[str, str]:
        key = self._key(signing.secret)
        timestamp = int(signing.now)
        content = signed_content(signing.event_id, timestamp, body)
        if key.hmac_key is not None:
            mac = hmac.new(key.hmac_key, content, hashlib.sha256).digest()
            signature = "v1," + base64.b64encode(mac).decode()
        elif key.private is not None:
            signature = "v1a," + base64.b64encode(key.private.sign(content)).decode()
        else:
            raise ConfigurationError(
                "standard source: cannot sign with a whpk_ public key; use the whsk_ private key"
            )
        return {
            "webhook-id": signing.event_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": signature,
        }

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        return self.sample.document(self, event_type, event_id, now)


def standard(*, secrets: Iterable[Secret | str] | Secret | str, **options: Any) -> StandardSource:
    """A Standard Webhooks / Svix source. ``options`` are :class:`Source` arguments
    (``tolerance``, ``verify_timestamp``, ``account``, ``tenant``, ``tenants``, ...)."""
    return StandardSource(secrets=secrets, **options)
