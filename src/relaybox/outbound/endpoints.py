"""Managing a tenant's endpoints and their secrets; shared by the API and the CLI.

Every function takes the tenant it acts for. The API passes the tenant its key
authenticated; the CLI (an operator) may pass ``None`` where it reads or changes
any tenant's endpoint by id.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import structlog
from pydantic import BaseModel, ConfigDict, Field, field_validator
from sqlalchemy.ext.asyncio import AsyncConnection

from relaybox.outbound import db
from relaybox.outbound.publish import publish
from relaybox.outbound.registry import outbound
from relaybox.outbound.signing import SecretKind, new_secret, public_form
from relaybox.outbound.ssrf import UnsafeDestination
from relaybox.outbound.vault import MISSING_HINT, KeyFileError, Vault

if TYPE_CHECKING:
    from relaybox.app import Relaybox

__all__ = [
    "Endpoint",
    "EndpointPatch",
    "EndpointQuotaExceeded",
    "EndpointSpec",
    "InvalidEndpoint",
    "create_endpoint",
    "delete_endpoint",
    "disable_endpoint",
    "disable_in",
    "enable_endpoint",
    "endpoint_secrets",
    "get_endpoint",
    "list_endpoints",
    "ready_to_seal",
    "rotate_secret",
    "seal_plaintext",
    "seal_secrets",
    "secrets_at_rest",
    "update_endpoint",
]

log = structlog.get_logger("relaybox.outbound")

_PATTERN = re.compile(r"[A-Za-z0-9_.:*-]{1,200}")


class InvalidEndpoint(ValueError):
    """An endpoint definition relaybox refuses (the message is safe to show)."""


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
    """A new endpoint. ``events`` is seed 003's name for ``event_types``."""

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


@dataclass(frozen=True)
class Endpoint:
    id: str
    tenant: str
    url: str
    description: str
    event_types: list[str]
    status: str
    disabled_reason: str | None
    signature: str
    timeout: float | None
    schedule: list[float] | None
    failing_since: float | None
    created_at: float
    updated_at: float
    max_in_flight: int
    rate_limit: float | None

    @classmethod
    def from_row(cls, row: Any) -> Endpoint:
        return cls(
            id=row["id"],
            tenant=row["tenant"],
            url=row["url"],
            description=row["description"],
            event_types=json.loads(row["event_types"]),
            status=row["status"],
            disabled_reason=row["disabled_reason"],
            signature=row["signature"],
            timeout=row["timeout"],
            schedule=json.loads(row["schedule"]) if row["schedule"] else None,
            failing_since=row["failing_since"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
            max_in_flight=row["max_in_flight"],
            rate_limit=row["rate_limit"],
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "url": self.url,
            "description": self.description,
            "event_types": self.event_types,
            "enabled": self.status == "enabled",
            "disabled_reason": self.disabled_reason,
            "signature": self.signature,
            "timeout": self.timeout,
            "schedule": self.schedule,
            "max_in_flight": self.max_in_flight,
            "rate_limit": self.rate_limit,
            "failing_since": self.failing_since,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


def _check(
    box: Relaybox, url: str | None, timeout: float | None, max_in_flight: int | None
) -> None:
    s = outbound(box).settings
    if max_in_flight is not None and max_in_flight > s.concurrency:
        # More than a dispatcher has slots: never reachable, and one endpoint would
        # ask for all of them (the dispatcher clamps a stored cap to its concurrency).
        raise InvalidEndpoint(
            f"max_in_flight must be at most {s.concurrency} (the dispatcher's concurrency)"
        )
    if url is not None:
        if len(url) > 2000:
            raise InvalidEndpoint("the URL is longer than 2000 characters")
        try:
            outbound(box).guard.check_static(url)
        except UnsafeDestination as exc:
            raise InvalidEndpoint(str(exc)) from None
    if timeout is not None and not s.min_timeout <= timeout <= s.max_timeout:
        raise InvalidEndpoint(f"timeout must be between {s.min_timeout:g} and {s.max_timeout:g} s")


async def create_endpoint(box: Relaybox, tenant: str, spec: EndpointSpec) -> tuple[Endpoint, str]:
    """Create an endpoint with a fresh secret; returns it and the secret in the form
    its owner verifies with (``whsec_…``, or ``whpk_…`` for ed25519)."""
    _check(box, spec.url, spec.timeout, spec.max_in_flight)
    if spec.signature == "sha256" and spec.secret_type == "ed25519":
        raise InvalidEndpoint("sha256 signatures (X-Webhook-Signature) need an hmac secret")
    vault = await ready_to_seal(box)
    store, now = box.store, box.clock.now()
    endpoint_id = db.new_id("ep", now)
    secret = new_secret(spec.secret_type)
    quota = outbound(box).settings.max_endpoints
    async with store.transaction() as conn:
        await db.first(conn, store, "endpoint_quota_lock", tenant)
        count = await db.first(conn, store, "endpoint_count", tenant)
        if count["n"] >= quota:
            raise EndpointQuotaExceeded(
                f"this tenant already has {count['n']} endpoints, the most allowed"
                f" ({quota}); delete one first"
            )
        await db.execute(
            conn,
            store,
            "endpoint_insert",
            endpoint_id,
            tenant,
            spec.url,
            spec.description or "",
            json.dumps(spec.patterns()),
            spec.signature or "standard",
            spec.timeout,
            json.dumps(spec.schedule) if spec.schedule is not None else None,
            now,
        )
        await db.execute(
            conn,
            store,
            "lane_upsert",
            endpoint_id,
            spec.max_in_flight or outbound(box).settings.max_in_flight,
            spec.rate_limit,
        )
        sealed = vault.seal(secret)
        await db.execute(conn, store, "endpoint_secret_insert", endpoint_id, sealed, now)
        row = await db.first(conn, store, "endpoint_get", endpoint_id, tenant)
    if spec.enabled is False:
        await disable_endpoint(box, endpoint_id, tenant=tenant)
        return await _get(box, endpoint_id, tenant), public_form(secret)
    log.info("endpoint_created", endpoint_id=endpoint_id, tenant=tenant)
    return Endpoint.from_row(row), public_form(secret)


async def get_endpoint(box: Relaybox, endpoint_id: str, tenant: str | None) -> Endpoint | None:
    store = box.store
    async with store.transaction() as conn:
        row = await db.first(conn, store, "endpoint_get", endpoint_id, tenant)
    return Endpoint.from_row(row) if row else None


async def _get(box: Relaybox, endpoint_id: str, tenant: str | None) -> Endpoint:
    found = await get_endpoint(box, endpoint_id, tenant)
    assert found is not None
    return found


async def list_endpoints(box: Relaybox, tenant: str | None, *, limit: int = 100) -> list[Endpoint]:
    store = box.store
    async with store.transaction() as conn:
        found = await db.rows(conn, store, "endpoint_list", tenant, limit)
    return [Endpoint.from_row(r) for r in found]


async def update_endpoint(
    box: Relaybox, endpoint_id: str, tenant: str, patch: EndpointPatch
) -> Endpoint | None:
    """Apply ``patch``; ``enabled`` switches the endpoint on or off. ``None`` when
    the tenant has no such endpoint."""
    _check(box, patch.url, patch.timeout, patch.max_in_flight)
    current = await get_endpoint(box, endpoint_id, tenant)
    if current is None:
        return None
    store, now = box.store, box.clock.now()
    if patch.signature == "sha256":
        secrets = await endpoint_secrets(box, endpoint_id, tenant) or []
        if any(s["secret"].startswith("whpk_") for s in secrets):
            raise InvalidEndpoint("sha256 signatures (X-Webhook-Signature) need an hmac secret")
    schedule = patch.schedule if patch.schedule is not None else current.schedule
    async with store.transaction() as conn:
        await db.execute(
            conn,
            store,
            "endpoint_update",
            endpoint_id,
            tenant,
            patch.url or current.url,
            current.description if patch.description is None else patch.description,
            json.dumps(patch.event_types or current.event_types),
            patch.signature or current.signature,
            patch.timeout if patch.timeout is not None else current.timeout,
            json.dumps(schedule) if schedule is not None else None,
            now,
        )
        await db.execute(
            conn,
            store,
            "lane_upsert",
            endpoint_id,
            patch.max_in_flight or current.max_in_flight,
            patch.rate_limit if patch.rate_limit is not None else current.rate_limit,
        )
    if patch.enabled is True:
        await enable_endpoint(box, endpoint_id, tenant=tenant)
    elif patch.enabled is False:
        await disable_endpoint(box, endpoint_id, tenant=tenant)
    return await get_endpoint(box, endpoint_id, tenant)


async def delete_endpoint(box: Relaybox, endpoint_id: str, tenant: str) -> bool:
    """Delete the endpoint, its secrets and lane; its waiting deliveries become dead
    letters (``endpoint_deleted``) so the history stays readable."""
    store, now = box.store, box.clock.now()
    async with store.transaction() as conn:
        deleted = await db.first(conn, store, "endpoint_delete", endpoint_id, tenant)
        if deleted is None:
            return False
        await db.execute(conn, store, "lane_delete", endpoint_id)
        await kill_deliveries(box, conn, endpoint_id, "endpoint_deleted", now)
    log.info("endpoint_deleted", endpoint_id=endpoint_id, tenant=tenant)
    return True


async def enable_endpoint(
    box: Relaybox, endpoint_id: str, *, tenant: str | None, reason: str = "manual"
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
        row = await db.first(conn, store, "endpoint_set_status", endpoint_id, "enabled", None, now)
        if row is not None:
            data = {
                "endpointId": endpoint_id,
                "tenant": row["tenant"],
                "url": row["url"],
                "reason": reason,
                "wasDisabled": current.disabled_reason,
            }
            ops = outbound(box).settings.operational_tenant
            await publish(box, conn, "relaybox.endpoint.enabled", data, tenant=ops)
    if row is not None:
        log.info("endpoint_enabled", endpoint_id=endpoint_id, tenant=row["tenant"])
    return True


async def disable_endpoint(
    box: Relaybox, endpoint_id: str, *, tenant: str | None, reason: str = "manual"
) -> bool:
    """Switch an endpoint off by hand (operator or tenant)."""
    if await get_endpoint(box, endpoint_id, tenant) is None:
        return False
    async with box.store.transaction() as conn:
        await disable_in(box, conn, endpoint_id, reason=reason)
    return True


async def disable_in(
    box: Relaybox, conn: AsyncConnection, endpoint_id: str, *, reason: str
) -> bool:
    """Disable in the caller's transaction: its waiting deliveries become dead letters
    (``endpoint_disabled``, recoverable), and the operational event
    ``relaybox.endpoint.disabled`` is published to the operational tenant in the same
    transaction. Returns whether this call disabled it."""
    store, now = box.store, box.clock.now()
    row = await db.first(conn, store, "endpoint_set_status", endpoint_id, "disabled", reason, now)
    if row is None:
        return False
    await kill_deliveries(box, conn, endpoint_id, "endpoint_disabled", now)
    data = {
        "endpointId": endpoint_id,
        "tenant": row["tenant"],
        "url": row["url"],
        "reason": reason,
        "failingSince": row["failing_since"],
    }
    ops = outbound(box).settings.operational_tenant
    await publish(box, conn, "relaybox.endpoint.disabled", data, tenant=ops)
    log.warning("endpoint_disabled", endpoint_id=endpoint_id, tenant=row["tenant"], reason=reason)
    return True


async def kill_deliveries(
    box: Relaybox, conn: AsyncConnection, endpoint_id: str, reason: str, now: float
) -> None:
    """The endpoint's waiting deliveries become dead letters (``reason``), in the
    caller's transaction; those under a live lease are left to their dispatcher. Two
    statements: the rows are locked first, so that the second one's snapshot sees
    every lease taken of them (a lease does not write the outbox row on PostgreSQL)."""
    store = box.store
    ids = [r["id"] for r in await db.rows(conn, store, "delivery_lock_endpoint", endpoint_id)]
    if ids:
        await db.execute(
            conn, store, "delivery_kill_endpoint", endpoint_id, reason, now, db.array(store, ids)
        )


async def rotate_secret(
    box: Relaybox,
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
        active = await db.rows(
            conn, store, "endpoint_secrets_active", db.array(store, [endpoint_id]), now
        )
        newest = vault.open(active[0]["secret"]) if active else ""
        secret = new_secret(kind or ("ed25519" if newest.startswith("whsk_") else "hmac"))
        await db.execute(conn, store, "endpoint_secret_expire", endpoint_id, now + grace)
        await db.execute(
            conn, store, "endpoint_secret_insert", endpoint_id, vault.seal(secret), now
        )
    log.info("endpoint_secret_rotated", endpoint_id=endpoint_id, grace=grace)
    return public_form(secret)


async def ready_to_seal(box: Relaybox) -> Vault:
    """The vault, with a key to seal with; raised before anything is written when
    there is none: :class:`SecretsKeyMissing` (PostgreSQL without
    ``outbound.secrets_key``), :class:`KeyFileError` (a broken key file, or a missing
    one while the database holds sealed secrets: the key was lost, and a new one would
    split the secrets between two keys once the old one is restored)."""
    vault = outbound(box).vault
    key_file = vault.key_file
    if key_file is not None and not vault.loaded and key_file.mode() is None:
        store = box.store
        async with store.transaction() as conn:
            sealed = await db.first(conn, store, "endpoint_secret_sealed_any")
        if sealed is not None and key_file.mode() is None:
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


async def seal_secrets(box: Relaybox) -> dict[str, int]:
    """Seal every stored secret with the first key: plaintext ones (stored by older
    versions) and ones sealed with an older key of ``outbound.secrets_key``. In
    batches, each its own transaction; safe with several processes at once (each
    update is a compare-and-set). Returns how many were sealed and how many already
    were. :class:`SecretsLocked` when a secret is sealed with a key relaybox lacks."""
    return await _seal(box, "endpoint_secrets_page")


async def seal_plaintext(box: Relaybox) -> dict[str, int]:
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
        found = await db.rows(conn, box.store, "endpoint_secrets_plaintext_page", 0, 1)
    if not found:  # nothing to seal: no key is made, none is needed
        return {"sealed": 0, "plaintext": 0}
    done = await _seal(box, "endpoint_secrets_plaintext_page")
    return {"sealed": done["sealed"], "plaintext": 0}


async def _seal(box: Relaybox, query: str) -> dict[str, int]:
    vault, store = await ready_to_seal(box), box.store
    sealed = seen = 0
    after = 0
    while True:
        async with store.transaction() as conn:
            page = await db.rows(conn, store, query, after, _SEAL_BATCH)
            for r in page:
                again = vault.reseal(r["secret"])
                if again is not None and await db.first(
                    conn, store, "endpoint_secret_swap", r["id"], r["secret"], again
                ):
                    sealed += 1
        seen += len(page)
        if len(page) < _SEAL_BATCH:
            break
        after = page[-1]["id"]
    if sealed:
        log.info("endpoint_secrets_sealed", sealed=sealed, already=seen - sealed)
    return {"sealed": sealed, "already": seen - sealed}


async def _count_plaintext(box: Relaybox) -> int:
    store, count, after = box.store, 0, 0
    while True:
        async with store.transaction() as conn:
            page = await db.rows(conn, store, "endpoint_secrets_plaintext_page", after, _SEAL_BATCH)
        count += len(page)
        if len(page) < _SEAL_BATCH:
            return count
        after = page[-1]["id"]


async def secrets_at_rest(box: Relaybox) -> dict[str, int]:
    """How the stored secrets stand against the keys relaybox has: counts of
    ``plaintext``, ``current``, ``older`` and ``locked`` (see :meth:`Vault.state`)."""
    vault, store = outbound(box).vault, box.store
    counts = dict.fromkeys(("plaintext", "current", "older", "locked"), 0)
    after = 0
    while True:
        async with store.transaction() as conn:
            page = await db.rows(conn, store, "endpoint_secrets_page", after, _SEAL_BATCH)
        for r in page:
            counts[vault.state(r["secret"])] += 1
        if len(page) < _SEAL_BATCH:
            return counts
        after = page[-1]["id"]


async def endpoint_secrets(
    box: Relaybox, endpoint_id: str, tenant: str | None
) -> list[dict[str, Any]] | None:
    """The active secrets, newest first, in the form the owner verifies with."""
    if await get_endpoint(box, endpoint_id, tenant) is None:
        return None
    store, now, vault = box.store, box.clock.now(), outbound(box).vault
    async with store.transaction() as conn:
        found = await db.rows(
            conn, store, "endpoint_secrets_active", db.array(store, [endpoint_id]), now
        )
    return [
        {
            "secret": public_form(vault.open(r["secret"])),
            "created_at": r["created_at"],
            "expires_at": r["expires_at"],
        }
        for r in found
    ]
