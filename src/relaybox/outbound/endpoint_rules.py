"""The rules an endpoint's settings must keep, checked before the store writes them:
its URL (an address the SSRF guard allows, or a broker destination granted to the
tenant), timeout and in-flight cap, its payload filter (alone and with the tenant's
other filters), its custom headers and its credentials (sealed).
:mod:`relaybox.outbound.endpoints` applies them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from relaybox.outbound.credentials import (
    CredentialsSpec,
    InvalidHeaders,
    NoCredentials,
    OAuth2Credentials,
    check_headers,
)
from relaybox.outbound.filters import COST_RULE, InvalidFilter
from relaybox.outbound.filters import check as check_filter
from relaybox.outbound.filters import cost as filter_cost
from relaybox.outbound.registry import outbound
from relaybox.outbound.ssrf import UnsafeDestination
from relaybox.store.credentials import KEEP, Keep
from relaybox.store.outbox_rows import filter_text

if TYPE_CHECKING:
    from relaybox.outbound.vault import Vault
    from relaybox.runtime import Runtime

__all__ = [
    "BROKER_PREFIX",
    "InvalidEndpoint",
    "check_endpoint",
    "checked_filter",
    "stored_extras",
    "tenant_budget",
]

BROKER_PREFIX = "broker:"
"""An endpoint URL ``broker:<name>`` routes to ``[outbound.brokers.<name>]``."""


class InvalidEndpoint(ValueError):
    """An endpoint definition relaybox refuses (the message is safe to show)."""


def checked_filter(box: Runtime, spec: dict[str, Any] | None) -> dict[str, Any] | None:
    """The patch's payload filter checked against the settings' bounds (raises
    :class:`InvalidFilter`); ``{}`` (every message) is stored as no filter."""
    if spec is None:
        return None
    s = outbound(box).settings
    return check_filter(
        spec,
        max_depth=s.filter_max_depth,
        max_bytes=s.filter_max_bytes,
        max_cost=s.filter_max_cost,
    )


def tenant_budget(box: Runtime, spec: dict[str, Any]) -> Callable[[list[str]], None]:
    """The check of a tenant's filters with ``spec`` (checked) on one of its endpoints:
    given the filters of its other endpoints (JSON text as stored, whatever their
    status, so that enabling one needs no check), their costs and this one's together
    within ``filter_tenant_max_cost``, and their sizes within
    ``filter_tenant_max_bytes``, else :class:`InvalidFilter`. The store runs it under
    the tenant's lock (:meth:`OutboxStore.endpoint_update`). The others are read from their
    text: at most ``max_endpoints`` filters of ``filter_max_bytes`` each, each a C
    parse and a walk of its operators."""
    settings = outbound(box).settings
    own_cost, own_size = filter_cost(spec), len(filter_text(spec).encode())

    def check(others: list[str]) -> None:
        size = sum(len(text.encode()) for text in others)
        if size + own_size > settings.filter_tenant_max_bytes:
            raise InvalidFilter(
                f"filter: {own_size:,} bytes as JSON, and this tenant's other filters"
                f" take {size:,}: over the limit of {settings.filter_tenant_max_bytes:,}"
                " for all of a tenant's filters together"
            )
        cost = sum(filter_cost(json.loads(text)) for text in others)
        if cost + own_cost > settings.filter_tenant_max_cost:
            raise InvalidFilter(
                f"filter: {own_cost:,} steps to evaluate, and this tenant's other filters"
                f" take {cost:,}: over the limit of {settings.filter_tenant_max_cost:,}"
                f" for all of a tenant's filters together ({COST_RULE})"
            )

    return check


def stored_extras(
    box: Runtime,
    headers_given: dict[str, str] | None,
    spec: CredentialsSpec | None,
    vault: Vault | None,
) -> tuple[str | Keep | None, tuple[str, str] | Keep | None]:
    """A patch's headers (JSON text) and credentials (kind, sealed JSON) as the store
    writes them, checked; :data:`KEEP` for what it leaves (``None`` given)."""
    headers: str | Keep | None = KEEP
    credentials: tuple[str, str] | Keep | None = KEEP
    if headers_given is not None:
        try:
            check_headers(headers_given, outbound(box).settings)
        except InvalidHeaders as exc:
            raise InvalidEndpoint(str(exc)) from None
        headers = json.dumps(headers_given, separators=(",", ":")) if headers_given else None
    if spec is not None:
        if isinstance(spec, NoCredentials):
            credentials = None
        else:
            if isinstance(spec, OAuth2Credentials):
                try:
                    outbound(box).guard.check_static(spec.token_url)
                except UnsafeDestination as exc:
                    raise InvalidEndpoint(f"token_url: {exc}") from None
            assert vault is not None
            credentials = (spec.type, vault.seal(spec.model_dump_json()))
    return headers, credentials


def check_endpoint(
    box: Runtime,
    tenant: str,
    url: str | None,
    timeout: float | None,
    max_in_flight: int | None,
) -> None:
    """An endpoint's URL (or broker destination granted to ``tenant``), timeout and
    in-flight cap within the settings, else :class:`InvalidEndpoint`."""
    s = outbound(box).settings
    if max_in_flight is not None and max_in_flight > s.concurrency:
        # More than a dispatcher has slots: never reachable, and one endpoint would
        # ask for all of them (the dispatcher clamps a stored cap to its concurrency).
        raise InvalidEndpoint(
            f"max_in_flight must be at most {s.concurrency} (the dispatcher's concurrency)"
        )
    if url is not None and url.startswith(BROKER_PREFIX):
        # An operator-declared broker destination, by name only (never a host), and
        # only one granted to this tenant. One answer for a name that does not exist
        # and one not granted: a tenant learns nothing of the operator's other names.
        name = url[len(BROKER_PREFIX) :]
        broker = s.brokers.get(name)
        if broker is None or not broker.grants(tenant):
            raise InvalidEndpoint(
                f"no broker destination {name[:100]!r} is granted to tenant {tenant[:100]!r}"
                " (the operator lists the tenants a broker takes in"
                " outbound.brokers.<name>.tenants)"
            )
    elif url is not None:
        if len(url) > 2000:
            raise InvalidEndpoint("the URL is longer than 2000 characters")
        try:
            outbound(box).guard.check_static(url)
        except UnsafeDestination as exc:
            raise InvalidEndpoint(str(exc)) from None
    if timeout is not None and not s.min_timeout <= timeout <= s.max_timeout:
        raise InvalidEndpoint(f"timeout must be between {s.min_timeout:g} and {s.max_timeout:g} s")
