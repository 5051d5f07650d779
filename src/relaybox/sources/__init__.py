"""Inbound sources: one module per provider, and factories to configure them.

    box.source("stripe", sources.stripe(secrets=["whsec_..."]))

Each factory takes ``secrets`` plus any :class:`Source` argument (``tolerance``,
``verify_timestamp``, ``max_body``, ``account``, ``tenant``, ``tenants``,
``ignore_types``, ``inline``, ``fingerprint_path``, ``version_path``, ``name``) and
its provider's own options (only :func:`hmac` has some). :func:`from_config` builds
the same from a TOML table.

The factories share their modules' names, so ``relaybox.sources.stripe`` is the
factory; import classes from the modules (``from relaybox.sources.stripe import
StripeSource``) or from this package.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from relaybox.errors import ConfigurationError
from relaybox.sources.base import Headers, Identity, Secret, Source, Verified
from relaybox.sources.github import GitHubSource, github
from relaybox.sources.hmac import HmacSource, hmac
from relaybox.sources.shopify import ShopifySource, shopify
from relaybox.sources.slack import SlackSource, slack
from relaybox.sources.standard import StandardSource, standard
from relaybox.sources.stripe import StripeSource, stripe

__all__ = [
    "GitHubSource",
    "Headers",
    "HmacSource",
    "Identity",
    "Secret",
    "ShopifySource",
    "SlackSource",
    "Source",
    "StandardSource",
    "StripeSource",
    "Verified",
    "from_config",
    "github",
    "hmac",
    "shopify",
    "slack",
    "standard",
    "stripe",
]

PROVIDERS: dict[str, type[Source]] = {
    "github": GitHubSource,
    "hmac": HmacSource,
    "shopify": ShopifySource,
    "slack": SlackSource,
    "standard": StandardSource,
    "stripe": StripeSource,
}

_NUMBER = (int, float)
# Source.__init__ options as they can appear in TOML, with what they must be.
_BASE_OPTIONS: dict[str, tuple[tuple[type, ...], str]] = {
    "tolerance": (_NUMBER, "a number of seconds"),
    "verify_timestamp": ((bool,), "true or false"),
    "max_body": ((int,), "a whole number of bytes"),
    "account": ((str,), "a string"),
    "tenant": ((str,), "a string"),
    "tenants": ((Mapping,), "a table of account = tenant strings"),
    "ignore_types": ((list, tuple), "a list of event type patterns"),
    "inline": ((bool,), "true or false"),
    "fingerprint_path": ((str,), "a dotted JSON path"),
    "version_path": ((str,), "a path (header:Name or dotted JSON path)"),
    "name": ((str,), "a string"),
}
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


def _check_base_option(provider: str, name: str, value: Any) -> None:
    types, expected = _BASE_OPTIONS[name]
    # bool is an int: `tolerance = true` is a mistake, not one second.
    if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
        raise ConfigurationError(f"{provider} source: {name} must be {expected}")
    if name == "tenants" and not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ConfigurationError(f"{provider} source: {name} must be {expected}")
    if name == "ignore_types" and not all(isinstance(v, str) for v in value):
        raise ConfigurationError(f"{provider} source: {name} must be {expected}")


def from_config(provider: str, options: Mapping[str, Any]) -> Source:
    """Build a source from a plain dict, as read from a TOML config file.

    ``secrets`` is a list of strings or tables ``{value, account, tenant}`` (a
    single ``secret`` is accepted too). Unknown providers and options raise
    :class:`ConfigurationError` naming what is accepted; messages never include
    secret values.
    """
    cls = PROVIDERS.get(provider)
    if cls is None:
        raise ConfigurationError(
            f"unknown source provider {provider!r}; expected one of: {', '.join(PROVIDERS)}"
        )
    remaining = dict(options)
    # Tolerate the table's own `provider = "..."` key when it agrees.
    if remaining.get("provider", provider) != provider:
        raise ConfigurationError(
            f"source provider {remaining['provider']!r} does not match {provider!r}"
        )
    remaining.pop("provider", None)
    secrets = _secrets(provider, remaining)
    own = _provider_options(cls)
    for name, value in remaining.items():
        if name in _BASE_OPTIONS:
            _check_base_option(provider, name, value)
        elif name not in own:
            accepted = sorted({"secrets", "secret", *_BASE_OPTIONS, *own})
            raise ConfigurationError(
                f"unknown option {name!r} for {provider} source; accepted: {', '.join(accepted)}"
            )
    missing = sorted(_required_options(cls) - set(remaining))
    if missing:
        raise ConfigurationError(f"{provider} source needs option(s): {', '.join(missing)}")
    return cls(secrets=secrets, **remaining)
