"""The sending side of one :class:`~relaybox.app.Relaybox`: settings, the SSRF guard,
the registered channels and their metrics, and the tenants' publish rate limit.

    from relaybox.outbound import configure, EmailChannel

    outbound = configure(box, timeout=5)                 # settings (see OutboundSettings)
    outbound.channel("email", EmailChannel(host="smtp.internal", sender="no-reply@x"))

The composition root builds one with the box (``box.outbound``), from the box's
settings; :func:`outbound` and :func:`configure` reach it from any part that holds a
:class:`~relaybox.runtime.Runtime`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter
from sqlalchemy.engine import make_url

from relaybox.config.outbound import BrokerSettings, OutboundSettings
from relaybox.errors import RelayboxError
from relaybox.limits import TokenBuckets
from relaybox.outbound.channels.base import Channel
from relaybox.outbound.channels.brokers import broker_channel
from relaybox.outbound.channels.webhook import WebhookChannel
from relaybox.outbound.ssrf import Guard, Resolver
from relaybox.outbound.vault import KeyFile, Vault, new_key
from relaybox.retry import Schedule

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = ["Outbound", "PublishLimited", "configure", "key_file_path", "outbound"]


class PublishLimited(RelayboxError):
    """A tenant over its publish rate (``outbound.publish_rate``): nothing was
    written; a token is available again in ``retry_after`` seconds (at least 1). The
    tenant API answers 429 with ``Retry-After``, the portal a 429 page."""

    def __init__(self, rate: float, retry_after: int) -> None:
        super().__init__(f"over {rate:g} messages per second: retry in {retry_after} s")
        self.rate, self.retry_after = rate, retry_after


class Outbound:
    """Everything the dispatcher, the API and :func:`publish` share for one box."""

    def __init__(self, box: Runtime, settings: OutboundSettings) -> None:
        self.box = box
        self.settings = settings
        self.guard = Guard(
            allow_networks=settings.allow_networks,
            allow_insecure_loopback=settings.allow_insecure_loopback,
        )
        self._vault: tuple[str, Vault] | None = None
        self._memory_key: str | None = None
        self.channels: dict[str, Channel] = {}
        self._schedules: dict[tuple[float, ...] | None, Schedule] = {}
        # Latency and HTTP status per channel are Metrics.observe_delivery's; this
        # counts what the dispatcher decided (sent, retry, exhausted, held, fenced, ...).
        self.attempts = Counter(
            "relaybox_outbound_attempts",
            "Outbound attempts by channel and the dispatcher's decision.",
            ["channel", "outcome"],
            registry=box.metrics.registry,
        )
        self.channel("webhook", WebhookChannel())
        self._brokers: dict[str, tuple[BrokerSettings, Channel]] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._register_brokers()
        self._publish_limit: TokenBuckets | None = None

    def channel(self, name: str, channel: Channel) -> Channel:
        """Register ``channel`` for outbox rows whose channel is ``name``."""
        if not name or name.startswith("ep_"):
            raise ValueError(f"invalid channel name {name!r}")
        channel.bind(self, name)
        self.channels[name] = channel
        return channel

    def update(self, *, resolver: Resolver | None = None, **changes: Any) -> Outbound:
        """Change settings (validated as a whole) and, for tests, the DNS resolver."""
        merged = {**self.settings.model_dump(), **changes}
        return self._apply(OutboundSettings.model_validate(merged), resolver)

    def follow(self, before: OutboundSettings, after: OutboundSettings) -> Outbound:
        """The box's settings changed from ``before`` to ``after`` (``box.configure``,
        ``--config``, a test harness): take the fields that changed, and keep what
        :func:`configure` set in code on the others."""
        changed = {
            name: getattr(after, name)
            for name in type(after).model_fields
            if getattr(after, name) != getattr(before, name)
        }
        return self.update(**changed) if changed else self

    def _apply(self, settings: OutboundSettings, resolver: Resolver | None) -> Outbound:
        self.settings = settings
        self._schedules.clear()
        self._vault = None
        # The guard is shared by every channel's client: change it in place.
        self.guard.configure(
            allow_networks=self.settings.allow_networks,
            allow_insecure_loopback=self.settings.allow_insecure_loopback,
            resolver=resolver,
        )
        for name, channel in self.channels.items():
            channel.bind(self, name)
        self._register_brokers()
        return self

    def _register_brokers(self) -> None:
        """Make a channel for each ``[outbound.brokers.<name>]`` that is new or changed.
        A replaced or removed broker channel's connection is closed in the background."""
        for name in set(self._brokers) - set(self.settings.brokers):
            _, made = self._brokers.pop(name)
            if self.channels.get(name) is made:
                del self.channels[name]
                self._close_later(made)
        for name, spec in self.settings.brokers.items():
            known = self._brokers.get(name)
            if known is not None and self.channels.get(name) is known[1]:
                # The grants (``tenants``) are read at each delivery: a change of them
                # alone keeps the connection.
                if known[0].model_copy(update={"tenants": spec.tenants}) == spec:
                    self._brokers[name] = (spec, known[1])
                    continue
            old = self.channels.get(name)
            made = self.channel(name, broker_channel(spec))
            self._brokers[name] = (spec, made)
            if old is not None:
                self._close_later(old)

    async def close(self) -> None:
        """Close every channel's connections (an HTTP session, a broker connection);
        a channel opens them again when it next delivers. The box's close calls this,
        so a dispatcher that was never closed leaves no session behind."""
        for channel in list(self.channels.values()):
            with contextlib.suppress(Exception):
                await channel.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    def _close_later(self, channel: Channel) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop: the channel never connected in this thread
        task = loop.create_task(channel.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @property
    def vault(self) -> Vault:
        """Seals and opens endpoint secrets: with ``secrets_key``, else with the key
        file beside the SQLite database (see :mod:`relaybox.outbound.vault`). Made
        again when the database URL changes (the CLI's ``--database-url``)."""
        url = self.box.settings.database_url
        if self._vault is None or self._vault[0] != url:
            if _in_memory(url) and self._memory_key is None:
                # The database lives as long as the process: so does its key.
                self._memory_key = new_key()
            self._vault = (url, _vault(self.settings, url, self._memory_key))
        return self._vault[1]

    def spend_publish_token(self, tenant: str) -> None:
        """Spend one of ``tenant``'s publish tokens, or raise :class:`PublishLimited`
        (nothing spent) with the seconds until one is available. Every way a tenant
        makes a message go out (the tenant API's ``POST /messages``, its test and
        redeliver routes, the portal's *Send test event* and *Resend*) draws from this
        one bucket per tenant: ``publish_burst`` at once, refilled at ``publish_rate``
        per second. It is held here, once per box and process, so the API and the
        portal cannot each allow the full rate."""
        s = self.settings
        bucket = self._publish_limit
        if bucket is None or (bucket.rate, bucket.burst) != (s.publish_rate, s.publish_burst):
            # Made on first use, and again when configure() changed the rate.
            bucket = self._publish_limit = TokenBuckets(s.publish_rate, s.publish_burst)
        wait = bucket.take(tenant)
        if wait:
            raise PublishLimited(s.publish_rate, max(1, math.ceil(wait)))

    def schedule(self, delays: Sequence[float] | None = None) -> Schedule:
        """The retry schedule for ``delays`` (an endpoint's or a channel's), or the
        default one, with the configured jitter and Retry-After clamp. Made once per
        list of delays (the dispatcher asks for one on every attempt)."""
        key = None if delays is None else tuple(delays)
        found = self._schedules.get(key)
        if found is None:
            s = self.settings
            found = self._schedules[key] = Schedule.of(
                s.schedule if delays is None else delays,
                jitter=s.jitter,
                retry_after_cap=s.retry_after_cap,
            )
        return found


def _vault(settings: OutboundSettings, database_url: str, memory_key: str | None) -> Vault:
    key = settings.secrets_key
    if key is not None:
        return Vault(key.get_secret_value())
    path = key_file_path(database_url)
    if path is not None:
        return Vault(None, key_file=KeyFile(path))
    if _in_memory(database_url):
        return Vault(memory_key)
    return Vault(None)


def key_file_path(database_url: str) -> Path | None:
    """``<database>.key`` for a SQLite database file; ``None`` for any other database."""
    try:
        url = make_url(database_url)
    except Exception:
        return None
    if not url.drivername.startswith("sqlite") or _in_memory(database_url):
        return None
    assert url.database is not None
    return Path(url.database + ".key").expanduser().absolute()


def _in_memory(database_url: str) -> bool:
    try:
        url = make_url(database_url)
    except Exception:
        return False
    return url.drivername.startswith("sqlite") and (
        url.database in (None, "", ":memory:") or url.query.get("mode") == "memory"
    )


def outbound(box: Runtime) -> Outbound:
    """The box's sending side (``box.outbound``)."""
    return box.outbound


def configure(box: Runtime, *, resolver: Resolver | None = None, **settings: Any) -> Outbound:
    """Set outbound settings for ``box`` (see :class:`OutboundSettings`); returns the
    :class:`Outbound` to register channels on."""
    return outbound(box).update(resolver=resolver, **settings)
