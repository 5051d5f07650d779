-- The event key's columns in the order (source, event_id, account), as on PostgreSQL
-- (its migration 0007). Lookups by (source, event_id) (ordering, replay) use its
-- prefix, so the separate relaybox_inbox_source_event index goes: one index fewer to
-- write on every accepted row (bench/README.md, "Levers"). SQLite cannot change a
-- table's constraint in place: the table is rebuilt (its rows copied, in one
-- transaction with the rest of the migration), which holds the file's write lock
-- for as long as the copy takes, about a second per few hundred thousand rows.
-- With the rows and the id counter held in temporary tables meanwhile, the table is
-- dropped and made again under its name: the references to it from other tables
-- (relaybox_quarantine) find their rows again before the COMMIT checks them.
PRAGMA defer_foreign_keys = ON;
CREATE TEMP TABLE relaybox_inbox_copy AS SELECT * FROM relaybox_inbox;
CREATE TEMP TABLE relaybox_inbox_counter AS
    SELECT seq FROM sqlite_sequence WHERE name = 'relaybox_inbox';
DROP TABLE relaybox_inbox;
CREATE TABLE relaybox_inbox (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    source          TEXT NOT NULL,
    account         TEXT NOT NULL,
    event_id        TEXT NOT NULL,
    event_type      TEXT NOT NULL,
    tenant          TEXT,
    fingerprint     BLOB NOT NULL,
    payload         BLOB,
    headers         TEXT,
    version         TEXT,
    status          TEXT NOT NULL CHECK (status IN ('pending', 'done', 'dead', 'ignored')),
    dead_reason     TEXT,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    last_error      TEXT,
    received_at     REAL NOT NULL,
    updated_at      REAL NOT NULL,
    done_at         REAL,
    superseded_by   TEXT,
    recovered_via   TEXT,
    discarded_at    REAL,
    discarded_by    TEXT,
    discard_reason  TEXT,
    purged_at       REAL,
    started_at      REAL,
    CONSTRAINT relaybox_inbox_event_key UNIQUE (source, event_id, account)
);
INSERT INTO relaybox_inbox
    (id, source, account, event_id, event_type, tenant, fingerprint, payload, headers,
     version, status, dead_reason, attempts, next_attempt_at, last_error, received_at,
     updated_at, done_at, superseded_by, recovered_via, discarded_at, discarded_by,
     discard_reason, purged_at, started_at)
SELECT id, source, account, event_id, event_type, tenant, fingerprint, payload, headers,
       version, status, dead_reason, attempts, next_attempt_at, last_error, received_at,
       updated_at, done_at, superseded_by, recovered_via, discarded_at, discarded_by,
       discard_reason, purged_at, started_at
FROM temp.relaybox_inbox_copy ORDER BY id;
-- Ids are never used twice: the counter goes on from where it was, even where the
-- newest rows were deleted.
INSERT INTO sqlite_sequence (name, seq)
SELECT 'relaybox_inbox', 0
WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'relaybox_inbox');
UPDATE sqlite_sequence
SET seq = max(seq, coalesce((SELECT max(seq) FROM temp.relaybox_inbox_counter), 0))
WHERE name = 'relaybox_inbox';
DROP TABLE temp.relaybox_inbox_copy;
DROP TABLE temp.relaybox_inbox_counter;
-- Every index of the table, as the earlier migrations made them, less source_event.
CREATE INDEX relaybox_inbox_due ON relaybox_inbox (next_attempt_at) WHERE status = 'pending';
CREATE INDEX relaybox_inbox_received ON relaybox_inbox (received_at);
CREATE INDEX relaybox_inbox_dead ON relaybox_inbox (updated_at) WHERE status = 'dead';
CREATE INDEX relaybox_inbox_status_source ON relaybox_inbox (status, source);
CREATE INDEX relaybox_inbox_source_id ON relaybox_inbox (source, id);
CREATE INDEX relaybox_inbox_purgeable ON relaybox_inbox (updated_at)
    WHERE payload IS NOT NULL AND status <> 'pending';
