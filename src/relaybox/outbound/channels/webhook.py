"""The webhook channel: a published message, signed, POSTed to a tenant's endpoint.

Each attempt sends the message's stored body (the same bytes every time) with
``webhook-id`` = the message id (stable: receivers deduplicate on it, also after an
uncertain resend), a new ``webhook-timestamp`` and a signature by every active secret;
a message published with an ordering key also carries ``webhook-sequence``.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING

from relaybox.outbound.channels.base import Result
from relaybox.outbound.channels.brokers import BrokerChannel
from relaybox.outbound.channels.http import HttpBase
from relaybox.outbound.credentials import TokenCache, authorized_post
from relaybox.outbound.signing import sign
from relaybox.store.outbox_rows import Delivery

if TYPE_CHECKING:
    from relaybox.outbound.registry import Outbound

__all__ = ["WebhookChannel"]


class WebhookChannel(HttpBase):
    """Standard Webhooks delivery (or the ``X-Webhook-Signature: sha256=`` header) per endpoint.
    Its uncertain-outcome policy is the outbound setting ``webhook_uncertain``
    (default ``resend``: the receiver sees the same ``webhook-id`` twice)."""

    kind = "webhook"
    bounded = True  # post() times the whole attempt, within delivery.deadline
    _tokens: TokenCache | None = None  # OAuth2 tokens, made for the first endpoint using one

    def bind(self, outbound: Outbound, name: str) -> None:
        super().bind(outbound, name)
        self.uncertain = outbound.settings.webhook_uncertain

    async def deliver(self, delivery: Delivery) -> Result:
        endpoint, message = delivery.endpoint, delivery.message
        if endpoint is None or message is None:
            return Result("failed", error="the endpoint or the message no longer exists")
        if endpoint.url.startswith("broker:"):
            return await self._to_broker(delivery, endpoint.url[len("broker:") :], message.body)
        if endpoint.locked is not None:  # never sent unsigned: retried until a key opens it
            return Result("retry", error=endpoint.locked)
        if not endpoint.secrets:
            return Result("retry", error="the endpoint has no active secret")
        assert self.outbound is not None
        headers = sign(
            msg_id=message.id,
            timestamp=int(self.outbound.box.clock.now()),
            body=message.body,
            secrets=endpoint.secrets,
            scheme=endpoint.signature,
        )
        headers["Content-Type"] = "application/json"
        if message.sequence is not None:  # a keyed message: receivers drop stale ones
            headers["webhook-sequence"] = str(message.sequence)
        timeout = min(endpoint.timeout or self.outbound.settings.timeout, delivery.deadline)
        if endpoint.headers or endpoint.credentials is not None:
            if self._tokens is None:
                self._tokens = TokenCache(self.outbound)
            return await authorized_post(
                self._tokens, self.client(), endpoint, message.body, headers, seconds=timeout
            )
        # Only relaybox's own headers (signatures, not credentials: hidden is empty).
        return await self.client().post(
            endpoint.url,
            message.body,
            headers,
            seconds=timeout,
            hidden=(),
            trace_context=endpoint.trace_context,
        )

    async def _to_broker(self, delivery: Delivery, name: str, body: bytes) -> Result:
        """An endpoint routed to an operator's broker destination (``broker:<name>``):
        the envelope, with the tenant, goes to that channel, under the delivery's
        stable key (``<message id>:<endpoint id>``). Only while the destination grants
        the tenant (``outbound.brokers.<name>.tenants``): a grant revoked after the
        endpoint was made stops its deliveries as ``blocked``, like a URL the SSRF
        guard refuses."""
        assert self.outbound is not None
        channel = self.outbound.channels.get(name)
        if not isinstance(channel, BrokerChannel):
            return Result("retry", error=f"no broker destination named {name!r} is configured")
        broker = self.outbound.settings.brokers.get(name)
        if broker is None or not broker.grants(delivery.tenant):
            # (A broker channel registered in code has no settings: it grants nobody.)
            return Result(
                "blocked",
                error=f"broker destination {name!r} is not granted to tenant"
                f" {delivery.tenant!r} (outbound.brokers.{name}.tenants)",
            )
        envelope = json.loads(body)
        envelope["tenant"] = delivery.tenant
        return await channel.deliver(replace(delivery, payload=envelope))
