"""Inbound sources: one module per provider, and factories to configure them.

    box.source("stripe", sources.stripe(secrets=["whsec_..."]))

Each factory takes ``secrets`` plus any :class:`Source` argument (``tolerance``,
``verify_timestamp``, ``max_body``, ``max_signatures``, ``max_json_depth``,
``account``, ``tenant``, ``tenants``, ``ignore_types``, ``inline``,
``fingerprint_path``, ``version_path``, ``name``) and
its provider's own options (only :func:`hmac` has some). :func:`from_config` builds
the same from a TOML table.

The factories share their modules' names, so ``relaybox.sources.stripe`` is the
factory; import classes from the modules (``from relaybox.sources.stripe import
StripeSource``) or from this package. A provider described as data is a
:class:`~relaybox.sources.scheme.Scheme` on its class (:mod:`relaybox.sources.scheme`);
``PROVIDERS`` and :func:`from_config` live in :mod:`relaybox.sources.registry`.
"""

from __future__ import annotations

from relaybox.sources.adyen import AdyenSource, adyen
from relaybox.sources.base import Headers, Identity, Secret, Source, Verified
from relaybox.sources.bitbucket import BitbucketSource, bitbucket
from relaybox.sources.calendly import CalendlySource, calendly
from relaybox.sources.discord import DiscordSource, discord
from relaybox.sources.github import GitHubSource, github
from relaybox.sources.gitlab import GitLabSource, gitlab
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
from relaybox.sources.intercom import IntercomSource, intercom
from relaybox.sources.lemonsqueezy import LemonSqueezySource, lemonsqueezy
from relaybox.sources.linear import LinearSource, linear
from relaybox.sources.mailgun import MailgunSource, mailgun
from relaybox.sources.paddle import PaddleSource, paddle
from relaybox.sources.postmark import PostmarkSource, postmark
from relaybox.sources.presets import ClerkSource, ResendSource, clerk, resend
from relaybox.sources.registry import PROVIDERS as PROVIDERS
from relaybox.sources.registry import from_config
from relaybox.sources.sendgrid import SendGridSource, sendgrid
from relaybox.sources.shopify import ShopifySource, shopify
from relaybox.sources.slack import SlackSource, slack
from relaybox.sources.square import SquareSource, square
from relaybox.sources.standard import StandardSource, standard
from relaybox.sources.stripe import StripeSource, stripe
from relaybox.sources.twilio import TwilioSource, twilio
from relaybox.sources.typeform import TypeformSource, typeform
from relaybox.sources.woocommerce import WooCommerceSource, woocommerce
from relaybox.sources.zoom import ZoomSource, zoom

__all__ = [
    "AdyenSource",
    "BitbucketSource",
    "CalendlySource",
    "ClerkSource",
    "DiscordSource",
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
    "PaddleSource",
    "PostmarkSource",
    "ResendSource",
    "Secret",
    "SendGridSource",
    "ShopifySource",
    "SlackSource",
    "Source",
    "SquareSource",
    "StandardSource",
    "StripeSource",
    "TwilioSource",
    "TwitterSource",
    "TypeformSource",
    "Verified",
    "WooCommerceSource",
    "ZoomSource",
    "adyen",
    "bitbucket",
    "calendly",
    "clerk",
    "discord",
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
    "paddle",
    "postmark",
    "resend",
    "sendgrid",
    "shopify",
    "slack",
    "square",
    "standard",
    "stripe",
    "twilio",
    "twitter",
    "typeform",
    "woocommerce",
    "zoom",
]
