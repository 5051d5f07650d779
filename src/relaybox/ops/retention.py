"""Retention per tenant and per source, for operators: the admin API's
``/retention`` operations and the dashboard's Retention page
(:mod:`relaybox.retention.policy` decides which age applies to which row).

A tenant's ages are set in the configuration file (``[retention.tenants.ID]``) or here
(stored in the database, so they survive restarts and apply in every process); for
each age, the value set here wins over the file's. Removing the tenant's policy here
brings the file's values (or the global ones) back. Sources' ages are set in the file
only and shown here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import BeforeValidator, Field

from relaybox.config import (
    KEYS_AGE_MIN,
    MAX_RETENTION_NAME,
    RETENTION_AGE_MAX,
    RETENTION_AGE_MIN,
    TenantRetention,
)
from relaybox.errors import Conflict, NotFound, OpsError
from relaybox.ops.inbound_models import RequestModel, _Model
from relaybox.retention.policy import AgeOrigin
from relaybox.store.keys_index import DAY_INDEXES
from relaybox.store.retention import RetentionPolicyRow

if TYPE_CHECKING:
    from relaybox.runtime import Runtime

__all__ = [
    "InvalidPolicy",
    "RetentionOverview",
    "SourceAges",
    "StoredAges",
    "TenantAgesView",
    "TenantPage",
    "TenantPolicyRequest",
    "TenantQuery",
    "clear_tenant",
    "overview",
    "set_tenant",
    "tenant_ages",
]


def _number(value: object) -> object:
    # A JSON number only: true, "30d" or "3600" are refused (400), not converted.
    if isinstance(value, bool) or not isinstance(value, int | float | None):
        raise ValueError("must be a number of seconds")
    return value


Age = Annotated[float, BeforeValidator(_number), Field(ge=RETENTION_AGE_MIN, le=RETENTION_AGE_MAX)]
"""An age in seconds as the API takes it: a JSON number from a minute to ten years."""

KeysAge = Annotated[float, BeforeValidator(_number), Field(ge=KEYS_AGE_MIN, le=RETENTION_AGE_MAX)]
"""A keys window in seconds as the API takes it: a JSON number from a day to ten years."""

KEYS_WINDOW_TEXT = (
    "Keys (what decides a duplicate event, a repeated publish, a business key) are kept "
    "for good unless a keys window is set: a key first seen longer ago than its window "
    "is forgotten, and a resend of an older event is then accepted as new"
)


class InvalidPolicy(OpsError, status=422, code="invalid_policy"):
    """A policy relaybox cannot store (422)."""


class TenantPolicyRequest(RequestModel):
    payload_max_age: Age | None = Field(
        None,
        description="seconds after an event received for this tenant finished before its "
        "payload and headers are dropped (null: the file's, else its source's or the "
        "global age)",
    )
    outbox_payload_max_age: Age | None = Field(
        None,
        description="seconds after a delivery to this tenant finished before its payload "
        "and response bytes are dropped, and its message's body once every delivery was "
        "(null: the file's, else the global age)",
    )
    keys_max_age: KeysAge | None = Field(
        None,
        description="seconds after a message published for this tenant with an "
        "idempotency key was first seen before that key is forgotten (a publish with it "
        "then creates a new message; null: the file's, else the global keys_max_age, "
        "else kept for good)",
    )
    actor: str | None = Field(None, min_length=1, max_length=200, description="who (recorded)")


class StoredAges(_Model):
    """What the admin API set for the tenant (``null`` where it set nothing)."""

    payload_max_age: float | None
    outbox_payload_max_age: float | None
    updated_at: float
    updated_by: str
    keys_max_age: float | None = None


class ConfiguredAges(_Model):
    """The tenant's table in the configuration file."""

    payload_max_age: float | None
    outbox_payload_max_age: float | None
    keys_max_age: float | None = None


class TenantAgesView(_Model):
    tenant: str
    payload_max_age: float | None = Field(
        description="the inbound age that applies (null: each event's source's, or the global age)"
    )
    payload_origin: AgeOrigin = Field(
        description="api, config, or default (the source's or the global age)"
    )
    outbox_payload_max_age: float = Field(description="the outbound age that applies")
    outbox_origin: AgeOrigin = Field(description="api, config or default")
    keys_max_age: float | None = Field(
        None,
        description="how long the idempotency keys of the tenant's messages are kept "
        "(null: for good)",
    )
    keys_origin: AgeOrigin = Field("default", description="api, config or default")
    api: StoredAges | None = Field(description="set through the admin API (wins)")
    config: ConfiguredAges | None = Field(description="set in [retention.tenants.ID]")


class SourceAges(_Model):
    source: str
    payload_max_age: float = Field(description="its own, else the global age")
    keys_max_age: float | None = Field(
        None,
        description="how long its events' keys and its handlers' business keys are kept "
        "(its own, else the global keys_max_age; null: for good)",
    )


class TenantQuery(RequestModel):
    after: str = Field("", max_length=MAX_RETENTION_NAME, description="the page's cursor")
    limit: int = Field(100, ge=1, le=500, description="tenants per page")


class TenantPage(_Model):
    items: list[TenantAgesView]
    next: str | None = Field(description="the next page's cursor (`after`), null at the end")


class RetentionOverview(_Model):
    payload_max_age: float = Field(description="retention.payload_max_age")
    outbox_payload_max_age: float = Field(description="retention.outbox_payload_max_age")
    keys_max_age: float | None = Field(
        None, description="retention.keys_max_age (null: keys are kept for good)"
    )
    sources: list[SourceAges] = Field(description="[retention.sources.NAME], by name")
    tenants: TenantPage = Field(description="tenants with ages of their own, by id")
    max_tenant_policies: int = Field(description="retention.max_tenant_policies")
    day_indexes: dict[str, bool] = Field(
        default_factory=dict,
        description="each keys table: whether it has its index by day (the maintenance "
        "builds it while a keys window applies to the table, drops it when none does)",
    )


def _check_tenant(tenant: str) -> None:
    if not tenant or len(tenant) > MAX_RETENTION_NAME:
        raise NotFound(f"no tenant {tenant[:40]!r}: ids have 1 to {MAX_RETENTION_NAME} characters")


def _age(
    name: str,
    default: float | None,
    row: RetentionPolicyRow | None,
    conf: TenantRetention | None,
) -> tuple[float | None, AgeOrigin]:
    """The age ``name`` in force for a tenant and where it comes from: the admin
    API's (``row``) over the file's (``conf``) over the default."""
    if row is not None and getattr(row, name) is not None:
        return getattr(row, name), "api"
    if conf is not None and getattr(conf, name) is not None:
        return getattr(conf, name), "config"
    return default, "default"


def _view(
    box: Runtime, tenant: str, row: RetentionPolicyRow | None, conf: TenantRetention | None
) -> TenantAgesView:
    settings = box.settings.retention
    inbound, inbound_origin = _age("payload_max_age", None, row, conf)
    outbound, outbound_origin = _age(
        "outbox_payload_max_age", settings.outbox_payload_max_age, row, conf
    )
    keys_age, keys_origin = _age("keys_max_age", settings.keys_max_age, row, conf)
    return TenantAgesView(
        tenant=tenant,
        payload_max_age=inbound,
        payload_origin=inbound_origin,
        outbox_payload_max_age=outbound,
        outbox_origin=outbound_origin,
        keys_max_age=keys_age,
        keys_origin=keys_origin,
        # What each layer says, as it says it (its fields read off the row, the file's).
        api=None if row is None else StoredAges.model_validate(row, from_attributes=True),
        config=None if conf is None else ConfiguredAges.model_validate(conf, from_attributes=True),
    )


async def tenant_ages(box: Runtime, tenant: str) -> TenantAgesView:
    """The ages that apply to ``tenant`` and where each comes from (any tenant id:
    one without ages of its own has the global ones)."""
    _check_tenant(tenant)
    row = await box.store.retention.policy_get(tenant)
    return _view(box, tenant, row, box.settings.retention.tenants.get(tenant))


async def set_tenant(
    box: Runtime, tenant: str, request: TenantPolicyRequest, *, actor: str
) -> TenantAgesView:
    """Set (replace) the ages the admin API gives ``tenant``: an age left null is the
    file's (or the default). 422 when both are null (remove the policy instead) or the
    id is too long; 409 when ``retention.max_tenant_policies`` tenants have one."""
    if not tenant or len(tenant) > MAX_RETENTION_NAME:
        raise InvalidPolicy(f"a tenant id has 1 to {MAX_RETENTION_NAME} characters")
    inbound = None if request.payload_max_age is None else float(request.payload_max_age)
    outbound = (
        None if request.outbox_payload_max_age is None else float(request.outbox_payload_max_age)
    )
    keys_age = None if request.keys_max_age is None else float(request.keys_max_age)
    if inbound is None and outbound is None and keys_age is None:
        raise InvalidPolicy(
            "set payload_max_age, outbox_payload_max_age, keys_max_age or some of them; "
            "to go back to the configuration's ages, remove the tenant's policy instead"
        )
    settings = box.settings.retention
    row = await box.store.retention.policy_put(
        tenant,
        payload_max_age=inbound,
        outbox_payload_max_age=outbound,
        now=box.clock.now(),
        actor=actor,
        max_policies=settings.max_tenant_policies,
        keys_max_age=keys_age,
    )
    if row is None:
        raise Conflict(
            f"{settings.max_tenant_policies} tenants have a retention policy already "
            "(retention.max_tenant_policies): remove one first",
            code="too_many_policies",
        )
    return _view(box, tenant, row, settings.tenants.get(tenant))


async def clear_tenant(box: Runtime, tenant: str) -> TenantAgesView:
    """Remove the admin API's ages of ``tenant`` (404 when it set none): the file's, or
    the global ones, apply again."""
    _check_tenant(tenant)
    if not await box.store.retention.policy_delete(tenant):
        raise NotFound(
            f"tenant {tenant!r} has no retention policy stored (set through the admin API, "
            "the dashboard or relaybox retention set)"
        )
    return _view(box, tenant, None, box.settings.retention.tenants.get(tenant))


async def tenant_page(box: Runtime, *, after: str = "", limit: int = 100) -> TenantPage:
    """The tenants with ages of their own (in the file, through the API or both), by
    id, ``limit`` after the cursor ``after``."""
    configured = box.settings.retention.tenants
    stored = await box.store.retention.policy_page(after=after, limit=limit + 1)
    by_tenant = {row.tenant: row for row in stored}
    names = sorted({*by_tenant, *(t for t in configured if t > after)})
    if len(stored) > limit:
        # Past the stored page's last tenant, a file-only tenant may sort before a
        # stored one this page did not read: stop at the last stored one read.
        names = [n for n in names if n <= stored[limit - 1].tenant]
    page = names[:limit]
    items = [_view(box, n, by_tenant.get(n), configured.get(n)) for n in page]
    more = len(names) > limit or len(stored) > limit
    return TenantPage(items=items, next=page[-1] if more and page else None)


async def overview(box: Runtime, *, after: str = "", limit: int = 100) -> RetentionOverview:
    """The global ages, each source's and a page of the tenants'."""
    settings = box.settings.retention
    return RetentionOverview(
        payload_max_age=settings.payload_max_age,
        outbox_payload_max_age=settings.outbox_payload_max_age,
        keys_max_age=settings.keys_max_age,
        sources=[
            SourceAges(
                source=name,
                payload_max_age=settings.payload_max_age
                if s.payload_max_age is None
                else s.payload_max_age,
                keys_max_age=settings.keys_max_age if s.keys_max_age is None else s.keys_max_age,
            )
            for name, s in sorted(settings.sources.items())
        ],
        tenants=await tenant_page(box, after=after, limit=limit),
        max_tenant_policies=settings.max_tenant_policies,
        day_indexes={
            DAY_INDEXES[kind][0]: present
            for kind, present in (await box.store.keys.day_indexes()).items()
        },
    )
