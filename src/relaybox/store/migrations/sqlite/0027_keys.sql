-- Keys apart from the history (the PostgreSQL migration 0027 explains them): narrow
-- tables of 16-byte digests, written in the same transaction as the accept and the
-- publish, that decide a duplicate across time. Same layout as on PostgreSQL.
CREATE TABLE relaybox_event_keys (
    digest      BLOB PRIMARY KEY,
    fingerprint BLOB NOT NULL,
    first_seen  INTEGER NOT NULL,
    scope       INTEGER NOT NULL,
    inbox_id    INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX relaybox_event_keys_age ON relaybox_event_keys (first_seen);
CREATE INDEX relaybox_event_keys_scope_age ON relaybox_event_keys (scope, first_seen);

CREATE TABLE relaybox_message_keys (
    digest     BLOB PRIMARY KEY,
    first_seen INTEGER NOT NULL,
    scope      INTEGER NOT NULL,
    message_id TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX relaybox_message_keys_age ON relaybox_message_keys (first_seen);
CREATE INDEX relaybox_message_keys_scope_age ON relaybox_message_keys (scope, first_seen);

CREATE INDEX relaybox_operations_age ON relaybox_operations (CAST(created_at / 86400 AS INTEGER));
CREATE INDEX relaybox_operations_source_age
    ON relaybox_operations (source, CAST(created_at / 86400 AS INTEGER));

CREATE TABLE relaybox_keys_backfill (
    kind        TEXT PRIMARY KEY,
    last_id     TEXT,
    rows        INTEGER NOT NULL DEFAULT 0,
    finished_at REAL
);
INSERT INTO relaybox_keys_backfill (kind, finished_at)
SELECT 'event', CAST(strftime('%s', 'now') AS REAL) WHERE NOT EXISTS (SELECT 1 FROM relaybox_inbox);
INSERT INTO relaybox_keys_backfill (kind, finished_at)
SELECT 'message', CAST(strftime('%s', 'now') AS REAL) WHERE NOT EXISTS (SELECT 1 FROM relaybox_messages);

CREATE INDEX relaybox_quarantine_event ON relaybox_quarantine (source, event_id, account);
