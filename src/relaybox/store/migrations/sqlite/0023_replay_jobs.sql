-- Replay-missing jobs. A replay-missing request (tenant API, admin API, dashboard,
-- CLI) only inserts a row here; a dispatcher claims it under a lease (lease_owner,
-- lease_until) and runs it in bounded batches, each batch's deliveries and the
-- job's progress (cursor, counters) in one transaction fenced by the lease, so a
-- killed process's job is taken over from its last batch, never run twice. until_at is
-- the request's time: messages published later get their deliveries at publish.
-- At most one queued or running job per endpoint (the partial UNIQUE index);
-- (tenant, created_at) counts a tenant's recent jobs for its rate limit;
-- (endpoint_id, created_at) finds an endpoint's newest job; the maintenance job drops
-- the jobs that ended retention.outbox_payload_max_age ago.
CREATE TABLE relaybox_replay_jobs (
    id           TEXT PRIMARY KEY,
    tenant       TEXT NOT NULL,
    endpoint_id  TEXT NOT NULL,
    since        REAL NOT NULL,
    until_at     REAL NOT NULL,
    max_queued   INTEGER NOT NULL,
    status       TEXT NOT NULL DEFAULT 'queued',
    scanned      INTEGER NOT NULL DEFAULT 0,
    queued       INTEGER NOT NULL DEFAULT 0,
    cursor_at    REAL,
    cursor_id    TEXT,
    resume_since REAL,
    lease_owner  TEXT,
    lease_until  REAL,
    error        TEXT,
    created_at   REAL NOT NULL,
    started_at   REAL,
    finished_at  REAL,
    updated_at   REAL NOT NULL
);
CREATE UNIQUE INDEX relaybox_replay_jobs_active
    ON relaybox_replay_jobs (endpoint_id) WHERE status IN ('queued', 'running');
CREATE INDEX relaybox_replay_jobs_waiting
    ON relaybox_replay_jobs (created_at) WHERE status IN ('queued', 'running');
CREATE INDEX relaybox_replay_jobs_tenant ON relaybox_replay_jobs (tenant, created_at);
CREATE INDEX relaybox_replay_jobs_endpoint ON relaybox_replay_jobs (endpoint_id, created_at);
CREATE INDEX relaybox_replay_jobs_finished
    ON relaybox_replay_jobs (finished_at) WHERE status IN ('done', 'failed');
