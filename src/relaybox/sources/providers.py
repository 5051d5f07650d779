"""Providers that sign with an HMAC and are data only: a
:class:`~relaybox.sources.scheme.Preset` row each, its scheme (the signature headers,
what is signed, digest, encoding, tolerance, where the event id, type and account
live, an example event) and its names. Each row is published here as
``<Name>Source`` and the ``relaybox.sources.<provider>`` factory
(:func:`~relaybox.sources.scheme.publish`); docs/providers.md describes them all.

Providers that sign nothing (HTTP Basic credentials, a token) are in
:mod:`relaybox.sources.unsigned`. A provider whose verification, identity or
handshake does something a scheme cannot say keeps a module of its own
(``stripe.py``, ``github.py``, ``slack.py``, ...).
"""

from __future__ import annotations

from relaybox.sources.scheme import Entries, Hmac, Preset, Sample, Scheme, publish_all

__all__ = [
    "PRESETS",
    "PUBLISHED",
    "BitbucketSource",
    "BoxSource",
    "CalendlySource",
    "CoinbaseCommerceSource",
    "DocuSignSource",
    "IntercomSource",
    "LemonSqueezySource",
    "LinearSource",
    "PaddleSource",
    "PagerDutySource",
    "RazorpaySource",
    "RecurlySource",
    "SentrySource",
    "SquareSource",
    "TypeformSource",
    "VercelSource",
    "WorkOSSource",
    "ZendeskSource",
    "bitbucket",
    "box",
    "calendly",
    "coinbase_commerce",
    "docusign",
    "intercom",
    "lemonsqueezy",
    "linear",
    "paddle",
    "pagerduty",
    "razorpay",
    "recurly",
    "sentry",
    "square",
    "typeform",
    "vercel",
    "workos",
    "zendesk",
]

DOCUSIGN_KEYS = 10
"""Signature headers read: DocuSign signs with each active key, numbered from 1."""

PRESETS: tuple[Preset, ...] = (
    Preset(
        "bitbucket",
        "BitbucketSource",
        Scheme(
            Hmac("X-Hub-Signature", prefix="sha256="),
            event_id="header:X-Request-UUID",
            event_type="header:X-Event-Key",
            account="header:X-Hook-UUID",
            sample=Sample(
                type="repo:push",
                account="{relaybox-test-hook}",
                body=lambda event: {
                    "repository": {"full_name": "relaybox/test", "uuid": "{relaybox-test-repo}"},
                    "actor": {"display_name": "relaybox"},
                    "push": {"changes": []},
                },
            ),
        ),
        doc="""Bitbucket Cloud webhooks. Whether a retry keeps ``X-Request-UUID`` is not
        documented: a retry with a new one is stored as a second event of the same content.""",
        factory_doc="A Bitbucket Cloud source; ``secrets`` are webhook secrets.",
    ),
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
        "coinbase_commerce",
        "CoinbaseCommerceSource",
        Scheme(
            Hmac("X-CC-Webhook-Signature"),
            event_id="event.id",
            event_type="event.type",
            fingerprint_path="event",
            sample=Sample(
                type="charge:confirmed",
                body=lambda event: {
                    "id": 1,
                    "scheduled_for": event.iso,
                    "attempt_number": 1,
                    "event": {
                        "id": event.id,
                        "resource": "event",
                        "type": event.type,
                        "api_version": "2018-03-22",
                        "created_at": event.iso,
                        "data": {"code": "RELAYBOX", "pricing_type": "fixed_price"},
                    },
                },
            ),
        ),
        doc="""Coinbase Commerce webhook subscriptions, as the ``coinbase-commerce``
        package's ``WebhookSignature`` signs them. The delivery's own ``id`` and
        ``attempt_number`` change with each attempt: the event inside it is the identity
        and the fingerprint.""",
        factory_doc="A Coinbase Commerce source; ``secrets`` are webhook shared secrets.",
    ),
    Preset(
        "docusign",
        "DocuSignSource",
        Scheme(
            Hmac(
                tuple(f"X-DocuSign-Signature-{n}" for n in range(1, DOCUSIGN_KEYS + 1)),
                encoding="base64",
            ),
            event_id="{data.envelopeId}:{event}:{generatedDateTime}",
            event_type="event",
            account="data.accountId",
            unstable=("retryCount",),
            sample=Sample(
                type="envelope-completed",
                account="a1b2c3d4-0000-4000-8000-relayboxtest",
                body=lambda event: {
                    "event": event.type,
                    "apiVersion": "v2.1",
                    "uri": f"/restapi/v2.1/accounts/{event.account}/envelopes/{event.id}",
                    "retryCount": 0,
                    "configurationId": 10001,
                    "generatedDateTime": event.iso,
                    "data": {
                        "accountId": event.account,
                        "userId": "relaybox",
                        "envelopeId": event.id,
                    },
                },
            ),
        ),
        doc="""DocuSign Connect notifications (JSON, HMAC): one signature header per
        active Connect HMAC key, numbered from 1; any may match any secret. DocuSign sends
        no event id; a retry repeats the envelope, the event and ``generatedDateTime``.""",
        factory_doc="A DocuSign Connect source; ``secrets`` are Connect HMAC keys.",
    ),
    Preset(
        "intercom",
        "IntercomSource",
        Scheme(
            Hmac("X-Hub-Signature", prefix="sha1=", digest="sha1"),
            event_id="id",
            event_type="topic",
            account="app_id",
            fingerprint_path="data",
            sample=Sample(
                type="conversation.user.created",
                account="relaybox-test-app",
                body=lambda event: {
                    "type": "notification_event",
                    "app_id": event.account,
                    "id": event.id,
                    "topic": event.type,
                    "delivery_attempts": 1,
                    "first_sent_at": int(event.now),
                    "created_at": int(event.now),
                    "data": {"type": "notification_event_data", "item": {"type": "conversation"}},
                },
            ),
        ),
        doc="""Intercom webhook notifications. A retry raises ``delivery_attempts``, so
        only ``data`` counts for the fingerprint.""",
        factory_doc="An Intercom source; ``secrets`` are the app's client secrets.",
    ),
    Preset(
        "lemonsqueezy",
        "LemonSqueezySource",
        Scheme(
            Hmac("X-Signature"),
            event_id="{meta.event_name}:{data.type}:{data.id}:{data.attributes.updated_at?}",
            event_type="meta.event_name",
            account="data.attributes.store_id",
            sample=Sample(
                type="order_created",
                body=lambda event: {
                    "meta": {"event_name": event.type, "test_mode": True},
                    "data": {
                        "type": "orders",
                        "id": event.id,
                        "attributes": {
                            "store_id": 1,
                            "status": "paid",
                            "updated_at": int(event.now),
                        },
                    },
                },
                headers=lambda event: {"X-Event-Name": event.type},
            ),
        ),
        doc="""Lemon Squeezy webhooks. Lemon Squeezy sends no event id: a resend
        carries the same object at the same ``updated_at``; a later change of the object
        has a new ``updated_at`` and is its own event.""",
        factory_doc="A Lemon Squeezy source; ``secrets`` are webhook signing secrets.",
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
        "pagerduty",
        "PagerDutySource",
        Scheme(
            Hmac("X-PagerDuty-Signature", entries=Entries(timestamp=None)),
            event_id="event.id",
            event_type="event.event_type",
            account="event.account.id",
            sample=Sample(
                type="incident.triggered",
                account="PRELAYB",
                body=lambda event: {
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
            ),
        ),
        doc="""PagerDuty V3 webhook subscriptions: one ``v1`` entry per active secret.""",
        factory_doc="A PagerDuty source; ``secrets`` are subscription secrets.",
    ),
    Preset(
        "razorpay",
        "RazorpaySource",
        Scheme(
            Hmac("X-Razorpay-Signature"),
            event_id="header:X-Razorpay-Event-Id",
            event_type="event",
            account="account_id",
            sample=Sample(
                type="payment.captured",
                account="acc_RelayboxTest01",
                body=lambda event: {
                    "entity": "event",
                    "account_id": event.account,
                    "event": event.type,
                    "contains": ["payment"],
                    "payload": {"payment": {"entity": {"id": "pay_relaybox", "amount": 2000}}},
                    "created_at": int(event.now),
                },
            ),
        ),
        doc="""Razorpay webhooks, as the ``razorpay`` package's
        ``Utility.verify_webhook_signature`` checks them.""",
        factory_doc="A Razorpay source; ``secrets`` are webhook secrets.",
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
        "sentry",
        "SentrySource",
        Scheme(
            Hmac("Sentry-Hook-Signature"),
            event_id="header:Request-ID",
            event_type="{header:Sentry-Hook-Resource}.{action}",
            account="installation.uuid",
            sample=Sample(
                type="issue.created",
                account="7a485448-a9e2-4c85-8a3c-4f44175783c9",
                body=lambda event: {
                    "action": event.action or "created",
                    "installation": {"uuid": event.account},
                    "data": {"issue": {"id": "1170820242", "title": "relaybox test"}},
                    "actor": {"type": "application", "id": "sentry", "name": "Sentry"},
                },
                headers=lambda event: {
                    "Sentry-Hook-Resource": event.resource,
                    "Sentry-Hook-Timestamp": str(int(event.now)),
                },
            ),
        ),
        doc="""Sentry integration platform webhooks. ``Sentry-Hook-Timestamp`` is not signed,
        so it is not checked.""",
        factory_doc="A Sentry source; ``secrets`` are integrations' client secrets.",
    ),
    Preset(
        "square",
        "SquareSource",
        Scheme(
            Hmac("x-square-hmacsha256-signature", "{url}{body}", encoding="base64"),
            event_id="event_id",
            event_type="type",
            account="merchant_id",
            sample=Sample(
                type="payment.updated",
                account="MLRELAYBOXTEST",
                body=lambda event: {
                    "merchant_id": event.account,
                    "type": event.type,
                    "event_id": event.id,
                    "created_at": event.iso,
                    "data": {"type": "payment", "id": "relaybox-test", "object": {"payment": {}}},
                },
            ),
        ),
        doc="""Square webhook subscriptions, as the ``squareup`` package's
        ``verify_signature`` checks them: the notification URL exactly as configured
        (``url``; without it, the URL the request was made to), then the body.""",
        factory_doc=(
            "A Square source; ``secrets`` are signature keys; ``url`` the notification URL."
        ),
        url="exact",
    ),
    Preset(
        "typeform",
        "TypeformSource",
        Scheme(
            Hmac("Typeform-Signature", prefix="sha256=", encoding="base64"),
            event_id="event_id",
            event_type="event_type",
            account="form_response.form_id",
            sample=Sample(
                type="form_response",
                account="relaybox",
                body=lambda event: {
                    "event_id": event.id,
                    "event_type": event.type,
                    "form_response": {"form_id": event.account, "token": event.id, "answers": []},
                },
            ),
        ),
        doc="""Typeform webhooks.""",
        factory_doc="A Typeform source; ``secrets`` are webhook secrets.",
    ),
    Preset(
        "vercel",
        "VercelSource",
        Scheme(
            Hmac("x-vercel-signature", digest="sha1"),
            event_id="id",
            event_type="type",
            account="payload.team.id",
            sample=Sample(
                type="deployment.succeeded",
                account="team_relaybox",
                body=lambda event: {
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
            ),
        ),
        doc="""Vercel webhooks (keyed with the webhook's secret, or the integration's client
        secret for an integration's webhooks).""",
        factory_doc="A Vercel source; ``secrets`` are webhook (or client) secrets.",
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

BitbucketSource, bitbucket = PUBLISHED["bitbucket"]
BoxSource, box = PUBLISHED["box"]
CalendlySource, calendly = PUBLISHED["calendly"]
CoinbaseCommerceSource, coinbase_commerce = PUBLISHED["coinbase_commerce"]
DocuSignSource, docusign = PUBLISHED["docusign"]
IntercomSource, intercom = PUBLISHED["intercom"]
LemonSqueezySource, lemonsqueezy = PUBLISHED["lemonsqueezy"]
LinearSource, linear = PUBLISHED["linear"]
PaddleSource, paddle = PUBLISHED["paddle"]
PagerDutySource, pagerduty = PUBLISHED["pagerduty"]
RazorpaySource, razorpay = PUBLISHED["razorpay"]
RecurlySource, recurly = PUBLISHED["recurly"]
SentrySource, sentry = PUBLISHED["sentry"]
SquareSource, square = PUBLISHED["square"]
TypeformSource, typeform = PUBLISHED["typeform"]
VercelSource, vercel = PUBLISHED["vercel"]
WorkOSSource, workos = PUBLISHED["workos"]
ZendeskSource, zendesk = PUBLISHED["zendesk"]
