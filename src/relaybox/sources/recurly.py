"""Recurly: ``recurly-signature: <timestamp>,<hex>[,<hex>]`` on JSON webhooks.

What is signed: ``f"{timestamp}.".encode() + body`` (the timestamp as sent),
HMAC-SHA256 in hex keyed with the webhook endpoint's secret key. The header holds
the timestamp then one signature per active key (two for 24 hours after a key is
regenerated); any may match. The timestamp is documented in milliseconds and shown
in seconds in Recurly's example, so both are read (milliseconds above 10**12) and
checked against ``tolerance``. XML webhooks are not signed and are not accepted.

Identity: the notification's ``id``, ``{object_type}.{event_type}``
(``subscription.created``) as the type, and ``site_id`` as the account.
"""

from __future__ import annotations

from relaybox.sources.scheme import Entries, Hmac, Scheme, SchemeSource, factory

__all__ = ["RecurlySource", "recurly"]


class RecurlySource(SchemeSource):
    """Recurly JSON webhooks."""

    provider = "recurly"
    scheme = Scheme(
        Hmac(
            "recurly-signature",
            "{timestamp}.{body}",
            entries=Entries(positional=True),
            unit="auto",
        ),
        event_id="id",
        event_type="{object_type}.{event_type}",
        account="site_id",
        default_type="subscription.created",
        default_account="relaybox-site",
        example=lambda event: {
            "id": event.id,
            "object_type": event.type.partition(".")[0],
            "site_id": event.account,
            "event_type": event.type.partition(".")[2] or "created",
            "event_time": event.iso,
            "account_code": "relaybox-account",
            "uuid": "5f6a8c2b3d4e4f5a9b0c1d2e3f4a5b6c",
        },
    )


recurly = factory(RecurlySource, "A Recurly source; ``secrets`` are webhook endpoint secret keys.")
