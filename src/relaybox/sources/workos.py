"""WorkOS: ``WorkOS-Signature: t=<ms>, v1=<hex>``.

What is signed: ``f"{t}.".encode() + body`` (``t`` in milliseconds, as sent),
HMAC-SHA256 in hex keyed with the endpoint's secret, as the ``workos`` package's
``webhooks.verify_header`` computes it. The timestamp is checked against
``tolerance``; WorkOS's SDK allows 180 seconds, the default.

Identity: ``id`` (``event_...``, the same on WorkOS's retries) and ``event``
(``user.created``) as the type.
"""

from __future__ import annotations

from relaybox.sources.scheme import Entries, Hmac, Scheme, SchemeSource, factory

__all__ = ["WorkOSSource", "workos"]


class WorkOSSource(SchemeSource):
    """WorkOS webhooks."""

    provider = "workos"
    scheme = Scheme(
        Hmac("WorkOS-Signature", "{timestamp}.{body}", entries=Entries(", "), unit="ms"),
        event_id="id",
        event_type="event",
        tolerance=180.0,
        default_type="user.created",
        example=lambda event: {
            "id": event.id,
            "event": event.type,
            "data": {"object": "user", "id": "user_relaybox", "email": "alice@example.com"},
            "created_at": event.iso,
        },
    )


workos = factory(WorkOSSource, "A WorkOS source; ``secrets`` are webhook endpoint secrets.")
