"""Vercel: ``x-vercel-signature: <hex HMAC-SHA1 of the body>``.

What is signed: the raw body, HMAC-SHA1 in hex keyed with the webhook's secret (or
the integration's client secret for an integration's webhooks). No timestamp: no
tolerance.

Identity: ``id`` (the same on Vercel's retries), ``type``
(``deployment.succeeded``) and ``payload.team.id`` as the account.
"""

from __future__ import annotations

from relaybox.sources.scheme import Hmac, Scheme, SchemeSource, factory

__all__ = ["VercelSource", "vercel"]


class VercelSource(SchemeSource):
    """Vercel webhooks."""

    provider = "vercel"
    scheme = Scheme(
        Hmac("x-vercel-signature", digest="sha1"),
        event_id="id",
        event_type="type",
        account="payload.team.id",
        default_type="deployment.succeeded",
        default_account="team_relaybox",
        example=lambda event: {
            "id": event.id,
            "type": event.type,
            "createdAt": event.ms,
            "region": "iad1",
            "payload": {
                "team": {"id": event.account},
                "user": {"id": "relaybox-user"},
                "deployment": {"id": "dpl_relaybox", "url": "relaybox.vercel.app"},
            },
        },
    )


vercel = factory(VercelSource, "A Vercel source; ``secrets`` are webhook (or client) secrets.")
