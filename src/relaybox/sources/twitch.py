"""Twitch EventSub: ``Twitch-Eventsub-Message-Signature: sha256=<hex>``.

What is signed: the ``Twitch-Eventsub-Message-Id`` header, then the
``Twitch-Eventsub-Message-Timestamp`` header (RFC 3339, as sent), then the raw body;
HMAC-SHA256 in hex keyed with the subscription's secret, as the ``twitchAPI``
package's EventSub webhook checks it. The timestamp is checked against
``tolerance``; Twitch asks to refuse messages older than 10 minutes, the default.

``webhook_callback_verification`` (sent when a subscription is created) is answered,
once its signature matched, with the ``challenge`` as ``text/plain``; nothing is
stored.

Identity: the message id (the same on Twitch's retries), ``subscription.type``
(``channel.follow``) as the type, ``revocation`` for a revoked subscription, and
``subscription.condition.broadcaster_user_id`` as the account.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from relaybox.errors import MalformedPayload
from relaybox.sources.base import Headers, Identity, Verified
from relaybox.sources.hooks import Answer
from relaybox.sources.kit import text
from relaybox.sources.scheme import Example, Hmac, Sample, Scheme, SchemeSource, factory

__all__ = ["TwitchSource", "twitch"]

_KIND = "twitch-eventsub-message-type"
_VERIFICATION = "webhook_callback_verification"


def _example(event: Example) -> dict[str, Any]:
    subscription = {
        "id": "f1c2a387-161a-49f9-a165-0f21d7a4e1c4",
        "status": "enabled",
        "type": event.type,
        "version": "1",
        "condition": {"broadcaster_user_id": event.account},
        "transport": {"method": "webhook", "callback": "https://example.com/webhooks/twitch"},
        "created_at": event.iso,
    }
    return {
        "subscription": subscription,
        "event": {"user_id": "1337", "user_login": "awesome_user", "followed_at": event.iso},
    }


class TwitchSource(SchemeSource):
    """Twitch EventSub webhooks."""

    provider = "twitch"
    scheme = Scheme(
        Hmac(
            "Twitch-Eventsub-Message-Signature",
            "{id}{timestamp}{body}",
            prefix="sha256=",
            timestamp="header:Twitch-Eventsub-Message-Timestamp",
            unit="iso",
        ),
        event_id="header:Twitch-Eventsub-Message-Id",
        event_type="subscription.type",
        account="subscription.condition.broadcaster_user_id",
        tolerance=600.0,
        sample=Sample(
            type="channel.follow",
            account="12826",
            body=_example,
            headers=lambda event: {
                "Twitch-Eventsub-Message-Type": "notification",
                "Twitch-Eventsub-Subscription-Type": event.type,
                "Twitch-Eventsub-Subscription-Version": "1",
            },
        ),
    )

    def identify(self, headers: Headers, payload: Any) -> Identity:
        identity = super().identify(headers, payload)
        kind = (headers.get(_KIND) or "").strip()
        if kind in (_VERIFICATION, "revocation"):
            return replace(identity, event_type=kind)
        return identity

    def challenge(self, verified: Verified) -> Answer | None:
        if verified.event_type != _VERIFICATION:
            return None
        payload = verified.payload
        value = text(payload.get("challenge")) if isinstance(payload, Mapping) else None
        if value is None:
            raise MalformedPayload("webhook_callback_verification has no challenge")
        return Answer.text(value)


twitch = factory(TwitchSource, "A Twitch EventSub source; ``secrets`` are subscription secrets.")
