"""Linear: ``Linear-Signature: <hex HMAC-SHA256 of the body>``.

What is signed: the raw body, HMAC-SHA256 in hex keyed with the webhook's signing
secret. The body's ``webhookTimestamp`` (milliseconds, when the request was sent) is
checked against ``tolerance``; Linear suggests one minute, the default here.

Identity: Linear's ``Linear-Delivery`` header is documented as identifying the
delivery, not the event, and whether a retry repeats it is not documented, so
relaybox derives ``{webhookId}:{type}:{action}:{data.id}:{createdAt}`` (the entity,
what happened to it and when; a retry repeats all of them). The type is
``{type}.{action}`` (``Issue.create``), the account ``organizationId``. Each retry
is sent with a new ``webhookTimestamp``, so the fingerprint leaves it out.
"""

from __future__ import annotations

from relaybox.sources.scheme import Hmac, Scheme, SchemeSource, factory

__all__ = ["LinearSource", "linear"]


class LinearSource(SchemeSource):
    """Linear data-change webhooks."""

    provider = "linear"
    scheme = Scheme(
        Hmac("Linear-Signature", timestamp="webhookTimestamp", unit="ms"),
        event_id="{webhookId?}:{type}:{action}:{data.id?}:{createdAt?}",
        event_type="{type}.{action}",
        account="organizationId",
        tolerance=60.0,
        unstable=("webhookTimestamp",),
        default_type="Issue.create",
        default_account="relaybox-test-org",
        example=lambda event: {
            "action": event.type.partition(".")[2] or "create",
            "type": event.type.partition(".")[0],
            "createdAt": "2023-11-14T22:13:20.000Z",
            "data": {"id": event.id, "title": "relaybox test"},
            "url": "https://linear.app/relaybox/issue/TEST-1",
            "organizationId": event.account,
            "webhookId": "relaybox-test-webhook",
            "webhookTimestamp": event.ms,
        },
        headers=lambda event: {
            "Linear-Delivery": event.id,
            "Linear-Event": event.type.partition(".")[0],
        },
    )


linear = factory(LinearSource, "A Linear source; ``secrets`` are webhook signing secrets.")
