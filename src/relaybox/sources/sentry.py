"""Sentry integration platform: ``Sentry-Hook-Signature: <hex HMAC-SHA256 of the body>``.

What is signed: the raw JSON body, HMAC-SHA256 in hex keyed with the integration's
client secret. ``Sentry-Hook-Timestamp`` is not signed, so it is not checked: no
tolerance.

Identity: the ``Request-ID`` header, ``{Sentry-Hook-Resource}.{action}``
(``issue.created``, ``event_alert.triggered``) as the type, and
``installation.uuid`` as the account.
"""

from __future__ import annotations

from relaybox.sources.scheme import Hmac, Scheme, SchemeSource, factory

__all__ = ["SentrySource", "sentry"]


class SentrySource(SchemeSource):
    """Sentry integration platform webhooks."""

    provider = "sentry"
    scheme = Scheme(
        Hmac("Sentry-Hook-Signature"),
        event_id="header:Request-ID",
        event_type="{header:Sentry-Hook-Resource}.{action}",
        account="installation.uuid",
        default_type="issue.created",
        default_account="7a485448-a9e2-4c85-8a3c-4f44175783c9",
        example=lambda event: {
            "action": event.type.partition(".")[2] or "created",
            "installation": {"uuid": event.account},
            "data": {"issue": {"id": "1170820242", "title": "relaybox test"}},
            "actor": {"type": "application", "id": "sentry", "name": "Sentry"},
        },
        headers=lambda event: {
            "Sentry-Hook-Resource": event.type.partition(".")[0],
            "Sentry-Hook-Timestamp": str(int(event.now)),
        },
    )


sentry = factory(SentrySource, "A Sentry source; ``secrets`` are integrations' client secrets.")
