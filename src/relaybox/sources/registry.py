"""Which provider name builds which source class, and building a source from a TOML table.

``PROVIDERS`` maps ``provider = "..."`` to its class; :func:`from_config` checks a
table's options against what the class (and :class:`Source`) accepts and builds it.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from relaybox.errors import ConfigurationError
from relaybox.sources import providers, timestamped, unsigned
from relaybox.sources.adyen import AdyenSource
from relaybox.sources.asana import AsanaSource
from relaybox.sources.base import Secret, Source
from relaybox.sources.discord import DiscordSource
from relaybox.sources.github import GitHubSource
from relaybox.sources.handshakes import DropboxSource, MicrosoftGraphSource, TwitterSource
from relaybox.sources.hmac import HmacSource
from relaybox.sources.hubspot import HubSpotSource
from relaybox.sources.mailgun import MailgunSource
from relaybox.sources.notion import NotionSource
from relaybox.sources.okta import OktaSource
from relaybox.sources.postmark import PostmarkSource
from relaybox.sources.presets import ClerkSource, ResendSource
from relaybox.sources.sendgrid import SendGridSource
from relaybox.sources.shopify import ShopifySource
from relaybox.sources.slack import SlackSource
from relaybox.sources.standard import StandardSource
from relaybox.sources.stripe import StripeSource
from relaybox.sources.twilio import TwilioSource
from relaybox.sources.twitch import TwitchSource
from relaybox.sources.woocommerce import WooCommerceSource
from relaybox.sources.zoom import ZoomSource

__all__ = ["BASE_OPTIONS", "PROVIDERS", "from_config"]

_BY_NAME: dict[str, type[Source]] = {
    **{name: cls for name, (cls, _) in providers.PUBLISHED.items()},
    **{name: cls for name, (cls, _) in timestamped.PUBLISHED.items()},
    **{name: cls for name, (cls, _) in unsigned.PUBLISHED.items()},
    "adyen": AdyenSource,
    "asana": AsanaSource,
    "clerk": ClerkSource,
    "discord": DiscordSource,
    "dropbox": DropboxSource,
    "github": GitHubSource,
    "hmac": HmacSource,
    "hubspot": HubSpotSource,
    "mailgun": MailgunSource,
    "msgraph": MicrosoftGraphSource,
    "notion": NotionSource,
    "okta": OktaSource,
    "postmark": PostmarkSource,
    "resend": ResendSource,
    "sendgrid": SendGridSource,
    "shopify": ShopifySource,
    "slack": SlackSource,
    "standard": StandardSource,
    "stripe": StripeSource,
    "twilio": TwilioSource,
    "twitch": TwitchSource,
    "twitter": TwitterSource,
    "woocommerce": WooCommerceSource,
    "zoom": ZoomSource,
}
PROVIDERS: dict[str, type[Source]] = dict(sorted(_BY_NAME.items()))

# Source.__init__ options as they can appear in TOML, with what they must be.
BASE_OPTIONS: dict[str, str] = {
    "tolerance": "a positive number of seconds",
    "verify_timestamp": "true or false",
    "max_body": "a whole number of bytes",
    "max_signatures": "a whole number of signature entries (1-1024)",
    "max_json_depth": "a whole number of nesting levels (1-512)",
    "account": "a string",
    "tenant": "a string",
    "tenants": "a table of account = tenant strings",
    "ignore_types": "a list of event type patterns",
    "inline": "true or false",
    "fingerprint_path": "a dotted JSON path",
    "version_path": "a path (header:Name or dotted JSON path)",
    "subject": "a dotted JSON path naming the subject an erasure finds (data.object.customer)",
    "name": "a string",
}
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")
_SECRET_KEYS = ("value", "account", "tenant")


def _provider_options(cls: type[Source]) -> set[str]:
    """Keyword arguments a provider class adds to :class:`Source`'s."""
    parameters = inspect.signature(cls.__init__).parameters.values()
    return {
        p.name
        for p in parameters
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in ("secrets", "self")
    }


def _required_options(cls: type[Source]) -> set[str]:
    parameters = inspect.signature(cls.__init__).parameters.values()
    return {
        p.name
        for p in parameters
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty
    }


def _secret(item: Any, where: str) -> Secret:
    if isinstance(item, str):
        if not item.strip():
            raise ConfigurationError(f"{where} is empty")
        return Secret(item)
    if isinstance(item, Mapping):
        unknown = sorted(set(item) - set(_SECRET_KEYS))
        if unknown:
            raise ConfigurationError(
                f"{where} has unknown key {unknown[0]!r}; expected {', '.join(_SECRET_KEYS)}"
            )
        value = item.get("value")
        if not isinstance(value, str) or not value.strip():
            raise ConfigurationError(f"{where} needs a non-empty string 'value'")
        for key in ("account", "tenant"):
            if item.get(key) is not None and not isinstance(item[key], str):
                raise ConfigurationError(f"{where}.{key} must be a string")
        return Secret(value, account=item.get("account"), tenant=item.get("tenant"))
    raise ConfigurationError(f"{where} must be a string or a table {{value, account, tenant}}")


def _secrets(provider: str, options: dict[str, Any]) -> list[Secret]:
    if "secret" in options and "secrets" in options:
        raise ConfigurationError(f"{provider} source: give either 'secret' or 'secrets', not both")
    if "secret" in options:
        return [_secret(options.pop("secret"), f"{provider} source: secret")]
    raw = options.pop("secrets", None)
    if raw is None:
        raise ConfigurationError(f"{provider} source needs 'secrets' (a list) or 'secret'")
    # A bare string would otherwise be iterated into one-character secrets.
    items = [raw] if isinstance(raw, (str, Mapping)) else raw
    if not isinstance(items, list | tuple) or not items:
        raise ConfigurationError(f"{provider} source: 'secrets' must be a non-empty list")
    return [_secret(item, f"{provider} source: secrets[{i}]") for i, item in enumerate(items)]


def _base_option(name: str, value: Any) -> Any:
    """Check (and coerce) one :class:`Source` option; ``None`` when invalid.

    ``RELAYBOX_SOURCES__NAME__OPTION`` environment variables arrive as strings, so
    numbers, booleans and comma-separated lists are also read from text.
    """
    if name in ("tolerance", "max_body", "max_signatures", "max_json_depth"):
        if isinstance(value, str):
            try:
                value = float(value) if name == "tolerance" else int(value)
            except ValueError:
                return None
        # bool is an int: `tolerance = true` is a mistake, not one second.
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        if name != "tolerance" and not isinstance(value, int):
            return None
        return value if value > 0 else None
    if name in ("verify_timestamp", "inline"):
        if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
            return value.strip().lower() in _TRUE
        return value if isinstance(value, bool) else None
    if name == "tenants":
        ok = isinstance(value, Mapping) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        )
        return dict(value) if ok else None
    if name == "ignore_types":
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        ok = isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
        return list(value) if ok else None
    return value if isinstance(value, str) else None


def from_config(
    provider: str | Mapping[str, Any], options: Mapping[str, Any] | None = None
) -> Source:
    """Build a source from a plain dict, as read from a TOML config file.

    Called as ``from_config("stripe", {...})``, or with the table alone when it
    names its provider (``from_config({"provider": "stripe", ...})``).
    ``secrets`` is a list of strings or tables ``{value, account, tenant}`` (a
    single string, or ``secret``, gives one secret). Unknown providers and options
    raise :class:`ConfigurationError` naming what is accepted; messages never
    include secret values.
    """
    if options is None:
        if not isinstance(provider, Mapping):
            raise ConfigurationError("source options must be a table")
        options = provider
        provider = options.get("provider", "")
        if not isinstance(provider, str) or not provider:
            raise ConfigurationError(
                f"source table needs provider = one of: {', '.join(PROVIDERS)}"
            )
    cls = PROVIDERS.get(provider) if isinstance(provider, str) else None
    if cls is None or not isinstance(provider, str):
        raise ConfigurationError(
            f"unknown source provider {provider!r}; expected one of: {', '.join(PROVIDERS)}"
        )
    if not isinstance(options, Mapping):
        raise ConfigurationError(f"{provider} source options must be a table")
    remaining = dict(options)
    # Tolerate the table's own `provider = "..."` key when it agrees.
    if remaining.pop("provider", provider) != provider:
        raise ConfigurationError(
            f"source provider {options['provider']!r} does not match {provider!r}"
        )
    secrets = _secrets(provider, remaining)
    own = _provider_options(cls)
    for name, value in remaining.items():
        if name in BASE_OPTIONS:
            remaining[name] = _base_option(name, value)
            if remaining[name] is None:
                raise ConfigurationError(f"{provider} source: {name} must be {BASE_OPTIONS[name]}")
        elif name not in own:
            accepted = sorted({"secrets", "secret", *BASE_OPTIONS, *own})
            raise ConfigurationError(
                f"unknown option {name!r} for {provider} source; accepted: {', '.join(accepted)}"
            )
    missing = sorted(_required_options(cls) - set(remaining))
    if missing:
        raise ConfigurationError(f"{provider} source needs option(s): {', '.join(missing)}")
    return cls(secrets=secrets, **remaining)
