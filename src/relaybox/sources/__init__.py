"""Inbound sources: one module per provider, and factories to configure them.

    box.source("stripe", sources.stripe(secrets=["whsec_..."]))

Each factory takes ``secrets`` plus any :class:`Source` argument (``tolerance``,
``verify_timestamp``, ``max_body``, ``max_signatures``, ``max_json_depth``,
``account``, ``tenant``, ``tenants``, ``ignore_types``, ``inline``,
``fingerprint_path``, ``version_path``, ``name``) and
its provider's own options (only :func:`hmac` has some). :func:`from_config` builds
the same from a TOML table.

``relaybox.sources.stripe`` is the factory (it shares its module's name); import
classes from this package. A provider described as data is a
:class:`~relaybox.sources.scheme.Scheme` on its class (:mod:`relaybox.sources.scheme`):
a row of the preset tables :mod:`relaybox.sources.providers` and
:mod:`relaybox.sources.timestamped` (HMAC signers) and :mod:`relaybox.sources.unsigned`
(HTTP Basic, tokens) when that is all it is, else a
module of its own; ``PROVIDERS`` and :func:`from_config` live in
:mod:`relaybox.sources.registry`.
"""

from __future__ import annotations

from relaybox.sources.adyen import AdyenSource, adyen
from relaybox.sources.asana import AsanaSource, asana
from relaybox.sources.base import Headers, Identity, Secret, Source, Verified
from relaybox.sources.discord import DiscordSource, discord
from relaybox.sources.github import GitHubSource, github
from relaybox.sources.handshakes import (
    DropboxSource,
    MicrosoftGraphSource,
    TwitterSource,
    dropbox,
    msgraph,
    twitter,
)
from relaybox.sources.hmac import HmacSource, hmac
from relaybox.sources.hubspot import HubSpotSource, hubspot
from relaybox.sources.mailgun import MailgunSource, mailgun
from relaybox.sources.notion import NotionSource, notion
from relaybox.sources.okta import OktaSource, okta
from relaybox.sources.postmark import PostmarkSource, postmark
from relaybox.sources.presets import ClerkSource, ResendSource, clerk, resend
from relaybox.sources.providers import (
    BitbucketSource,
    CoinbaseCommerceSource,
    DocuSignSource,
    IntercomSource,
    LemonSqueezySource,
    PagerDutySource,
    RazorpaySource,
    SentrySource,
    SquareSource,
    TypeformSource,
    VercelSource,
    bitbucket,
    coinbase_commerce,
    docusign,
    intercom,
    lemonsqueezy,
    pagerduty,
    razorpay,
    sentry,
    square,
    typeform,
    vercel,
)
from relaybox.sources.registry import PROVIDERS as PROVIDERS
from relaybox.sources.registry import from_config
from relaybox.sources.sendgrid import SendGridSource, sendgrid
from relaybox.sources.shopify import ShopifySource, shopify
from relaybox.sources.slack import SlackSource, slack
from relaybox.sources.standard import StandardSource, standard
from relaybox.sources.stripe import StripeSource, stripe
from relaybox.sources.timestamped import (
    BoxSource,
    CalendlySource,
    LinearSource,
    PaddleSource,
    RecurlySource,
    WorkOSSource,
    ZendeskSource,
    box,
    calendly,
    linear,
    paddle,
    recurly,
    workos,
    zendesk,
)
from relaybox.sources.twilio import TwilioSource, twilio
from relaybox.sources.twitch import TwitchSource, twitch
from relaybox.sources.unsigned import (
    ChargebeeSource,
    GitLabSource,
    PipedriveSource,
    chargebee,
    gitlab,
    pipedrive,
)
from relaybox.sources.woocommerce import WooCommerceSource, woocommerce
from relaybox.sources.zoom import ZoomSource, zoom

__all__ = [
    "AdyenSource",
    "AsanaSource",
    "BitbucketSource",
    "BoxSource",
    "CalendlySource",
    "ChargebeeSource",
    "ClerkSource",
    "CoinbaseCommerceSource",
    "DiscordSource",
    "DocuSignSource",
    "DropboxSource",
    "GitHubSource",
    "GitLabSource",
    "Headers",
    "HmacSource",
    "HubSpotSource",
    "Identity",
    "IntercomSource",
    "LemonSqueezySource",
    "LinearSource",
    "MailgunSource",
    "MicrosoftGraphSource",
    "NotionSource",
    "OktaSource",
    "PaddleSource",
    "PagerDutySource",
    "PipedriveSource",
    "PostmarkSource",
    "RazorpaySource",
    "RecurlySource",
    "ResendSource",
    "Secret",
    "SendGridSource",
    "SentrySource",
    "ShopifySource",
    "SlackSource",
    "Source",
    "SquareSource",
    "StandardSource",
    "StripeSource",
    "TwilioSource",
    "TwitchSource",
    "TwitterSource",
    "TypeformSource",
    "VercelSource",
    "Verified",
    "WooCommerceSource",
    "WorkOSSource",
    "ZendeskSource",
    "ZoomSource",
    "adyen",
    "asana",
    "bitbucket",
    "box",
    "calendly",
    "chargebee",
    "clerk",
    "coinbase_commerce",
    "discord",
    "docusign",
    "dropbox",
    "from_config",
    "github",
    "gitlab",
    "hmac",
    "hubspot",
    "intercom",
    "lemonsqueezy",
    "linear",
    "mailgun",
    "msgraph",
    "notion",
    "okta",
    "paddle",
    "pagerduty",
    "pipedrive",
    "postmark",
    "razorpay",
    "recurly",
    "resend",
    "sendgrid",
    "sentry",
    "shopify",
    "slack",
    "square",
    "standard",
    "stripe",
    "twilio",
    "twitch",
    "twitter",
    "typeform",
    "vercel",
    "woocommerce",
    "workos",
    "zendesk",
    "zoom",
]
