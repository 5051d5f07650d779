"""Providers that sign ``timestamp + body`` with a private key (Discord's Ed25519,
SendGrid's ECDSA): one frame verifies and signs for both.

The signature is in one header (hex or base64), the Unix timestamp whose text is
signed in another; the timestamp is checked against ``tolerance`` in both directions
after a signature matched. A secret is the provider's public key; a
``private:<key>`` secret signs too (tests, ``send-test``) and verifies with its
public half.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any, ClassVar, Generic, TypeVar

from relaybox.errors import ConfigurationError
from relaybox.sources.base import (
    Headers,
    Secret,
    Signing,
    Source,
    check_timestamp,
    parse_int_timestamp,
)
from relaybox.sources.kit import require_header, unb64, unhex

__all__ = ["TimestampKeySource"]

Public = TypeVar("Public")
Private = TypeVar("Private")


class TimestampKeySource(Source, Generic[Public, Private]):
    """A source whose provider signs ``timestamp + body`` with a private key."""

    signature_name: ClassVar[str]
    timestamp_name: ClassVar[str]
    encoding: ClassVar[str] = "hex"
    """How the signature is written: ``hex`` or ``base64``."""
    private_form: ClassVar[str]
    """What a signing secret looks like, for the error that asks for one."""

    def __init__(
        self, *, secrets: Iterable[Secret | str] | Secret | str = (), **options: Any
    ) -> None:
        self._keys: dict[Secret, tuple[Public, Private | None]] = {}
        super().__init__(secrets=secrets, **options)

    def check_secret(self, secret: Secret) -> None:
        self._keys[secret] = self.load_key(secret)

    def load_key(self, secret: Secret) -> tuple[Public, Private | None]:
        """The public key of ``secret``, and its private key when it is one."""
        raise NotImplementedError

    def verify_signature(self, public: Public, signature: bytes, content: bytes) -> bool:
        raise NotImplementedError

    def make_signature(self, private: Private, content: bytes) -> bytes:
        raise NotImplementedError

    def authenticate(
        self, headers: Headers, body: bytes, now: float, check_time: bool
    ) -> tuple[Secret, float | None]:
        raw = require_header(headers, self.signature_name.lower(), self.signature_name)
        given = unhex(raw, "signature") if self.encoding == "hex" else unb64(raw, "signature")
        raw_timestamp = (headers.get(self.timestamp_name.lower()) or "").strip()
        timestamp = parse_int_timestamp(raw_timestamp, self.timestamp_name)
        content = raw_timestamp.encode() + body
        secret = self.try_secrets(lambda s: self.verify_signature(self._keys[s][0], given, content))
        if check_time:
            check_timestamp(timestamp, now, self.tolerance)
        return secret, float(timestamp)

    def signed_headers(self, body: bytes, signing: Signing) -> dict[str, str]:
        private = self._keys[signing.secret][1]
        if private is None:
            raise ConfigurationError(
                f"{self.provider} source: signing needs a {self.private_form} secret"
            )
        timestamp = str(int(signing.now))
        signature = self.make_signature(private, timestamp.encode() + body)
        if self.encoding == "hex":
            encoded = signature.hex()
        else:
            encoded = base64.b64encode(signature).decode()
        return {
            self.signature_name.lower(): encoded,
            self.timestamp_name.lower(): timestamp,
            "content-type": "application/json",
        }
