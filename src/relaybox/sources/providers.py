"""Providers that sign the body with an HMAC and are data only: a
:class:`~relaybox.sources.preset_rows.Preset` row each, its scheme (the signature
headers, what is signed, digest, encoding, where the event id, type and account live,
an example event) and its names. Each row is published here as ``<Name>Source`` and
the ``relaybox.sources.<provider>`` factory
(:func:`~relaybox.sources.preset_rows.publish`); docs/providers.md describes them all.

Those whose HMAC also signs a timestamp, checked against ``tolerance``, are in
:mod:`relaybox.sources.timestamped`; those that sign nothing (HTTP Basic credentials, a
token) in :mod:`relaybox.sources.unsigned`. A provider whose verification, identity or
handshake does something a scheme cannot say keeps a module of its own (``stripe.py``,
``github.py``, ``slack.py``, ...).
"""

from __future__ import annotations

from relaybox.sources.preset_rows import Preset, publish_all
from relaybox.sources.scheme import Entries, Hmac, Sample, Scheme

__all__ = [
    "PRESETS",
    "PUBLISHED",
    "BitbucketSource",
    "CoinbaseCommerceSource",
    "DocuSignSource",
    "IntercomSource",
    "LemonSqueezySource",
    "PagerDutySource",
    "RazorpaySource",
    "SentrySource",
    "SquareSource",
    "TypeformSource",
    "VercelSource",
    "bitbucket",
    "coinbase_commerce",
    "docusign",
    "intercom",
    "lemonsqueezy",
    "pagerduty",
    "razorpay",
    "sentry",
    "square",
    "typeform",
    "vercel",
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
)

PUBLISHED = publish_all(PRESETS, __name__)
"""Each provider's class and factory, by provider name."""

BitbucketSource, bitbucket = PUBLISHED["bitbucket"]
CoinbaseCommerceSource, coinbase_commerce = PUBLISHED["coinbase_commerce"]
DocuSignSource, docusign = PUBLISHED["docusign"]
IntercomSource, intercom = PUBLISHED["intercom"]
LemonSqueezySource, lemonsqueezy = PUBLISHED["lemonsqueezy"]
PagerDutySource, pagerduty = PUBLISHED["pagerduty"]
RazorpaySource, razorpay = PUBLISHED["razorpay"]
SentrySource, sentry = PUBLISHED["sentry"]
SquareSource, square = PUBLISHED["square"]
TypeformSource, typeform = PUBLISHED["typeform"]
VercelSource, vercel = PUBLISHED["vercel"]
