"""Managing a tenant's endpoints and their secrets; shared by the API and the CLI.

Every function takes the tenant it acts for. The API passes the tenant its key
authenticated; the CLI (an operator) may pass ``None`` where it reads or changes
any tenant's endpoint by id.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal

import structlog
from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox.outbound.credentials import (
    CredentialsSpec,
    NoCredentials,
    count_states,
    credentials_at_rest,
    each_page,
    reseal_credentials,
    reseal_pages,
)
from relaybox.outbound.endpoint_rules import InvalidEndpoint as InvalidEndpoint
from relaybox.outbound.endpoint_rules import (
    check_endpoint,
    checked_filter,
    stored_extras,
    tenant_budget,
)
from relaybox.outbound.publish import publish
from relaybox.outbound.registry import outbound
from relaybox.outbound.signing import SecretKind, new_secret, public_form
from relaybox.outbound.vault import MISSING_HINT, KeyFileError, Vault
from relaybox.store.credentials import Keep
from relaybox.store.outbox_rows import (
    Endpoint,
    EndpointQuotaReached,
    EndpointStatusChange,
    EndpointWrite,
    new_id,
)

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = [
    "EndpointPatch",
    "EndpointQuotaExceeded",
    "EndpointSpec",
    "create_endpoint",
    "delete_endpoint",
    "disable_endpoint",
    "disable_in",
    "enable_endpoint",
    "endpoint_secrets",
    "get_endpoint",
    "list_endpoints",
    "ready_to_seal",
    "reveal_secrets",
    "rotate_secret",
    "seal_plaintext",
    "seal_secrets",
    "secrets_at_rest",
    "update_endpoint",
]

log = structlog.get_logger("relaybox.outbound")

_PATTERN = re.compile(r"[A-Za-z0-9_.:*-]{1,200}")


class EndpointQuotaExceeded(InvalidEndpoint):
    """The tenant already has ``max_endpoints`` endpoints (the message says so)."""


class EndpointPatch(BaseModel):
    """Fields a tenant may change; ``None`` leaves a field as it is."""

    model_config = ConfigDict(extra="forbid")

    url: str | None = None
    event_types: list[str] | None = Field(None, min_length=1, max_length=100)
    description: str | None = Field(None, max_length=1000)
    signature: Literal["standard", "sha256"] | None = None
    timeout: float | None = Field(None, gt=0)
    schedule: list[float] | None = Field(None, max_length=30)
    max_in_flight: int | None = Field(None, ge=1, le=100)
    rate_limit: float | None = Field(None, gt=0)
    enabled: bool | None = None
    filter: dict[str, Any] | None = None  # payload filter (outbound.filters); {} clears it
    headers: dict[str, str] | None = None
    """Custom request headers; on an update they replace the current ones (``{}``: none)."""
    credentials: CredentialsSpec | None = None
    """HTTP credentials (:mod:`relaybox.outbound.credentials`); ``{"type": "none"}``
    removes them."""
    ordered: bool | None = None
    on_dead: Literal["hold", "skip"] | None = None
    trace_context: bool | None = None
    """Whether its requests carry the attempt's W3C ``traceparent`` while tracing is on
    (default true; false for a receiver that must not see it)."""

    @field_validator("event_types")
    @classmethod
    def _patterns(cls, value: list[str] | None) -> list[str] | None:
        for pattern in value or ():
            if not _PATTERN.fullmatch(pattern):
                raise ValueError(f"invalid event type pattern {pattern!r}")
        return value

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and any(not 0 <= d <= 7 * 24 * 3600 for d in value):
            raise ValueError("schedule delays are seconds between 0 and 7 days")
        return value


class EndpointSpec(EndpointPatch):
    """A new endpoint. ``events`` is the simple registration API's name for ``event_types``."""

    url: str
    event_types: list[str] | None = Field(None, min_length=1, max_length=100)
    events: list[str] | None = Field(None, min_length=1, max_length=100)
    secret_type: SecretKind = "hmac"

    @field_validator("events")
    @classmethod
    def _events(cls, value: list[str] | None) -> list[str] | None:
        return cls._patterns(value)

    def patterns(self) -> list[str]:
        return self.event_types or self.events or ["*"]


async def create_endpoint(box: Runtime, tenant: str, spec: EndpointSpec) -> tuple[Endpoint, str]:
    """Create an endpoint with a fresh secret; returns it and the secret in the form
    its owner verifies with (``whsec_…``, or ``whpk_…`` for ed25519)."""
    check_endpoint(box, tenant, spec.url, spec.timeout, spec.max_in_flight)
    payload_filter = checked_filter(box, spec.filter) or None
    if spec.signature == "sha256" and spec.secret_type == "ed25519":
        raise InvalidEndpoint("sha256 signatures (X-Webhook-Signature) need an hmac secret")
    vault = await ready_to_seal(box)
    headers, credentials = stored_extras(box, spec.headers, spec.credentials, vault)
    settings, now = outbound(box).settings, box.clock.now()
    endpoint_id = new_id("ep", now)
    secret = new_secret(spec.secret_type)
    write = EndpointWrite(
        id=endpoint_id,
        tenant=tenant,
        url=spec.url,
        description=spec.description or "",
        event_types=spec.patterns(),
        signature=spec.signature or "standard",
        timeout=spec.timeout,
        schedule=spec.schedule,
        max_in_flight=spec.max_in_flight or settings.max_in_flight,
        rate_limit=spec.rate_limit,
        payload_filter=payload_filter,
        ordered=bool(spec.ordered),
        on_dead=spec.on_dead or "hold",
        trace_context=spec.trace_context is not False,
    )
    quota = settings.max_endpoints
    try:
        created = await box.store.endpoint_create(
            write,
            vault.seal(secret),
            quota=quota,
            now=now,
            headers=None if isinstance(headers, Keep) else headers,
            credentials=None if isinstance(credentials, Keep) else credentials,
            filters_check=None if payload_filter is None else tenant_budget(box, payload_filter),
        )
    except EndpointQuotaReached as exc:
        raise EndpointQuotaExceeded(
            f"this tenant already has {exc.count} endpoints, the most allowed"
            f" ({quota}); delete one first"
        ) from None
    if spec.enabled is False:
        await disable_endpoint(box, endpoint_id, tenant=tenant)
        return await _get(box, endpoint_id, tenant), public_form(secret)
    log.info("endpoint_created", endpoint_id=endpoint_id, tenant=tenant)
    return created, public_form(secret)


async def get_endpoint(box: Runtime, endpoint_id: str, tenant: str | None) -> Endpoint | None:
    return await box.store.endpoint_get(endpoint_id, tenant)


async def _get(box: Runtime, endpoint_id: str, tenant: str | None) -> Endpoint:
    found = await get_endpoint(box, endpoint_id, tenant)
    assert found is not None
    return found


async def list_endpoints(box: Runtime, tenant: str | None, *, limit: int = 100) -> list[Endpoint]:
    return await box.store.endpoint_list(tenant, limit=limit)


async def update_endpoint(
    box: Runtime, endpoint_id: str, tenant: str, patch: EndpointPatch
) -> Endpoint | None:
    """Apply ``patch``; ``enabled`` switches the endpoint on or off. ``None`` when
    the tenant has no such endpoint."""
    check_endpoint(box, tenant, patch.url, patch.timeout, patch.max_in_flight)
    payload_filter = checked_filter(box, patch.filter)
    current = await get_endpoint(box, endpoint_id, tenant)
    if current is None:
        return None
    if patch.signature == "sha256":
        secrets = await endpoint_secrets(box, endpoint_id, tenant) or []
        if any(s["secret"].startswith("whpk_") for s in secrets):
            raise InvalidEndpoint("sha256 signatures (X-Webhook-Signature) need an hmac secret")
    write = EndpointWrite(
        id=endpoint_id,
        tenant=tenant,
        url=patch.url or current.url,
        description=current.description if patch.description is None else patch.description,
        event_types=patch.event_types or current.event_types,
        signature=patch.signature or current.signature,
        timeout=patch.timeout if patch.timeout is not None else current.timeout,
        schedule=patch.schedule if patch.schedule is not None else current.schedule,
        max_in_flight=patch.max_in_flight or current.max_in_flight,
        rate_limit=patch.rate_limit if patch.rate_limit is not None else current.rate_limit,
        payload_filter=current.payload_filter if payload_filter is None else payload_filter or None,
        ordered=current.ordered if patch.ordered is None else patch.ordered,
        on_dead=patch.on_dead or current.on_dead,
        trace_context=(
            current.trace_context if patch.trace_context is None else patch.trace_context
        ),
    )
    sealing = patch.credentials is not None and not isinstance(patch.credentials, NoCredentials)
    vault = await ready_to_seal(box) if sealing else None
    headers, credentials = stored_extras(box, patch.headers, patch.credentials, vault)
    await box.store.endpoint_update(
        write,
        now=box.clock.now(),
        headers=headers,
        credentials=credentials,
        # A filter set (not kept, not removed) counts against the tenant's budget.
        filters_check=tenant_budget(box, payload_filter) if payload_filter else None,
    )
    if patch.enabled is True:
        await enable_endpoint(box, endpoint_id, tenant=tenant)
    elif patch.enabled is False:
        await disable_endpoint(box, endpoint_id, tenant=tenant)
    return await get_endpoint(box, endpoint_id, tenant)


async def delete_endpoint(box: Runtime, endpoint_id: str, tenant: str) -> bool:
    """Delete the endpoint, its secrets and lane; its waiting deliveries become dead
    letters (``endpoint_deleted``) so the history stays readable."""
    deleted = await box.store.endpoint_delete(
        endpoint_id, tenant, reason="endpoint_deleted", now=box.clock.now()
    )
    if not deleted:
        return False
    log.info("endpoint_deleted", endpoint_id=endpoint_id, tenant=tenant)
    return True


async def enable_endpoint(
    box: Runtime, endpoint_id: str, *, tenant: str | None, reason: str = "manual"
) -> bool:
    """Switch an endpoint back on (its failure streak starts again). Dead letters of
    the time it was off are not resent: use ``recover`` for that. When it was off,
    ``relaybox.endpoint.enabled`` is published to the operational tenant in the same
    transaction (the counterpart of ``relaybox.endpoint.disabled``, with ``reason``)."""
    current = await get_endpoint(box, endpoint_id, tenant)
    if current is None:
        return False
    store, now = box.store, box.clock.now()
    async with store.transaction() as conn:
        row = await store.endpoint_set_status(conn, endpoint_id, "enabled", reason=None, now=now)
        if row is not None:
            await _announce(box, conn, "enabled", row, reason, wasDisabled=current.disabled_reason)
    if row is not None:
        log.info("endpoint_enabled", endpoint_id=endpoint_id, tenant=row.tenant)
    return True


async def disable_endpoint(
    box: Runtime, endpoint_id: str, *, tenant: str | None, reason: str = "manual"
) -> bool:
    """Switch an endpoint off by hand (operator or tenant)."""
    if await get_endpoint(box, endpoint_id, tenant) is None:
        return False
    async with box.store.transaction() as conn:
        await disable_in(box, conn, endpoint_id, reason=reason)
    return True


async def disable_in(box: Runtime, conn: AsyncConnection, endpoint_id: str, *, reason: str) -> bool:
    """Disable in the caller's transaction: its waiting deliveries become dead letters
    (``endpoint_disabled``, recoverable), and the operational event
    ``relaybox.endpoint.disabled`` is published to the operational tenant in the same
    transaction. Returns whether this call disabled it."""
    store, now = box.store, box.clock.now()
    row = await store.endpoint_set_status(conn, endpoint_id, "disabled", reason=reason, now=now)
    if row is None:
        return False
    await store.delivery_kill_endpoint(conn, endpoint_id, "endpoint_disabled", now=now)
    await _announce(box, conn, "disabled", row, reason, failingSince=row.failing_since)
    log.warning("endpoint_disabled", endpoint_id=endpoint_id, tenant=row.tenant, reason=reason)
    return True


async def _announce(
    box: Runtime,
    conn: AsyncConnection,
    change: str,
    row: EndpointStatusChange,
    reason: str,
    **more: Any,
) -> None:
    """``relaybox.endpoint.<change>`` to the operational tenant, in ``conn``'s
    transaction: the endpoint, its tenant and URL, ``reason``, then ``more``."""
    data = {"endpointId": row.id, "tenant": row.tenant, "url": row.url, "reason": reason}
    ops = outbound(box).settings.operational_tenant
    await publish(box, conn, f"relaybox.endpoint.{change}", {**data, **more}, tenant=ops)


async def rotate_secret(
    box: Runtime,
    endpoint_id: str,
    tenant: str | None,
    *,
    grace: float | None = None,
    kind: SecretKind | None = None,
) -> str | None:
    """Add a new secret; the current ones keep signing for ``grace`` seconds (default
    ``rotation_grace``), so receivers can switch without losing a delivery. Returns the
    new secret's public form (``None`` when there is no such endpoint)."""
    if await get_endpoint(box, endpoint_id, tenant) is None:
        return None
    vault = await ready_to_seal(box)
    store, now = box.store, box.clock.now()
    grace = outbound(box).settings.rotation_grace if grace is None else grace
    async with store.transaction() as conn:
        active = await store.endpoint_secrets_active(conn, [endpoint_id], now=now)
        newest = vault.open(active[0].secret) if active else ""
        secret = new_secret(kind or ("ed25519" if newest.startswith("whsk_") else "hmac"))
        await store.endpoint_secret_rotate(
            conn, endpoint_id, vault.seal(secret), until=now + grace, now=now
        )
    log.info("endpoint_secret_rotated", endpoint_id=endpoint_id, grace=grace)
    return public_form(secret)


async def ready_to_seal(box: Runtime) -> Vault:
    """The vault, with a key to seal with; raised before anything is written when
    there is none: :class:`SecretsKeyMissing` (PostgreSQL without
    ``outbound.secrets_key``), :class:`KeyFileError` (a broken key file, or a missing
    one while the database holds sealed secrets: the key was lost, and a new one would
    split the secrets between two keys once the old one is restored)."""
    vault = outbound(box).vault
    key_file = vault.key_file
    if key_file is not None and not vault.loaded and key_file.mode() is None:
        sealed = await box.store.endpoint_secret_sealed_any()
        if sealed and key_file.mode() is None:
            raise KeyFileError(
                f"the endpoint secrets key file {key_file.path} is missing, and the database"
                " holds secrets sealed with it: restore it from your backup (or set"
                " outbound.secrets_key to the key that sealed them); relaybox makes a new"
                " key only for a database without sealed secrets"
            )
    vault.ensure()
    return vault


_SEAL_BATCH = 500
"""Secrets read and sealed per transaction by the sealing passes."""


async def seal_secrets(box: Runtime) -> dict[str, int]:
    """Seal every stored secret (signing secrets and endpoint credentials) with the
    first key: plaintext ones (stored by older versions) and ones sealed with an older
    key of ``outbound.secrets_key``. In
    batches, each its own transaction; safe with several processes at once (each
    update is a compare-and-set). Returns how many were sealed and how many already
    were. :class:`SecretsLocked` when a secret is sealed with a key relaybox lacks."""
    return await _seal(box, plaintext=False)


async def seal_plaintext(box: Runtime) -> dict[str, int]:
    """Seal the secrets stored in plaintext (by versions that did not seal them); run
    by ``relaybox migrate`` and :meth:`Relaybox.migrate`. Reads the key file first
    when there is one (:class:`~relaybox.outbound.vault.KeyFileError` when it is
    broken), and makes it only when a secret is to be sealed. Without a key (PostgreSQL
    without ``outbound.secrets_key``) nothing is sealed: the count is logged as a
    warning and returned as ``plaintext``, and ``relaybox doctor`` reports it."""
    vault = outbound(box).vault
    vault.check()
    if not vault.sealing:
        left = await _count_plaintext(box)
        if left:
            log.warning("endpoint_secrets_plaintext", plaintext=left, hint=MISSING_HINT)
        return {"sealed": 0, "plaintext": left}
    async with box.store.transaction() as conn:
        found = await box.store.endpoint_secrets_page(conn, 0, 1, plaintext=True)
    if not found:  # nothing to seal: no key is made, none is needed
        return {"sealed": 0, "plaintext": 0}
    done = await _seal(box, plaintext=True)
    return {"sealed": done["sealed"], "plaintext": 0}


async def _seal(box: Runtime, *, plaintext: bool) -> dict[str, int]:
    vault, swap = await ready_to_seal(box), box.store.endpoint_secret_swap
    read = _secrets(box, plaintext=plaintext)
    sealed, seen = await reseal_pages(box, vault, read, swap, _SEAL_BATCH, 0)
    if not plaintext:  # credentials are sealed from the start: only a new key reseals them
        done, already = await reseal_credentials(box, vault)
        sealed, seen = sealed + done, seen + done + already
    if sealed:
        log.info("endpoint_secrets_sealed", sealed=sealed, already=seen - sealed)
    return {"sealed": sealed, "already": seen - sealed}


def _secrets(
    box: Runtime, *, plaintext: bool = False
) -> Callable[[AsyncConnection, int], Awaitable[list[tuple[int, str]]]]:
    """Reads a page of stored signing secrets (by secret id); ``plaintext``: only
    those not sealed."""
    return lambda conn, after: box.store.endpoint_secrets_page(
        conn, after, _SEAL_BATCH, plaintext=plaintext
    )


async def _count_plaintext(box: Runtime) -> int:
    return await each_page(box, _secrets(box, plaintext=True), _SEAL_BATCH, 0)


async def secrets_at_rest(box: Runtime) -> dict[str, int]:
    """How the stored secrets (signing secrets and endpoint credentials) stand against
    the keys relaybox has: counts of ``plaintext``, ``current``, ``older`` and
    ``locked`` (see :meth:`Vault.state`)."""
    vault = outbound(box).vault
    counts = dict.fromkeys(("plaintext", "current", "older", "locked"), 0)
    await each_page(box, _secrets(box), _SEAL_BATCH, 0, count_states(vault, counts))
    await credentials_at_rest(box, vault, counts)
    return counts


async def endpoint_secrets(
    box: Runtime, endpoint_id: str, tenant: str | None
) -> list[dict[str, Any]] | None:
    """The active secrets, newest first, in the form the owner verifies with."""
    if await get_endpoint(box, endpoint_id, tenant) is None:
        return None
    store, now, vault = box.store, box.clock.now(), outbound(box).vault
    async with store.transaction() as conn:
        found = await store.endpoint_secrets_active(conn, [endpoint_id], now=now)
    return [
        {
            "secret": public_form(vault.open(r.secret)),
            "created_at": r.created_at,
            "expires_at": r.expires_at,
        }
        for r in found
    ]


async def reveal_secrets(
    box: Runtime, endpoint_id: str, tenant: str | None
) -> tuple[list[dict[str, Any]], int] | None:
    """For the tenant portal, which shows each signing secret once: the active secrets
    never revealed (newest first, in the form the owner verifies with), now marked
    revealed, and how many active ones were revealed before. ``None``: no such
    endpoint."""
    if await get_endpoint(box, endpoint_id, tenant) is None:
        return None
    store, now, vault = box.store, box.clock.now(), outbound(box).vault
    async with store.transaction() as conn:
        shown = await store.endpoint_secrets_reveal(conn, endpoint_id, now=now)
        active = await store.endpoint_secrets_active(conn, [endpoint_id], now=now)
    fresh = [
        {"secret": public_form(vault.open(r.secret)), "expires_at": r.expires_at} for r in shown
    ]
    return fresh, len(active) - len(shown)
