"""Standard Webhooks senders, as presets of :mod:`relaybox.sources.standard`.

Clerk and Resend deliver through Svix: the Standard Webhooks scheme under
``svix-id``/``svix-timestamp``/``svix-signature`` (``v1,<base64 HMAC-SHA256>`` of
``{id}.{timestamp}.{body}``, secret ``whsec_...``). Everything — headers, tolerance,
the event id (``svix-id``, the same on retries), the type (``type``) — is the
``standard`` source's; a preset only names the provider, signs test deliveries with
the ``svix-*`` names, and gives ``send-test`` an example of that provider's envelope.
Any other Standard Webhooks or Svix sender works with ``provider = "standard"``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from relaybox.sources.base import Secret, Signing
from relaybox.sources.scheme import Sample
from relaybox.sources.standard import StandardSource

__all__ = ["ClerkSource", "ResendSource", "clerk", "resend"]


class _SvixPreset(StandardSource):
    def signed_headers(self, body: bytes, signing: Signing) -> dict[str, str]:
        headers = super().signed_headers(body, signing)
        return {"svix" + name[len("webhook") :]: value for name, value in headers.items()}


class ClerkSource(_SvixPreset):
    """Clerk (via Svix)."""

    provider = "clerk"
    sample = Sample(
        type="user.created",
        body=lambda event: {
            "data": {"id": f"user_{event.id}", "object": "user"},
            "object": "event",
            "type": event.type,
            "timestamp": event.ms,
        },
    )


class ResendSource(_SvixPreset):
    """Resend (via Svix)."""

    provider = "resend"
    sample = Sample(
        type="email.delivered",
        body=lambda event: {
            "type": event.type,
            "created_at": "2023-11-14T22:13:20.000Z",
            "data": {"email_id": event.id, "to": ["alice@example.com"]},
        },
    )


def clerk(*, secrets: Iterable[Secret | str] | Secret | str, **options: Any) -> ClerkSource:
    """A Clerk source; ``secrets`` are signing secrets (``whsec_...``)."""
    return ClerkSource(secrets=secrets, **options)


def resend(*, secrets: Iterable[Secret | str] | Secret | str, **options: Any) -> ResendSource:
    """A Resend source; ``secrets`` are signing secrets (``whsec_...``)."""
    return ResendSource(secrets=secrets, **options)
