"""The admin app's retention section: the ages that apply per tenant and per source.

* ``GET /retention``: the global ages, each source's (``[retention.sources.NAME]``)
  and a page of the tenants with ages of their own;
* ``GET /retention/tenants/{tenant}``: the ages that apply to one tenant and where
  each comes from (the admin API, the configuration file, the default);
* ``PUT /retention/tenants/{tenant}``: set the tenant's ages (stored in the database:
  they win over the file's, in every process, after restarts);
* ``DELETE /retention/tenants/{tenant}``: remove them (the file's apply again).

The dashboard page ``/retention`` shows the same and sets or removes a tenant's ages
with forms (durations such as ``7d`` or ``12h``).
"""

from __future__ import annotations

from urllib.parse import urlencode

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from relaybox.admin import html
from relaybox.admin.sections import Call, Operation, Section, register_section
from relaybox.errors import InvalidRequest, InvalidTimeSpec
from relaybox.ops import retention as ops
from relaybox.timespec import parse_duration

__all__ = ["OPERATIONS", "PAGES", "register"]


async def _overview(c: Call) -> BaseModel:
    return await ops.overview(c.box, after=c.query.after, limit=c.query.limit)


async def _get(c: Call) -> BaseModel:
    return await ops.tenant_ages(c.box, c.path["tenant"])


async def _put(c: Call) -> BaseModel:
    return await ops.set_tenant(c.box, c.path["tenant"], c.body, actor=c.actor)


async def _delete(c: Call) -> BaseModel:
    return await ops.clear_tenant(c.box, c.path["tenant"])


_PRECEDENCE = (
    "An inbound age (events' and quarantine entries' payloads) comes from the event's "
    "tenant, else its source, else retention.payload_max_age; an outbound age "
    "(deliveries' payloads and responses, messages' bodies) from the tenant, else "
    "retention.outbox_payload_max_age. For a tenant, the admin API's value wins over "
    "the configuration file's ([retention.tenants.ID]). " + ops.KEYS_WINDOW_TEXT + "."
)

OPERATIONS = (
    Operation(
        "GET",
        "/retention",
        "getRetention",
        "The payload ages and keys windows that apply: global, per source, per tenant",
        _overview,
        ops.RetentionOverview,
        query=ops.TenantQuery,
        errors=(400,),
        description=_PRECEDENCE + " Tenants are listed by id, `limit` a page after `after`.",
    ),
    Operation(
        "GET",
        "/retention/tenants/{tenant:str}",
        "getTenantRetention",
        "The ages that apply to one tenant, and where each comes from",
        _get,
        ops.TenantAgesView,
        errors=(404,),
        description="Any tenant id (1 to 128 characters): one without ages of its own "
        "has the default ones (origin `default`).",
    ),
    Operation(
        "PUT",
        "/retention/tenants/{tenant:str}",
        "setTenantRetention",
        "Set a tenant's payload ages and keys window (they win over the file's)",
        _put,
        ops.TenantAgesView,
        body=ops.TenantPolicyRequest,
        errors=(400, 409, 422),
        description="Ages in seconds, from 60 to 315360000 (ten years; keys_max_age from "
        "86400, a day); null leaves that age to the file or the default. 422 "
        "`invalid_policy` when all are null or the "
        "id is longer than 128 characters; 409 `too_many_policies` when retention."
        "max_tenant_policies tenants have a policy already. The next purge applies it.",
    ),
    Operation(
        "DELETE",
        "/retention/tenants/{tenant:str}",
        "clearTenantRetention",
        "Remove the ages the admin API set for a tenant",
        _delete,
        ops.TenantAgesView,
        errors=(404,),
        description="The configuration file's ages (or the default ones) apply again; "
        "the answer shows them. 404 when the admin API set none for this tenant.",
    ),
)


def _age(form: dict[str, str], name: str) -> float | None:
    raw = form.get(name, "").strip()
    if not raw:
        return None
    try:
        return parse_duration(raw[:40])
    except InvalidTimeSpec:
        raise InvalidRequest(f"{name}: not a duration", hint="bad_age") from None


@html.page
async def retention_page(request: Request) -> Response:
    query = ops.TenantQuery.model_validate(
        {k: v for k, v in request.query_params.items() if k in ("after", "limit") and v}
    )
    found = await ops.overview(html.box_of(request), after=query.after, limit=query.limit)
    cursor = found.tenants.next
    return await html.render(
        request,
        "retention.html",
        active="retention",
        page=found,
        next_url=None if cursor is None else f"{request.url.path}?{urlencode({'after': cursor})}",
    )


@html.action
async def set_action(request: Request, form: dict[str, str]) -> str:
    try:
        body = ops.TenantPolicyRequest(
            payload_max_age=_age(form, "payload_max_age"),
            outbox_payload_max_age=_age(form, "outbox_payload_max_age"),
            keys_max_age=_age(form, "keys_max_age"),
        )
    except ValidationError:
        raise InvalidRequest("an age is out of bounds", hint="bad_age") from None
    await ops.set_tenant(
        html.box_of(request),
        form.get("tenant", "").strip(),
        body,
        actor=html.actor_of(request),
    )
    return "retention_set"


@html.action
async def clear_action(request: Request, form: dict[str, str]) -> str:
    await ops.clear_tenant(html.box_of(request), form.get("tenant", ""))
    return "retention_cleared"


PAGES = (
    Route("/retention", retention_page, methods=["GET"]),
    Route("/retention/set", set_action, methods=["POST"]),
    Route("/retention/clear", clear_action, methods=["POST"]),
)


def register() -> None:
    """Add the retention section (after erasures)."""
    register_section(
        Section(
            "retention",
            "Retention",
            36,
            nav_path="/retention",
            operations=OPERATIONS,
            pages=PAGES,
            requires_tables=("relaybox_retention_policies",),
            tag_description="How long payloads and keys are kept, per tenant and per source.",
        )
    )
