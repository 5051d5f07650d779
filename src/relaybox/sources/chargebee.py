"""Chargebee: HTTP Basic credentials on the webhook, no signature.

Chargebee signs nothing; a webhook endpoint is protected by HTTP Basic
authentication (its username and password). The secret is ``"user:password"``
(compared in constant time). No timestamp: no tolerance.

Identity: ``id`` (``ev_...``, the same on Chargebee's retries), ``event_type``
(``subscription_created``) as the type and ``api_version`` as the version.
"""

from __future__ import annotations

from relaybox.sources.scheme import BasicAuth, Scheme, SchemeSource, factory

__all__ = ["ChargebeeSource", "chargebee"]


class ChargebeeSource(SchemeSource):
    """Chargebee webhooks."""

    provider = "chargebee"
    scheme = Scheme(
        BasicAuth(),
        event_id="id",
        event_type="event_type",
        version="api_version",
        default_type="subscription_created",
        example=lambda event: {
            "id": event.id,
            "occurred_at": int(event.now),
            "source": "admin_console",
            "object": "event",
            "api_version": "v2",
            "content": {"subscription": {"id": "relaybox-sub", "status": "active"}},
            "event_type": event.type,
            "webhook_status": "scheduled",
        },
    )


chargebee = factory(ChargebeeSource, "A Chargebee source; ``secrets`` are ``user:password``.")
