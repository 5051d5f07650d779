"""Calendly: ``Calendly-Webhook-Signature: t=<unix>,v1=<hex>``.

What is signed: ``f"{t}.".encode() + body``, HMAC-SHA256 in hex keyed with the
webhook subscription's signing key. The timestamp is checked against ``tolerance``
in both directions; Calendly's example allows 3 minutes, the default here.

Calendly sends no event id. relaybox derives ``{event}:{payload.uri}``: the
invitee (or routing form submission) URI with what happened to it
(``invitee.created``, ``invitee.canceled``) happens once, and a retry repeats both.
The type is ``event``.
"""

from __future__ import annotations

from relaybox.sources.scheme import Entries, Hmac, Scheme, SchemeSource, factory

__all__ = ["CalendlySource", "calendly"]

DEFAULT_TOLERANCE = 180.0


class CalendlySource(SchemeSource):
    """Calendly webhook subscriptions (API v2)."""

    provider = "calendly"
    scheme = Scheme(
        Hmac("Calendly-Webhook-Signature", "{timestamp}.{body}", entries=Entries()),
        event_id="{event}:{payload.uri}",
        event_type="event",
        tolerance=DEFAULT_TOLERANCE,
        default_type="invitee.created",
        example=lambda event: {
            "created_at": "2023-11-14T22:13:20.000000Z",
            "created_by": "https://api.calendly.com/users/RELAYBOX",
            "event": event.type,
            "payload": {
                "uri": f"https://api.calendly.com/scheduled_events/RELAYBOX/invitees/{event.id}",
                "email": "alice@example.com",
                "status": "active",
            },
        },
    )


calendly = factory(CalendlySource, "A Calendly source; ``secrets`` are webhook signing keys.")
