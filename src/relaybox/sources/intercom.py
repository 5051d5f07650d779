"""Intercom: ``X-Hub-Signature: sha1=<hex HMAC-SHA1 of the body>``.

What is signed: the raw body, HMAC-SHA1 in hex keyed with the app's client secret.
No timestamp: no tolerance.

Identity: the notification's ``id`` (``notif_...``, the same on Intercom's retries),
its ``topic`` as the type (``conversation.user.created``) and ``app_id`` as the
account. A retry raises ``delivery_attempts``, so only ``data`` counts for the
fingerprint (``fingerprint_path = "data"`` by default).
"""

from __future__ import annotations

from relaybox.sources.scheme import Hmac, Scheme, SchemeSource, factory

__all__ = ["IntercomSource", "intercom"]


class IntercomSource(SchemeSource):
    """Intercom webhook notifications."""

    provider = "intercom"
    scheme = Scheme(
        Hmac("X-Hub-Signature", prefix="sha1=", digest="sha1"),
        event_id="id",
        event_type="topic",
        account="app_id",
        fingerprint_path="data",
        default_type="conversation.user.created",
        default_account="relaybox-test-app",
        example=lambda event: {
            "type": "notification_event",
            "app_id": event.account,
            "id": event.id,
            "topic": event.type,
            "delivery_attempts": 1,
            "first_sent_at": int(event.now),
            "created_at": int(event.now),
            "data": {"type": "notification_event_data", "item": {"type": "conversation"}},
        },
    )


intercom = factory(IntercomSource, "An Intercom source; ``secrets`` are the app's client secrets.")
