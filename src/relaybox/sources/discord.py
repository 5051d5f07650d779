"""Discord interactions: Ed25519, ``X-Signature-Ed25519`` and ``X-Signature-Timestamp``.

What is signed: ``timestamp + body`` (the header's text, then the raw body), verified
with the application's public key (hex, from the Developer Portal), as the
``discord-interactions`` package's ``verify_key`` does. ``private:<hex 32-byte
seed>`` signs (tests, ``send-test``) and verifies with its public half. The
timestamp (Unix seconds) is checked against ``tolerance`` in both directions.

``PING`` (type 1, Discord's endpoint check) is answered ``{"type": 1}`` (PONG) once
its signature matched; nothing is stored.

Other interactions are stored under their ``id`` (a snowflake; Discord does not
retry interactions) and answered with a deferred response so that the handler
follows up through the interaction webhook: type 5 (deferred channel message) for
application commands, type 6 (deferred update) for message components and modal
submits, and an empty autocomplete result (type 8) for autocomplete. The type is
the interaction type's name (``APPLICATION_COMMAND``, ``MESSAGE_COMPONENT``,
``APPLICATION_COMMAND_AUTOCOMPLETE``, ``MODAL_SUBMIT``); the account
``application_id``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from relaybox.errors import ConfigurationError, MalformedPayload
from relaybox.sources.base import (
    Headers,
    Identity,
    Secret,
    Verified,
)
from relaybox.sources.hooks import Answer
from relaybox.sources.kit import PRIVATE_PREFIX, json_object, text
from relaybox.sources.publickey import TimestampKeySource

__all__ = ["DiscordSource", "discord"]

TYPES = {
    1: "PING",
    2: "APPLICATION_COMMAND",
    3: "MESSAGE_COMPONENT",
    4: "APPLICATION_COMMAND_AUTOCOMPLETE",
    5: "MODAL_SUBMIT",
}
_DEFERRED = {
    "APPLICATION_COMMAND": {"type": 5},
    "MESSAGE_COMPONENT": {"type": 6},
    "MODAL_SUBMIT": {"type": 6},
    "APPLICATION_COMMAND_AUTOCOMPLETE": {"type": 8, "data": {"choices": []}},
}


def _load(secret: Secret) -> tuple[Ed25519PublicKey, Ed25519PrivateKey | None]:
    value = secret.value.strip()
    try:
        if value.startswith(PRIVATE_PREFIX):
            private = Ed25519PrivateKey.from_private_bytes(
                bytes.fromhex(value[len(PRIVATE_PREFIX) :])
            )
            return private.public_key(), private
        return Ed25519PublicKey.from_public_bytes(bytes.fromhex(value)), None
    except ValueError:
        raise ConfigurationError(
            "discord source: secret must be the application's hex public key"
        ) from None


class DiscordSource(TimestampKeySource[Ed25519PublicKey, Ed25519PrivateKey]):
    """Discord interactions endpoint."""

    provider = "discord"

    signature_name = "X-Signature-Ed25519"
    timestamp_name = "X-Signature-Timestamp"
    private_form = "private:<hex seed>"

    def load_key(self, secret: Secret) -> tuple[Ed25519PublicKey, Ed25519PrivateKey | None]:
        return _load(secret)

    def verify_signature(self, public: Ed25519PublicKey, signature: bytes, content: bytes) -> bool:
        try:
            public.verify(signature, content)
        except InvalidSignature:
            return False
        return True

    def make_signature(self, private: Ed25519PrivateKey, content: bytes) -> bytes:
        return private.sign(content)

    def identify(self, headers: Headers, payload: Any) -> Identity:
        interaction = json_object(payload, "Discord")
        kind = interaction.get("type")
        name = TYPES.get(kind) if isinstance(kind, int) and not isinstance(kind, bool) else None
        event_id = text(interaction.get("id"))
        if name is None or event_id is None:
            raise MalformedPayload("Discord interaction has no known type or no id")
        return Identity(
            event_id=event_id, event_type=name, account=text(interaction.get("application_id"))
        )

    def challenge(self, verified: Verified) -> Answer | None:
        return Answer.json({"type": 1}) if verified.event_type == "PING" else None

    def acknowledge(self, verified: Verified, status: str) -> Answer | None:
        response = _DEFERRED.get(verified.event_type)
        return Answer.json(response) if response is not None else None

    def example(self, event_type: str | None, event_id: str, now: float) -> bytes:
        numbers = {v: k for k, v in TYPES.items()}
        kind = numbers.get(event_type or "APPLICATION_COMMAND", 2)
        interaction: Mapping[str, Any] = {
            "id": event_id,
            "application_id": self.account or "100000000000000000",
            "type": kind,
            "token": "relaybox-test-token",
            "version": 1,
        }
        if kind == 2:
            interaction = {**interaction, "data": {"id": "1", "name": "relaybox", "type": 1}}
        return json.dumps(interaction, separators=(",", ":")).encode()


def discord(*, secrets: Iterable[Secret | str] | Secret | str, **options: Any) -> DiscordSource:
    """A Discord interactions source; ``secrets`` are application public keys (hex)."""
    return DiscordSource(secrets=secrets, **options)
