"""Providers whose HMAC signs a timestamp with the body, and that are data only: a
:class:`~relaybox.sources.preset_rows.Preset` row each, as in
:mod:`relaybox.sources.providers`. The timestamp travels in a header of its own, in
the signature header's entries or in the body; it is checked against ``tolerance``
(in both directions, after a signature matched), which stops a captured delivery
being replayed later.
"""

from __future__ import annotations

from relaybox.sources.preset_rows import Preset, publish_all
from relaybox.sources.scheme import Entries, Hmac, Sample, Scheme

__all__ = [
    "PRESETS",
    "PUBLISHED",
    "BoxSource",
    "CalendlySource",
    "LinearSource",
    "PaddleSource",
    "RecurlySource",
    "WorkOSSource",
    "ZendeskSource",
    "box",
    "calendly",
    "linear",
    "paddle",
    "recurly",
    "workos",
    "zendesk",
]

PRESETS: tuple[Preset, ...] = (
    Preset(
        "box",
        "BoxSource",
        Scheme(
            Hmac(
                ("BOX-SIGNATURE-PRIMARY", "BOX-SIGNATURE-SECONDARY"),
                "{body}{timestamp}",
                encoding="base64",
                timestamp="header:BOX-DELIVERY-TIMESTAMP",
                unit="iso",
            ),
            event_id="id",
            event_type="trigger",
            account="webhook.id",
            tolerance=600.0,
            sample=Sample(
                type="FILE.UPLOADED",
                account="1234567890",
                body=lambda event: {
                    "type": "webhook_event",
                    "id": event.id,
                    "created_at": event.iso,
                    "trigger": event.type,
                    "webhook": {"id": event.account, "type": "webhook"},
                    "source": {"id": "12345", "type": "file", "name": "relaybox.txt"},
                },
                headers=lambda event: {
                    "BOX-DELIVERY-ID": event.id,
                    "BOX-SIGNATURE-ALGORITHM": "HmacSHA256",
                    "BOX-SIGNATURE-VERSION": "1",
                },
            ),
        ),
        doc="""Box webhooks (V2), as ``box-sdk-gen``'s ``WebhooksManager.validate_message``
        checks them: configure the primary and the secondary key, either may match (a key
        is rotated). The body's ``id`` is kept by Box's retries, ``BOX-DELIVERY-ID`` is not.""",
        factory_doc="A Box source; ``secrets`` are the primary and secondary signature keys.",
    ),
    Preset(
        "calendly",
        "CalendlySource",
        Scheme(
            Hmac("Calendly-Webhook-Signature", "{timestamp}.{body}", entries=Entries()),
            event_id="{event}:{payload.uri}",
            event_type="event",
            tolerance=180.0,
            sample=Sample(
                type="invitee.created",
                body=lambda event: {
                    "created_at": "2023-11-14T22:13:20.000000Z",
                    "created_by": "https://api.calendly.com/users/RELAYBOX",
                    "event": event.type,
                    "payload": {
                        "uri": f"https://api.calendly.com/scheduled_events/RELAYBOX/invitees/{event.id}",
                        "email": "alice@example.com",
                        "status": "active",
                    },
                },
            ),
        ),
        doc="""Calendly webhook subscriptions (API v2). Calendly sends no event id: the
        invitee (or routing form submission) URI and what happened to it happen once, and
        a retry repeats both.""",
        factory_doc="A Calendly source; ``secrets`` are webhook signing keys.",
    ),
    Preset(
        "linear",
        "LinearSource",
        Scheme(
            Hmac("Linear-Signature", timestamp="webhookTimestamp", unit="ms"),
            event_id="{webhookId?}:{type}:{action}:{data.id?}:{createdAt?}",
            event_type="{type}.{action}",
            account="organizationId",
            tolerance=60.0,
            unstable=("webhookTimestamp",),
            sample=Sample(
                type="Issue.create",
                account="relaybox-test-org",
                body=lambda event: {
                    "action": event.action or "create",
                    "type": event.resource,
                    "createdAt": "2023-11-14T22:13:20.000Z",
                    "data": {"id": event.id, "title": "relaybox test"},
                    "url": "https://linear.app/relaybox/issue/TEST-1",
                    "organizationId": event.account,
                    "webhookId": "relaybox-test-webhook",
                    "webhookTimestamp": event.ms,
                },
                headers=lambda event: {
                    "Linear-Delivery": event.id,
                    "Linear-Event": event.resource,
                },
            ),
        ),
        doc="""Linear data-change webhooks. ``Linear-Delivery`` identifies a delivery, not
        the event, and whether a retry repeats it is not documented: the key is the
        entity, what happened to it and when. Each retry carries a new
        ``webhookTimestamp`` (signed, in the body), left out of the fingerprint.""",
        factory_doc="A Linear source; ``secrets`` are webhook signing secrets.",
    ),
    Preset(
        "paddle",
        "PaddleSource",
        Scheme(
            Hmac("Paddle-Signature", "{timestamp}:{body}", entries=Entries(";", "ts", "h1")),
            event_id="event_id",
            event_type="event_type",
            tolerance=5.0,
            sample=Sample(
                type="transaction.completed",
                body=lambda event: {
                    "event_id": event.id,
                    "event_type": event.type,
                    "occurred_at": event.iso,
                    "notification_id": "ntf_" + event.id,
                    "data": {"id": "txn_relaybox_test", "status": "completed"},
                },
            ),
        ),
        doc="""Paddle Billing notifications, as ``paddle-python-sdk``'s ``Verifier``
        computes them; 5 seconds of tolerance as its SDK (``tolerance`` widens it). Paddle
        Classic (``p_signature``, RSA) is another scheme, not supported.""",
        factory_doc=(
            "A Paddle Billing source; ``secrets`` are notification destination secret keys."
        ),
    ),
    Preset(
        "recurly",
        "RecurlySource",
        Scheme(
            Hmac(
                "recurly-signature",
                "{timestamp}.{body}",
                entries=Entries(positional=True),
                unit="auto",
            ),
            event_id="id",
            event_type="{object_type}.{event_type}",
            account="site_id",
            sample=Sample(
                type="subscription.created",
                account="relaybox-site",
                body=lambda event: {
                    "id": event.id,
                    "object_type": event.resource,
                    "site_id": event.account,
                    "event_type": event.action or "created",
                    "event_time": event.iso,
                    "account_code": "relaybox-account",
                    "uuid": "5f6a8c2b3d4e4f5a9b0c1d2e3f4a5b6c",
                },
            ),
        ),
        doc="""Recurly JSON webhooks (XML ones are not signed, and not accepted): the
        timestamp, then one signature per active key. The timestamp is documented in
        milliseconds and shown in seconds in Recurly's example: both are read.""",
        factory_doc="A Recurly source; ``secrets`` are webhook endpoint secret keys.",
    ),
    Preset(
        "workos",
        "WorkOSSource",
        Scheme(
            Hmac("WorkOS-Signature", "{timestamp}.{body}", entries=Entries(", "), unit="ms"),
            event_id="id",
            event_type="event",
            tolerance=180.0,
            sample=Sample(
                type="user.created",
                body=lambda event: {
                    "id": event.id,
                    "event": event.type,
                    "data": {"object": "user", "id": "user_relaybox", "email": "alice@example.com"},
                    "created_at": event.iso,
                },
            ),
        ),
        doc="""WorkOS webhooks, as the ``workos`` package's ``webhooks.verify_header``
        checks them (``t`` in milliseconds, 180 seconds of tolerance as its SDK).""",
        factory_doc="A WorkOS source; ``secrets`` are webhook endpoint secrets.",
    ),
    Preset(
        "zendesk",
        "ZendeskSource",
        Scheme(
            Hmac(
                "X-Zendesk-Webhook-Signature",
                "{timestamp}{body}",
                encoding="base64",
                timestamp="header:X-Zendesk-Webhook-Signature-Timestamp",
                unit="iso",
            ),
            event_id=("id", "header:X-Zendesk-Webhook-Invocation-Id"),
            event_type="type",
            account="account_id",
            sample=Sample(
                type="zen:event-type:ticket.created",
                account="10000001",
                body=lambda event: {
                    "account_id": int(event.account) if event.account.isdigit() else event.account,
                    "detail": {"id": "35436", "subject": "relaybox test", "status": "NEW"},
                    "event": {},
                    "id": event.id,
                    "subject": "zen:ticket:35436",
                    "time": event.iso,
                    "type": event.type,
                    "zendesk_event_version": "2022-11-06",
                },
                headers=lambda event: {"X-Zendesk-Webhook-Invocation-Id": event.id},
            ),
        ),
        doc="""Zendesk webhooks (Zendesk's documented ``base64(HMACSHA256(TIMESTAMP +
        BODY))``). A trigger or automation webhook sends the JSON you wrote: give it ``id``
        and ``type`` fields.""",
        factory_doc="A Zendesk source; ``secrets`` are webhook signing secrets.",
    ),
)

PUBLISHED = publish_all(PRESETS, __name__)
"""Each provider's class and factory, by provider name."""

BoxSource, box = PUBLISHED["box"]
CalendlySource, calendly = PUBLISHED["calendly"]
LinearSource, linear = PUBLISHED["linear"]
PaddleSource, paddle = PUBLISHED["paddle"]
RecurlySource, recurly = PUBLISHED["recurly"]
WorkOSSource, workos = PUBLISHED["workos"]
ZendeskSource, zendesk = PUBLISHED["zendesk"]
