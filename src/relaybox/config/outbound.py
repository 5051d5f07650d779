"""Settings of the sending side, one validated model.

Kept free of relaybox imports so that ``relaybox.config`` can embed it as
``Settings.outbound`` (``[outbound]`` in the TOML file, ``RELAYBOX_OUTBOUND__*`` in the
environment) without an import cycle. Until it does, :func:`relaybox.outbound.configure`
is where an application sets them.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Literal, Self

from cryptography.fernet import Fernet
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

__all__ = [
    "DEFAULT_SCHEDULE",
    "BrokerSettings",
    "OutboundSettings",
    "UncertainPolicy",
    "parse_keys",
    "tenant_cap",
]

UncertainPolicy = Literal["resend", "review", "accept"]
"""What to do when a lease expired before its outcome was recorded: send again under
the same idempotency key, hold the row for a human, or count it as sent."""

DEFAULT_SCHEDULE: tuple[float, ...] = (5.0, 300.0, 1800.0, 7200.0, 18000.0, 36000.0, 36000.0)
"""Delays before attempts 2..8 (the first is immediate): 5 s, 5 min, 30 min, 2 h, 5 h,
10 h, 10 h. About 27.6 hours end to end: a receiver down for a day still gets it."""


def parse_keys(value: str | None) -> list[Fernet]:
    """``secrets_key``'s comma-separated keys; ``ValueError`` names a bad one."""
    keys: list[Fernet] = []
    for n, part in enumerate((value or "").split(","), start=1):
        if not part.strip():
            continue
        try:
            keys.append(Fernet(part.strip().encode()))
        except (ValueError, TypeError):
            raise ValueError(
                f"key {n} is not a Fernet key (32 url-safe base64-encoded bytes;"
                " make one with `relaybox endpoints new-key`)"
            ) from None
    return keys


BROKER_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
"""A broker destination's name, which is also its channel's name."""

_BROKER_SCHEMES = {
    "rabbitmq": ("amqp", "amqps"),
    "nats": ("nats", "tls"),
    "redis": ("redis", "rediss", "unix"),
}


class BrokerSettings(BaseModel):
    """One operator-declared broker destination (``[outbound.brokers.<name>]``)."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["rabbitmq", "nats", "redis"]
    url: SecretStr = Field(description="amqp(s)://, nats:// or tls://, redis(s):// or unix://")
    exchange: str = Field(default="", description="rabbitmq: exchange ('' = the default one)")
    routing_key: str | None = Field(
        default=None, min_length=1, description="rabbitmq: routing key (the queue on '')"
    )
    subject: str | None = Field(default=None, min_length=1, description="nats: subject")
    stream: str | None = Field(
        default=None,
        min_length=1,
        description="redis: stream key; nats: the JetStream stream expected to take it",
    )
    maxlen: int | None = Field(
        default=None, ge=1, description="redis: trim the stream to about this many entries"
    )
    connect_timeout: float = Field(default=5.0, gt=0, le=60, description="seconds to connect")
    publish_timeout: float = Field(
        default=10.0, gt=0, le=60, description="seconds for connect + publish + confirm"
    )
    max_in_flight: int = Field(default=16, ge=1, le=1000, description="publishes in flight")
    uncertain: UncertainPolicy = "resend"
    schedule: list[float] | None = Field(default=None, description="retry delays (default: ours)")
    tenants: list[str] = Field(
        default_factory=list,
        description=(
            "tenants whose endpoints may route here (url 'broker:<name>'); '*': every "
            "tenant; default: none (only handlers write here)"
        ),
    )

    @field_validator("tenants")
    @classmethod
    def _tenants(cls, value: list[str]) -> list[str]:
        for tenant in value:
            if not tenant or tenant != tenant.strip():
                raise ValueError(f"tenants: {tenant!r} is not a tenant name (nor '*')")
        return value

    def grants(self, tenant: str | None) -> bool:
        """Whether ``tenant``'s endpoints may route to this destination."""
        return tenant is not None and ("*" in self.tenants or tenant in self.tenants)

    @model_validator(mode="after")
    def _fields(self) -> Self:
        scheme = self.url.get_secret_value().split("://", 1)[0].lower()
        if scheme not in _BROKER_SCHEMES[self.kind]:
            allowed = ", ".join(f"{s}://" for s in _BROKER_SCHEMES[self.kind])
            raise ValueError(f"a {self.kind} url starts with {allowed}")
        needed = {"rabbitmq": "routing_key", "nats": "subject", "redis": "stream"}[self.kind]
        if getattr(self, needed) is None:
            raise ValueError(f"a {self.kind} broker needs {needed}")
        return self


class OutboundSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    concurrency: int = Field(default=64, ge=1, description="deliveries in flight per dispatcher")
    batch: int = Field(default=64, ge=1, le=1000, description="rows leased by one run_once()")
    poll_interval: float = Field(default=1.0, gt=0, description="seconds between polls when idle")
    lease_ttl: float = Field(
        default=60.0, gt=0, description="seconds a leased row is ours; longer than any timeout"
    )
    lease_ahead: int = Field(
        default=4,
        ge=1,
        le=16,
        description=(
            "PostgreSQL: times its cap an endpoint's lane may have leased by a dispatcher "
            "alone in it, so the next row starts as an attempt ends (resend policy only; "
            "1: off)"
        ),
    )
    timeout: float = Field(default=5.0, gt=0, description="default total seconds per attempt")
    connect_timeout: float = Field(default=5.0, gt=0, description="seconds to open a connection")
    min_timeout: float = Field(default=5.0, gt=0, description="lowest endpoint timeout")
    max_timeout: float = Field(default=30.0, gt=0, description="highest endpoint timeout")
    schedule: list[float] = Field(default_factory=lambda: list(DEFAULT_SCHEDULE))
    jitter: float = Field(default=0.2, ge=0, lt=1, description="±fraction applied to each delay")
    retry_after_cap: float = Field(
        default=3600.0, ge=0, description="longest Retry-After honoured, seconds"
    )
    disable_after: float = Field(
        default=5 * 24 * 3600.0, gt=0, description="disable an endpoint failing this long, seconds"
    )
    max_payload: int = Field(default=256 * 1024, ge=1024, description="largest message body, bytes")
    api_max_body: int | None = Field(
        default=None,
        ge=1024,
        description="largest tenant API request body, bytes (default: max_payload + 64 KiB)",
    )
    publish_rate: float = Field(
        default=50.0,
        gt=0,
        description="messages per second one tenant may send through the tenant API and "
        "the portal together (publish, test events, redeliver), per process",
    )
    publish_burst: int = Field(
        default=100, ge=1, description="messages a tenant may publish at once above the rate"
    )
    response_bytes: int = Field(default=1024, ge=0, le=65536, description="answer bytes kept")
    attempt_headers_bytes: int = Field(
        default=4096,
        ge=0,
        le=65536,
        description="bytes of an HTTP attempt's request and response headers kept for the "
        "attempt log, each (0: none)",
    )
    max_in_flight: int = Field(default=4, ge=1, description="default per-endpoint in-flight cap")
    tenant_share: float = Field(
        default=0.25,
        gt=0,
        le=1,
        description=(
            "fraction of a dispatcher's concurrency one tenant's webhook deliveries may "
            "hold at once (at least 1 slot), so that a tenant whose endpoints hang cannot "
            "take every slot"
        ),
    )
    max_endpoints: int = Field(
        default=100, ge=1, le=100_000, description="endpoints one tenant may have"
    )
    filter_max_bytes: int = Field(
        default=4096, ge=64, le=65536, description="largest endpoint payload filter, JSON bytes"
    )
    filter_max_depth: int = Field(
        default=8, ge=2, le=32, description="deepest endpoint payload filter (objects and lists)"
    )
    filter_max_cost: int = Field(
        default=250,
        ge=1,
        le=100_000,
        description="steps one endpoint payload filter may take per message (each path key, "
        "operator, $and/$or branch and value compared whole; a $in of plain values is one)",
    )
    filter_tenant_max_cost: int = Field(
        default=4000,
        ge=1,
        le=10_000_000,
        description="steps the payload filters of all of one tenant's endpoints may take "
        "together per message: what one publish of the tenant evaluates at most",
    )
    filter_tenant_max_bytes: int = Field(
        default=65536,
        ge=64,
        le=100 * 1024 * 1024,
        description="JSON bytes of the payload filters of all of one tenant's endpoints "
        "together: what one publish of the tenant reads of them at most",
    )
    replay_max: int = Field(
        default=1000,
        ge=1,
        le=1_000_000,
        description="deliveries one replay-missing job may queue for an endpoint",
    )
    replay_scan_max: int = Field(
        default=100_000,
        ge=1,
        description="messages one replay-missing job may read (matching its endpoint or not)",
    )
    replay_batch: int = Field(
        default=100,
        ge=1,
        le=10_000,
        description="messages a replay-missing job reads, checks off the event loop and "
        "queues per step (one short transaction each; its progress is saved after each)",
    )
    replay_jobs_per_hour: int = Field(
        default=20,
        ge=1,
        le=100_000,
        description="replay-missing jobs one tenant may start per hour through the tenant "
        "API (429 beyond; the admin API, dashboard and CLI are not limited)",
    )
    allow_insecure_loopback: bool = Field(
        default=False, description="development only: allow http:// to loopback addresses"
    )
    allow_networks: list[str] = Field(
        default_factory=list, description="networks the SSRF guard lets through (CIDR)"
    )
    api_version: str = Field(default="v1", description="apiVersion written in every envelope")
    rotation_grace: float = Field(
        default=24 * 3600.0, ge=0, description="seconds an old secret still signs"
    )
    operational_tenant: str = Field(
        default="relaybox", min_length=1, description="tenant that receives relaybox.* events"
    )
    webhook_uncertain: UncertainPolicy = "resend"
    max_endpoint_headers: int = Field(
        default=20, ge=0, le=100, description="custom headers one endpoint may have"
    )
    max_endpoint_headers_bytes: int = Field(
        default=4096,
        ge=0,
        le=65536,
        description="total bytes of one endpoint's custom header names and values",
    )
    oauth2_token_margin: float = Field(
        default=30.0,
        ge=0,
        description="seconds before an OAuth2 token's expiry at which a new one is fetched",
    )
    oauth2_token_bytes: int = Field(
        default=16384, ge=1024, le=1048576, description="largest OAuth2 token answer read, bytes"
    )
    failing_thresholds: list[int] = Field(
        default_factory=lambda: [3, 10, 50],
        max_length=20,
        description=(
            "failures in a row at which relaybox.endpoint.failing is published (once per"
            " threshold until the endpoint recovers)"
        ),
    )
    brokers: dict[str, BrokerSettings] = Field(
        default_factory=dict,
        description="named broker destinations; each becomes the channel of that name",
    )
    secrets_key: SecretStr | None = Field(
        default=None,
        description=(
            "Fernet key(s), comma-separated: endpoint signing secrets are stored sealed"
            " with the first, and any of them opens one (relaybox.outbound.vault). Unset:"
            " a key file beside a SQLite database (<database>.key, made on first use);"
            " required on PostgreSQL, where relaybox otherwise refuses to store a secret"
        ),
    )

    @field_validator("secrets_key")
    @classmethod
    def _secrets_key(cls, value: SecretStr | None) -> SecretStr | None:
        # An empty variable (RELAYBOX_OUTBOUND__SECRETS_KEY=) means "unset".
        if value is None or not parse_keys(value.get_secret_value()):
            return None
        return value

    @field_validator("brokers")
    @classmethod
    def _broker_names(cls, value: dict[str, BrokerSettings]) -> dict[str, BrokerSettings]:
        for name in value:
            if not BROKER_NAME.match(name) or name == "webhook" or name.startswith("ep_"):
                raise ValueError(
                    f"broker name {name!r}: lowercase letters, digits, '-' and '_', starting"
                    " with a letter, and not webhook or ep_*"
                )
        return value

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, value: list[float]) -> list[float]:
        if any(d < 0 for d in value):
            raise ValueError("schedule delays are seconds >= 0")
        return value

    @field_validator("failing_thresholds")
    @classmethod
    def _thresholds(cls, value: list[int]) -> list[int]:
        if any(n < 1 for n in value):
            raise ValueError("failing thresholds are failure counts >= 1")
        return sorted(set(value))

    @field_validator("allow_networks")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for net in value:
            ipaddress.ip_network(net, strict=False)
        return value

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if not self.min_timeout <= self.timeout <= self.max_timeout:
            raise ValueError("timeout must lie within [min_timeout, max_timeout]")
        # A live dispatcher must always record before its lease runs out, or every
        # slow attempt would look like a crash.
        if self.lease_ttl < self.max_timeout + 5:
            raise ValueError("lease_ttl must exceed max_timeout by at least 5 seconds")
        return self


def tenant_cap(concurrency: int, share: float) -> int:
    """A tenant's slots among ``concurrency``: ``share`` of them, at least one."""
    return max(1, int(concurrency * share))
