"""The app the outbound fault test runs as a real process
(``relaybox dispatch --app tests.support.outbound_app:box``), and the helpers every
outbound test shares.

Tests talk plain HTTP to receivers on 127.0.0.1: that takes the development flag
(``allow_insecure_loopback``) *and* the allow-list (``127.0.0.0/8``); the SSRF tests
prove that without them the same URLs are refused.
"""

from __future__ import annotations

import os
from typing import Any

from relaybox import Relaybox
from relaybox.config import Settings
from relaybox.outbound import (
    EndpointSpec,
    HttpChannel,
    Message,
    Outbound,
    configure,
    create_endpoint,
)

__all__ = ["LOCAL", "box", "dispatch_once", "endpoint", "local", "outbox_rows", "publish_one"]

LOCAL: dict[str, Any] = {
    "allow_insecure_loopback": True,
    "allow_networks": ["127.0.0.0/8"],
    "min_timeout": 0.05,
    "timeout": 5.0,
    "max_timeout": 5.0,
    "lease_ttl": 10.0,
    "jitter": 0.0,
    "poll_interval": 0.05,
    # One tenant ("t1") may use every slot: these tests isolate endpoints, not tenants
    # (tests/integration/test_hardening_dispatch.py runs with the default share).
    "tenant_share": 1.0,
    # The suite's key (tests/conftest.py: SECRETS_KEY; PostgreSQL needs one), the same
    # in the test process and the relaybox processes it starts.
    "secrets_key": os.environ.get("RELAYBOX_TEST_SECRETS_KEY"),
}


def local(b: Relaybox, **overrides: Any) -> Outbound:
    """Configure ``b`` for receivers on 127.0.0.1, with a ``review`` HTTP channel."""
    outbound = configure(b, **{**LOCAL, **overrides})
    outbound.channel("review-http", HttpChannel(uncertain="review"))
    return outbound


async def endpoint(b: Relaybox, url: str, *, tenant: str = "t1", **fields: Any) -> tuple[str, str]:
    """A new endpoint (every event type unless told); returns (id, secret)."""
    spec = EndpointSpec(url=url, **fields)
    created, secret = await create_endpoint(b, tenant, spec)
    return created.id, secret


async def publish_one(
    b: Relaybox,
    event_type: str = "pet.adopted",
    data: Any = None,
    *,
    tenant: str = "t1",
    **options: Any,
) -> Message:
    """Publish in a transaction of its own."""
    async with b.store.transaction() as conn:
        return await b.publish(  # type: ignore[no-any-return]
            conn, event_type, {"petId": "p1"} if data is None else data, tenant=tenant, **options
        )


async def dispatch_once(b: Relaybox) -> int:
    """One ``run_once`` of a fresh dispatcher, closed after: how many rows it leased."""
    d = b.dispatcher()
    try:
        return await d.run_once()
    finally:
        await d.close()


async def outbox_rows(b: Relaybox) -> list[dict[str, Any]]:
    """The outbox rows as an operator sees them: on PostgreSQL a row under a lease (live
    or expired) has its attempt count and token in relaybox_outbox_leases."""
    if b.store.backend == "postgres":
        return await b.store.fetch_all(
            "SELECT o.id, o.channel, o.key, o.endpoint_id, o.message_id, o.status,"
            " o.dead_reason, COALESCE(l.attempt, o.attempts) AS attempts, o.next_attempt_at,"
            " o.last_error, o.last_status, COALESCE(l.token, o.lease_token) AS lease_token"
            " FROM relaybox_outbox o LEFT JOIN relaybox_outbox_leases l ON l.outbox_id = o.id"
            " ORDER BY o.id"
        )
    return await b.store.fetch_all(
        "SELECT id, channel, key, endpoint_id, message_id, status, dead_reason, attempts,"
        " next_attempt_at, last_error, last_status, lease_token FROM relaybox_outbox ORDER BY id"
    )


box = Relaybox(
    settings=Settings(database_url=os.environ.get("RELAYBOX_DATABASE_URL", "sqlite:///unused.db"))
)
# A process test may ask for small replay-missing steps (tests/e2e/test_replay_kill.py).
local(
    box, **({"replay_batch": int(b)} if (b := os.environ.get("RELAYBOX_TEST_REPLAY_BATCH")) else {})
)
