"""PagerDuty V3 webhooks: ``X-PagerDuty-Signature: v1=<hex>[,v1=<hex>]``.

What is signed: the raw body, HMAC-SHA256 in hex keyed with the subscription's
secret; the header holds one ``v1`` entry per active secret and any may match. No
timestamp: no tolerance.

Identity: ``event.id`` (the same on PagerDuty's retries), ``event.event_type``
(``incident.triggered``) as the type, and ``event.account.id`` as the account.
"""

from __future__ import annotations

from relaybox.sources.scheme import Entries, Hmac, Scheme, SchemeSource, factory

__all__ = ["PagerDutySource", "pagerduty"]


class PagerDutySource(SchemeSource):
    """PagerDuty V3 webhook subscriptions."""

    provider = "pagerduty"
    scheme = Scheme(
        Hmac("X-PagerDuty-Signature", entries=Entries(timestamp=None)),
        event_id="event.id",
        event_type="event.event_type",
        account="event.account.id",
        default_type="incident.triggered",
        default_account="PRELAYB",
        example=lambda event: {
            "event": {
                "id": event.id,
                "event_type": event.type,
                "resource_type": "incident",
                "occurred_at": event.iso,
                "agent": None,
                "client": None,
                "account": {"id": event.account, "type": "account_reference"},
                "data": {"id": "PGR0VU2", "type": "incident", "title": "relaybox test"},
            }
        },
    )


pagerduty = factory(PagerDutySource, "A PagerDuty source; ``secrets`` are subscription secrets.")
