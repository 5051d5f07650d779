"""Okta event hooks: a shared secret in the ``Authorization`` header, and a GET challenge.

Okta signs nothing: an event hook is configured with an authentication header whose
value Okta sends as is; relaybox reads ``Authorization`` (configure that header name
in Okta) and compares it in constant time with the secrets.

The one-time verification is a ``GET`` with ``X-Okta-Verification-Challenge``,
answered ``{"verification": <the header's value>}`` before any check; nothing is
stored (the echo grants nothing).

Identity: ``eventId``, the first event's ``eventType`` in ``data.events``
(``user.session.start``) as the type. No timestamp: no tolerance.
"""

from __future__ import annotations

from relaybox.sources.hooks import Answer, Request
from relaybox.sources.scheme import Sample, Scheme, SchemeSource, Token, factory

__all__ = ["OktaSource", "okta"]

_CHALLENGE = "x-okta-verification-challenge"
MAX_CHALLENGE_CHARS = 256


class OktaSource(SchemeSource):
    """Okta event hooks."""

    provider = "okta"
    scheme = Scheme(
        Token("Authorization"),
        event_id="eventId",
        event_type="data.events.0.eventType",
        sample=Sample(
            type="user.session.start",
            body=lambda event: {
                "eventType": "com.okta.event_hook",
                "eventTypeVersion": "1.0",
                "cloudEventsVersion": "0.1",
                "source": "https://relaybox.okta.com/api/v1/eventHooks/whoql0HfiLGPWc8Jx0g3",
                "eventId": event.id,
                "data": {"events": [{"uuid": event.id, "eventType": event.type, "version": "0"}]},
                "eventTime": event.iso,
                "contentType": "application/json",
            },
        ),
    )

    def handshake(self, request: Request) -> Answer | None:
        value = (request.headers.get(_CHALLENGE) or "").strip()
        if request.method != "GET" or not value or len(value) > MAX_CHALLENGE_CHARS:
            return None
        return Answer.json({"verification": value})


okta = factory(OktaSource, "An Okta event hook source; ``secrets`` are the Authorization values.")
