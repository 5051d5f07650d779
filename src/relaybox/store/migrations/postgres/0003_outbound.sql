-- Sending: endpoints, messages, the event-type catalog, API keys, per-lane flow
-- control and the attempt log. The outbox itself (0001) gains what delivery needs.

-- A tenant's webhook endpoint. Lane settings (in-flight cap, rate limit) live in
-- relaybox_lanes under the endpoint id, next to the flow state they govern.
CREATE TABLE relaybox_endpoints (
    id              TEXT PRIMARY KEY,
    tenant          TEXT NOT NULL,
    url             TEXT NOT NULL,
    description     TEXT NOT NULL DEFAULT '',
    event_types     TEXT NOT NULL,
    status          TEXT NOT NULL DEFAULT 'enabled' CHECK (status IN ('enabled', 'disabled')),
    disabled_reason TEXT,
    signature       TEXT NOT NULL DEFAULT 'standard' CHECK (signature IN ('standard', 'sha256')),
    timeout         DOUBLE PRECISION,
    schedule        TEXT,
    failing_since   DOUBLE PRECISION,
    created_at      DOUBLE PRECISION NOT NULL,
    updated_at      DOUBLE PRECISION NOT NULL
);
CREATE INDEX relaybox_endpoints_tenant ON relaybox_endpoints (tenant, created_at);

-- Signing secrets. expires_at NULL: active until rotated. During a rotation every
-- unexpired secret signs, so receivers can switch at their own pace.
CREATE TABLE relaybox_endpoint_secrets (
    id          BIGSERIAL PRIMARY KEY,
    endpoint_id TEXT NOT NULL REFERENCES relaybox_endpoints (id) ON DELETE CASCADE,
    secret      TEXT NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL,
    expires_at  DOUBLE PRECISION
);
CREATE INDEX relaybox_endpoint_secrets_endpoint ON relaybox_endpoint_secrets (endpoint_id);

-- One lane per destination (an endpoint id, or a channel name for channel rows):
-- the unit of in-flight caps, rate limits (a token bucket) and round-robin leasing.
-- The dispatcher locks lane rows (SKIP LOCKED) while it leases, so two dispatchers
-- never overshoot one lane's cap.
CREATE TABLE relaybox_lanes (
    lane          TEXT PRIMARY KEY,
    max_in_flight INTEGER NOT NULL CHECK (max_in_flight >= 1),
    rate_limit    DOUBLE PRECISION CHECK (rate_limit > 0),
    tokens        DOUBLE PRECISION NOT NULL DEFAULT 1,
    refilled_at   DOUBLE PRECISION NOT NULL DEFAULT 0,
    leased_at     DOUBLE PRECISION NOT NULL DEFAULT 0
);

-- A published event: the exact body every endpoint receives (so a retry signs the
-- same bytes), and the producer's idempotency key, unique within the tenant.
CREATE TABLE relaybox_messages (
    id              TEXT PRIMARY KEY,
    tenant          TEXT NOT NULL,
    event_type      TEXT NOT NULL,
    idempotency_key TEXT,
    body            TEXT NOT NULL,
    created_at      DOUBLE PRECISION NOT NULL,
    CONSTRAINT relaybox_messages_idempotency UNIQUE (tenant, idempotency_key)
);
CREATE INDEX relaybox_messages_tenant ON relaybox_messages (tenant, created_at);

CREATE TABLE relaybox_event_types (
    name        TEXT PRIMARY KEY,
    description TEXT NOT NULL DEFAULT '',
    schema      TEXT,
    created_at  DOUBLE PRECISION NOT NULL,
    updated_at  DOUBLE PRECISION NOT NULL
);

-- Tenant API keys, stored as SHA-256 of a 256-bit random key: a leaked table does
-- not leak usable keys, and a lookup stays one indexed equality.
CREATE TABLE relaybox_api_keys (
    id         TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL,
    name       TEXT NOT NULL,
    key_hash   TEXT NOT NULL UNIQUE,
    created_at DOUBLE PRECISION NOT NULL,
    revoked_at DOUBLE PRECISION
);

-- Every delivery attempt: when, how long, what came back (first bytes only).
CREATE TABLE relaybox_outbox_attempts (
    id          BIGSERIAL PRIMARY KEY,
    outbox_id   BIGINT NOT NULL,
    attempt     INTEGER NOT NULL,
    lease_token BIGINT,
    dispatcher  TEXT,
    started_at  DOUBLE PRECISION NOT NULL,
    duration    DOUBLE PRECISION NOT NULL,
    outcome     TEXT NOT NULL,
    status_code INTEGER,
    error       TEXT,
    response    TEXT
);
CREATE INDEX relaybox_outbox_attempts_outbox ON relaybox_outbox_attempts (outbox_id);

-- lane: NULL for rows recorded by handlers (ctx.outbox.add), whose lane is their
-- channel. uncertain: this lease replaced an expired one whose outcome is unknown.
ALTER TABLE relaybox_outbox ADD COLUMN lane TEXT;
ALTER TABLE relaybox_outbox ADD COLUMN endpoint_id TEXT;
ALTER TABLE relaybox_outbox ADD COLUMN message_id TEXT;
ALTER TABLE relaybox_outbox ADD COLUMN dead_reason TEXT;
ALTER TABLE relaybox_outbox ADD COLUMN last_status INTEGER;
ALTER TABLE relaybox_outbox ADD COLUMN uncertain BOOLEAN NOT NULL DEFAULT false;
CREATE INDEX relaybox_outbox_lane_due ON relaybox_outbox (COALESCE(lane, channel), next_attempt_at)
    WHERE status = 'pending';
-- Rows under a lease (live or expired): what the in-flight count reads.
CREATE INDEX relaybox_outbox_leased ON relaybox_outbox (COALESCE(lane, channel))
    WHERE status = 'pending' AND lease_until IS NOT NULL;
CREATE INDEX relaybox_outbox_endpoint ON relaybox_outbox (endpoint_id, created_at)
    WHERE endpoint_id IS NOT NULL;
CREATE INDEX relaybox_outbox_message ON relaybox_outbox (message_id) WHERE message_id IS NOT NULL;
CREATE INDEX relaybox_outbox_undelivered ON relaybox_outbox (tenant, created_at)
    WHERE status <> 'sent'
