-- relaybox schema v1 (PostgreSQL). Times are epoch seconds (double precision), the
-- same numbers as on SQLite, so one injectable clock drives both backends.

-- Receipts. The event key (source, account, event_id) is UNIQUE and non-null: the
-- database, not a prior "exists?" query, decides which concurrent delivery is first.
CREATE TABLE relaybox_inbox (
    id              BIGSERIAL PRIMARY KEY,
    source          TEXT NOT NULL,
    account         TEXT NOT NULL,
    event_id        TEXT NOT NULL,
    event_type      TEXT NOT NULL,
    tenant          TEXT,
    fingerprint     BYTEA NOT NULL,
    payload         BYTEA,
    headers         TEXT,
    version         TEXT,
    status          TEXT NOT NULL CHECK (status IN ('pending', 'done', 'dead', 'ignored')),
    dead_reason     TEXT,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at DOUBLE PRECISION NOT NULL,
    last_error      TEXT,
    received_at     DOUBLE PRECISION NOT NULL,
    updated_at      DOUBLE PRECISION NOT NULL,
    done_at         DOUBLE PRECISION,
    CONSTRAINT relaybox_inbox_event_key UNIQUE (source, account, event_id)
);
-- The claim query reads only due pending rows: a partial index keeps it independent
-- of how many done rows the table holds.
CREATE INDEX relaybox_inbox_due ON relaybox_inbox (next_attempt_at) WHERE status = 'pending';
CREATE INDEX relaybox_inbox_received ON relaybox_inbox (received_at);
CREATE INDEX relaybox_inbox_dead ON relaybox_inbox (updated_at) WHERE status = 'dead';

-- A delivery that reuses an accepted event key with other content: kept apart for
-- investigation, the original untouched.
CREATE TABLE relaybox_quarantine (
    id          BIGSERIAL PRIMARY KEY,
    inbox_id    BIGINT NOT NULL REFERENCES relaybox_inbox (id),
    source      TEXT NOT NULL,
    account     TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    event_type  TEXT NOT NULL,
    tenant      TEXT,
    fingerprint BYTEA NOT NULL,
    payload     BYTEA,
    headers     TEXT,
    received_at DOUBLE PRECISION NOT NULL,
    resolved_at DOUBLE PRECISION,
    resolution  TEXT,
    CONSTRAINT relaybox_quarantine_once UNIQUE (inbox_id, fingerprint)
);

-- One row per finished processing attempt (the outcome and its error). A started
-- attempt is counted on the inbox row itself before the handler runs.
CREATE TABLE relaybox_inbox_attempts (
    id          BIGSERIAL PRIMARY KEY,
    inbox_id    BIGINT NOT NULL,
    attempt     INTEGER NOT NULL,
    outcome     TEXT NOT NULL,
    error       TEXT,
    worker      TEXT,
    started_at  DOUBLE PRECISION NOT NULL,
    finished_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX relaybox_inbox_attempts_inbox ON relaybox_inbox_attempts (inbox_id);

-- Business keys: "did this operation already happen?". Kept forever (no TTL).
CREATE TABLE relaybox_operations (
    business_key TEXT PRIMARY KEY,
    fingerprint  TEXT NOT NULL,
    inbox_id     BIGINT,
    source       TEXT,
    tenant       TEXT,
    created_at   DOUBLE PRECISION NOT NULL
);

-- Outgoing actions recorded in the same transaction as the change that causes them.
CREATE TABLE relaybox_outbox (
    id              BIGSERIAL PRIMARY KEY,
    channel         TEXT NOT NULL,
    key             TEXT NOT NULL,
    payload         TEXT NOT NULL,
    tenant          TEXT,
    inbox_id        BIGINT,
    status          TEXT NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'sent', 'dead', 'held')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at DOUBLE PRECISION NOT NULL,
    lease_owner     TEXT,
    lease_token     BIGINT,
    lease_until     DOUBLE PRECISION,
    last_error      TEXT,
    created_at      DOUBLE PRECISION NOT NULL,
    updated_at      DOUBLE PRECISION NOT NULL,
    sent_at         DOUBLE PRECISION,
    CONSTRAINT relaybox_outbox_key UNIQUE (channel, key)
);
CREATE INDEX relaybox_outbox_due ON relaybox_outbox (next_attempt_at) WHERE status = 'pending';
