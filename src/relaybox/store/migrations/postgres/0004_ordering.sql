-- Ordering, reconciliation, recovery (PostgreSQL). No semicolons in comments: the
-- migration runner splits statements on them.

-- Set in the handler's transaction when ctx.project() refused this event's state
-- because the stored version is newer ("resource_key@stored_version").
ALTER TABLE relaybox_inbox ADD COLUMN superseded_by TEXT;
-- Set when the row did not come from a webhook POST but from a provider's API
-- (pull-based recovery): "github-api:delivery/123".
ALTER TABLE relaybox_inbox ADD COLUMN recovered_via TEXT;
-- Recovery asks "did any row of this source already hold this event id?", whatever
-- the account the delivery mapped to.
CREATE INDEX IF NOT EXISTS relaybox_inbox_source_event ON relaybox_inbox (source, event_id);

-- Current state of a resource, written only by a newer version (compare-and-set).
-- version_key is an order-preserving encoding of version compared byte-wise.
-- origin keeps provider versions (event) and fetch tickets (reconcile) apart.
CREATE TABLE relaybox_projections (
    resource_key TEXT PRIMARY KEY,
    origin       TEXT NOT NULL CHECK (origin IN ('event', 'reconcile')),
    version      TEXT NOT NULL,
    version_key  TEXT COLLATE "C" NOT NULL,
    state        TEXT,
    source       TEXT,
    inbox_id     BIGINT,
    updated_at   DOUBLE PRECISION NOT NULL
);
CREATE INDEX relaybox_projections_source ON relaybox_projections (source);

-- One row per reconciled resource: the fetch ticket counter (issued before each
-- fetch), and request/handled counters for reconciliations asked by handlers.
CREATE TABLE relaybox_reconcile (
    source           TEXT NOT NULL,
    resource_id      TEXT NOT NULL,
    issued           BIGINT NOT NULL DEFAULT 0,
    requested        BIGINT NOT NULL DEFAULT 0,
    handled          BIGINT NOT NULL DEFAULT 0,
    divergences      BIGINT NOT NULL DEFAULT 0,
    last_checked_at  DOUBLE PRECISION,
    last_diverged_at DOUBLE PRECISION,
    PRIMARY KEY (source, resource_id)
);

-- Every recovery action: a delivery ingested from the provider's API, or a
-- redelivery asked of the provider.
CREATE TABLE relaybox_recoveries (
    id          BIGSERIAL PRIMARY KEY,
    source      TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    delivery_id TEXT NOT NULL,
    action      TEXT NOT NULL CHECK (action IN ('ingested', 'redelivery_requested')),
    inbox_id    BIGINT,
    recovered_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX relaybox_recoveries_event ON relaybox_recoveries (source, event_id);
