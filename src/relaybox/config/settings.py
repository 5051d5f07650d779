"""The settings as pydantic models: each field bounded, with a safe default. How
they are read (defaults, a TOML file, ``RELAYBOX_*`` variables) is
:mod:`relaybox.config.loading`.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from relaybox.config.outbound import OutboundSettings
from relaybox.config.silence import SilenceSettings

__all__ = [
    "BACKGROUND_ROLES",
    "AdminSettings",
    "BodySettings",
    "ErasureSettings",
    "PortalSettings",
    "RetentionSettings",
    "ServerSettings",
    "Settings",
    "WorkerSettings",
]

BACKGROUND_ROLES = ("worker", "dispatcher", "maintenance")
"""The roles that run as tasks in the application's process (no HTTP of their own)."""


class WorkerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    concurrency: int = Field(4, ge=1, description="transactions at once per process (PostgreSQL)")
    batch: int | None = Field(
        None,
        ge=1,
        le=1000,
        description="rows claimed at once (default: 128 on PostgreSQL, 32 on SQLite)",
    )
    group: int | None = Field(
        None,
        ge=1,
        le=1000,
        description="events per transaction (default: 16 on PostgreSQL, the whole batch on SQLite)",
    )
    savepoints: bool = Field(
        False,
        description=(
            "PostgreSQL groups: a savepoint per event from the start, so that no handler"
            " runs twice for one attempt; by default only after a handler failed"
        ),
    )
    poll_interval: float = Field(1.0, gt=0, description="seconds between polls when idle")
    claim_hold: float = Field(
        30.0, gt=0, description="seconds a claimed row is held back if its worker dies"
    )
    handler_timeout: float = Field(
        30.0,
        gt=0,
        le=24 * 3600,
        description="seconds an async handler may run before it is cancelled and its "
        "attempt fails as a transient error (its transaction rolled back); a plain-def "
        "handler's thread cannot be cancelled",
    )
    handoff: bool = Field(
        True,
        description=(
            "PostgreSQL, a receiver and a worker in one process: the worker takes the new"
            " rows it has room for from the accept's COMMIT, their first attempt counted"
            " in it, instead of claiming them afterwards"
        ),
    )
    backoff_base: float = Field(1.0, gt=0)
    backoff_factor: float = Field(2.0, ge=1)
    backoff_cap: float = Field(600.0, gt=0)
    backoff_jitter: float = Field(0.2, ge=0, lt=1)
    max_attempts: int = Field(10, ge=1)
    max_age: float = Field(3 * 24 * 3600.0, gt=0, description="time budget in seconds")


class AdminSettings(BaseModel):
    """The operator surface (``/admin``). Without a token every admin route answers
    401: an admin API that is open by default is the one that ends up on the internet."""

    model_config = ConfigDict(extra="forbid")

    session_ttl: float = Field(
        8 * 3600.0, gt=0, description="seconds a dashboard login stays valid"
    )
    secure_cookie: bool = Field(
        False, description="mark the session cookie Secure (serve /admin over HTTPS)"
    )
    login_max_body: int = Field(
        4096, ge=256, le=1024 * 1024, description="largest login form, bytes (413 above)"
    )
    form_max_body: int = Field(
        16 * 1024, ge=1024, le=1024 * 1024, description="largest dashboard form, bytes"
    )
    api_max_body: int = Field(
        64 * 1024, ge=1024, le=16 * 1024 * 1024, description="largest admin API body, bytes"
    )
    login_failures_per_address: int = Field(
        5,
        ge=1,
        description="wrong logins from one client address within login_window before "
        "its logins answer 429",
    )
    login_failures_total: int = Field(
        100,
        ge=1,
        description="wrong logins from all addresses within login_window before every "
        "login answers 429 (a guess spread over many addresses)",
    )
    login_window: float = Field(
        60.0, gt=0, le=24 * 3600, description="seconds the login failure counts cover"
    )
    frame_ancestors: str = Field(
        "'none'",
        max_length=1000,
        pattern=r"^[^;,\r\n]+$",
        description="CSP frame-ancestors of every admin answer: 'none' (with "
        "X-Frame-Options: DENY) forbids framing; a source list allows it to those origins",
    )


class PortalSettings(BaseModel):
    """The tenant portal (``/portal``, served with the ``api`` role): pages a tenant
    reaches through a short-lived signed link (:mod:`relaybox.portal`)."""

    model_config = ConfigDict(extra="forbid")

    signing_key: SecretStr | None = Field(
        None,
        description="key that signs portal links and sessions (default: derived from the "
        "endpoint secrets key, outbound.secrets_key or its key file)",
    )
    public_url: str | None = Field(
        None,
        max_length=2000,
        pattern=r"^https?://[^\s]+$",
        description="base URL of the relaybox server as browsers reach it, for the "
        "links box.portal_link makes (the API answers with its own address otherwise)",
    )
    link_ttl: float = Field(300.0, gt=0, le=24 * 3600, description="default link life, s")
    max_link_ttl: float = Field(
        3600.0, gt=0, le=7 * 24 * 3600, description="longest link life a caller may ask, s"
    )
    session_ttl: float = Field(
        3600.0, gt=0, le=24 * 3600, description="seconds a session opened by a link lasts"
    )
    single_use_links: bool = Field(
        False,
        description="links open one session only, unless the caller says otherwise (a "
        "used link answers 410); off by default: mail and chat link scanners open links "
        "before the person does, and would spend them",
    )
    frame_ancestors: str = Field(
        "'none'",
        max_length=1000,
        pattern=r"^[^;,\r\n]+$",
        description="CSP frame-ancestors of every portal answer: the origins of the "
        "application that embeds the portal in an iframe ('none': no framing)",
    )
    theme: dict[str, str] = Field(
        default_factory=dict,
        description="CSS variables of the portal's look, e.g. {accent = '#0a7'}: "
        "accent, fg, muted, line, bg, surface, ok, warn, bad, font, radius",
    )
    form_max_body: int = Field(
        64 * 1024, ge=1024, le=1024 * 1024, description="largest portal form, bytes"
    )
    page_size: int = Field(50, ge=1, le=500, description="rows in a portal listing")

    @field_validator("theme")
    @classmethod
    def _theme(cls, value: dict[str, str]) -> dict[str, str]:
        for name, css in value.items():
            if name not in THEME_VARIABLES:
                raise ValueError(f"unknown theme variable {name!r}: {', '.join(THEME_VARIABLES)}")
            if not _CSS_VALUE.fullmatch(css):
                raise ValueError(f"theme {name}: {css!r} is not a plain CSS value")
        return value


THEME_VARIABLES = (
    "accent", "fg", "muted", "line", "bg", "surface", "ok", "warn", "bad", "font", "radius"
)  # fmt: skip
"""The CSS variables (``--rb-<name>``) a portal theme may set."""

_CSS_VALUE = re.compile(r"[A-Za-z0-9#%.,()\- \"']{1,200}")


class ServerSettings(BaseModel):
    """Limits of the HTTP server that ``relaybox serve`` runs (uvicorn on httptools).
    A request head (request line and headers) over a limit answers 431 and its
    connection is closed; a head or a body that does not arrive in time answers 408.
    When the app runs under your own server, these are that server's job
    (docs/operating.md)."""

    model_config = ConfigDict(extra="forbid")

    max_header_bytes: int = Field(
        32 * 1024,
        ge=1024,
        le=1024 * 1024,
        description="bytes of one request head (request line and headers); more answers 431",
    )
    max_headers: int = Field(
        100, ge=1, le=10_000, description="header fields in one request; more answers 431"
    )
    header_timeout: float = Field(
        10.0,
        gt=0,
        description="seconds within which a request head must arrive in full, counted from "
        "the connection's opening or the first byte of a later request; then 408 and close",
    )
    body_grace: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="seconds a request body has from the end of its head before "
        "body_min_rate applies",
    )
    body_min_rate: int = Field(
        500,
        ge=0,
        le=1024 * 1024 * 1024,
        description="bytes a second a request body must keep up after body_grace: each "
        "byte received gives 1/body_min_rate s more (0: body_timeout alone); a body "
        "behind that answers 408 and is closed",
    )
    body_timeout: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="seconds a whole request body may take at most, from the end of its "
        "head, whatever its rate; then 408 and close",
    )
    keep_alive_timeout: float = Field(
        5.0, gt=0, description="seconds an idle keep-alive connection stays open"
    )
    max_connections: int = Field(
        1000,
        ge=1,
        le=1_000_000,
        description="open connections at once; when all are open, the one that has waited "
        "longest on its client (a head or body still arriving, or idle) is closed for a new "
        "one; when none waits, the new one is answered 503 and closed",
    )
    max_connections_per_address: int = Field(
        100,
        ge=0,
        le=1_000_000,
        description="open connections from one client address (IPv6: one /64); one more "
        "is answered 429 and closed (0: no per-address cap; behind a reverse proxy every "
        "connection comes from the proxy's address)",
    )
    backlog: int = Field(
        2048, ge=1, le=65535, description="connections the kernel queues before accept"
    )


RETENTION_AGE_MIN = 60.0
"""The shortest age a tenant or a source may have (seconds): one minute."""
RETENTION_AGE_MAX = 3650 * 86400.0
"""The longest age a tenant or a source may have (seconds): ten years."""
KEYS_AGE_MIN = 86400.0
"""The shortest keys window (seconds): one day (keys are kept and expired by the day)."""
MAX_RETENTION_SCOPES = 10_000
"""Entries of [retention.tenants] and of [retention.sources] in the configuration."""
MAX_RETENTION_NAME = 128
"""Characters of a tenant id or source name a retention scope names (as a source's
tenant mapping allows)."""


_KEYS_AGE_TEXT = (
    "forgotten (a resend of an older event, or a once() of an older business key, is "
    "then new again; null: the global keys_max_age, else kept for good)"
)


class SourceRetention(BaseModel):
    """``[retention.sources.NAME]``: how long this source's events keep their payload
    (unless their tenant has its own ``payload_max_age``), and how long the keys of its
    events and the business keys its handlers record are kept."""

    model_config = ConfigDict(extra="forbid")

    payload_max_age: float | None = Field(
        None,
        ge=RETENTION_AGE_MIN,
        le=RETENTION_AGE_MAX,
        description="seconds after an event of this source finished before its payload "
        "and headers are dropped (null: the global payload_max_age)",
    )
    keys_max_age: float | None = Field(
        None,
        ge=KEYS_AGE_MIN,
        le=RETENTION_AGE_MAX,
        description="seconds after an event key or a business key of this source was "
        "first seen before it is " + _KEYS_AGE_TEXT,
    )

    @model_validator(mode="after")
    def _some_age(self) -> SourceRetention:
        if self.payload_max_age is None and self.keys_max_age is None:
            raise ValueError("set payload_max_age, keys_max_age or both")
        return self


class TenantRetention(BaseModel):
    """``[retention.tenants.ID]``: a tenant's own ages; an age left out is the global
    one (inbound: the source's, if it has one)."""

    model_config = ConfigDict(extra="forbid")

    payload_max_age: float | None = Field(
        None,
        ge=RETENTION_AGE_MIN,
        le=RETENTION_AGE_MAX,
        description="seconds after an event received for this tenant finished before its "
        "payload and headers are dropped",
    )
    outbox_payload_max_age: float | None = Field(
        None,
        ge=RETENTION_AGE_MIN,
        le=RETENTION_AGE_MAX,
        description="seconds after a delivery to this tenant finished before its payload "
        "and response bytes are dropped (and its message's body once all its deliveries "
        "were)",
    )
    keys_max_age: float | None = Field(
        None,
        ge=KEYS_AGE_MIN,
        le=RETENTION_AGE_MAX,
        description="seconds after a message published for this tenant with an "
        "idempotency key was first seen before that key is forgotten (a publish with it "
        "then creates a new message; null: the global keys_max_age, else kept for good)",
    )


class RetentionSettings(BaseModel):
    """What the maintenance job keeps. Keys and outcomes are kept for good by default:
    a purged event is still a duplicate when its provider resends it, and a business
    key still says the operation happened; ``keys_max_age`` (globally, per source, per
    tenant) bounds how long the keys are kept. On the sending side, deliveries keep
    their status, attempts and errors; a purged delivery can no longer be redelivered
    or recovered."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="run the scheduled purge in the maintenance role")
    payload_max_age: float = Field(
        30 * 24 * 3600.0,
        gt=0,
        description="seconds after an event finished (done, ignored, discarded) before its "
        "payload and headers are dropped",
    )
    outbox_payload_max_age: float = Field(
        30 * 24 * 3600.0,
        gt=0,
        description="seconds after a delivery finished (sent, dead) before its payload and "
        "its attempts' response bytes are dropped, and its message's body once every "
        "delivery of it is purged",
    )
    keys_max_age: float | None = Field(
        None,
        ge=KEYS_AGE_MIN,
        le=RETENTION_AGE_MAX,
        description="seconds after an event key, an idempotency key or a business key was "
        "first seen before it is forgotten, whole days (null: kept for good). A resend of "
        "an older event is then accepted as new, a publish with an older idempotency key "
        "creates a new message, once() with an older business key returns True again. "
        "PostgreSQL's outbox keys (a handler's or the application's outbox row, a "
        "delivery) go at the longest of this and every source's and tenant's window",
    )
    interval: float = Field(3600.0, gt=0, description="seconds between maintenance runs")
    batch: int = Field(
        1000,
        ge=1,
        le=100_000,
        description="rows purged, keys backfilled and subject index rows read, per transaction",
    )
    max_tenant_policies: int = Field(
        10_000,
        ge=1,
        le=1_000_000,
        description="tenants that may have a retention policy set through the admin API "
        "(the purge reads them all at the start of each run)",
    )
    partitions: Literal["off", "day", "week"] = Field(
        "off",
        description="PostgreSQL: partition the inbox, its attempts and the quarantine by "
        "time, a partition a day or a week (`relaybox migrate` converts the live tables); "
        "maintenance then drops a whole partition once every row in it is past its age, "
        "instead of purging payloads row by row. off: one table each, the per-row purge",
    )
    partitions_ahead: int = Field(
        3, ge=1, le=60, description="periods of partitions made ahead of today"
    )
    tenants: dict[str, TenantRetention] = Field(
        default_factory=dict,
        description="[retention.tenants.ID]: a tenant's own ages (the admin API's, set "
        "per tenant, win over these)",
    )
    sources: dict[str, SourceRetention] = Field(
        default_factory=dict,
        description="[retention.sources.NAME]: a source's own payload_max_age and keys_max_age",
    )

    @field_validator("tenants", "sources")
    @classmethod
    def _scope_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        if len(value) > MAX_RETENTION_SCOPES:
            raise ValueError(f"at most {MAX_RETENTION_SCOPES} entries")
        for name in value:
            if not name or len(name) > MAX_RETENTION_NAME or "\x00" in name:
                raise ValueError(
                    f"{name[:40]!r}: a name of 1 to {MAX_RETENTION_NAME} characters, no NUL"
                )
        return value


class ErasureSettings(BaseModel):
    """Erasing one subject (:mod:`relaybox.erasure`): how much one transaction empties,
    and the bounds of the subject paths sources declare."""

    model_config = ConfigDict(extra="forbid")

    batch: int = Field(
        500,
        ge=1,
        le=100_000,
        description="rows an erasure empties per transaction (short locks on big subjects)",
    )
    path_max_depth: int = Field(
        8, ge=1, le=32, description="names in a subject path (data.object.customer: 3)"
    )
    path_max_chars: int = Field(200, ge=1, le=512, description="characters in a subject path")


class BodySettings(BaseModel):
    """Bounds on request bodies that are not JSON (form, multipart, XML) and on the
    query strings of handshakes (:mod:`relaybox.sources.bodies`). The byte size is
    each source's ``max_body``."""

    model_config = ConfigDict(extra="forbid")

    max_fields: int = Field(
        1000, ge=1, le=100_000, description="form fields, multipart parts, query parameters"
    )
    max_xml_depth: int = Field(64, ge=1, le=1000, description="nesting depth of an XML body")
    max_xml_elements: int = Field(100_000, ge=1, description="elements in an XML body")


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    database_url: str = "sqlite:///relaybox.db"
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    log_level: str = Field("info", pattern="^(debug|info|warning|error)$")
    log_json: bool = True
    accept_timeout: float = Field(10.0, gt=0)
    clock_max_skew: float = Field(
        5.0,
        gt=0,
        le=3600,
        description="PostgreSQL: seconds this host's clock may differ from the database "
        "server's before its worker and dispatcher stop taking work (relaybox's own times "
        "come from the database's clock whatever the skew; past this, time sync is broken)",
    )
    accept_committers: int | None = Field(
        None,
        ge=1,
        le=64,
        description="commits in flight for accepts (default: 3 PostgreSQL, 1 SQLite)",
    )
    gc_freeze: bool = Field(
        True,
        description="at start, move the objects alive then out of the cyclic garbage "
        "collector's reach (gc.freeze): its full passes over the startup heap stalled "
        "requests 30-50 ms",
    )
    dispatch_gc_threshold: int = Field(
        10_000,
        ge=0,
        description="relaybox dispatch: objects allocated between two passes of the cyclic "
        "garbage collector over the young ones (gc.set_threshold; 0 keeps Python's 700): "
        "at 700 each pass traversed again the objects of the attempts in flight, ~15 % of "
        "the dispatcher's CPU",
    )
    pool_size: int | None = Field(
        None,
        ge=1,
        le=1000,
        description="PostgreSQL: connections SQLAlchemy's pool keeps for handlers, publish and "
        "the API (default: the worker's concurrency + 2, at least 10)",
    )
    pool_overflow: int = Field(
        10,
        ge=0,
        le=1000,
        description="PostgreSQL: connections opened beyond pool_size while all are in use, "
        "each closed when it comes back to a full pool",
    )
    pool_timeout: float = Field(
        10.0,
        gt=0,
        le=300,
        description="seconds a request or a role waits for a pooled connection while all "
        "are in use (SQLite: its one connection) before it gives up (the HTTP surfaces "
        "answer 503)",
    )
    idle_in_transaction_timeout: float = Field(
        20.0,
        ge=0,
        le=24 * 3600,
        description="PostgreSQL: seconds a session of relaybox's may sit idle inside an "
        "open transaction before the server ends it (idle_in_transaction_session_timeout): "
        "the row locks of a handler stuck after a statement, or of a frozen process, are "
        "released; keep it below worker.claim_hold, so that its rows come back to other "
        "workers when their hold ends (0: the server's own setting)",
    )
    admin_token: SecretStr | None = Field(
        None, description="bearer token of the admin API and the dashboard login"
    )
    migrate: Literal["auto", "check"] = Field(
        "auto",
        description="at start (box.lifespan, box.running, relaybox serve): 'auto' applies "
        "pending migrations, 'check' only checks them (run `relaybox migrate` in your deploy)",
    )
    lifespan_roles: list[str] = Field(
        default_factory=lambda: list(BACKGROUND_ROLES),
        description="background roles box.lifespan starts in the application's process",
    )
    admin: AdminSettings = Field(default_factory=AdminSettings)
    portal: PortalSettings = Field(default_factory=PortalSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    retention: RetentionSettings = Field(default_factory=RetentionSettings)
    erasure: ErasureSettings = Field(default_factory=ErasureSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    outbound: OutboundSettings = Field(default_factory=OutboundSettings)
    bodies: BodySettings = Field(default_factory=BodySettings)
    silence: SilenceSettings = Field(default_factory=SilenceSettings)
    sources: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @field_validator("lifespan_roles")
    @classmethod
    def _known_roles(cls, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - set(BACKGROUND_ROLES))
        if unknown:
            raise ValueError(
                f"unknown role(s) {', '.join(unknown)}: choose from {', '.join(BACKGROUND_ROLES)}"
            )
        return value

    @field_validator("admin_token")
    @classmethod
    def _token_long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        # An empty variable (RELAYBOX_ADMIN_TOKEN=) means "unset", not "the empty token".
        if value is None or value.get_secret_value() == "":
            return None
        if len(value.get_secret_value()) < 16:
            raise ValueError("must be at least 16 characters (use a random string)")
        return value
