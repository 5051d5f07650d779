-- Business keys apart from the history (the PostgreSQL migration 0031 explains them):
-- the digest of the key, the digest of the operation's fingerprint as a signed
-- integer, the first day and the source's scope. Same layout as on PostgreSQL.
CREATE TABLE relaybox_business_keys (
    digest      BLOB PRIMARY KEY,
    fingerprint INTEGER NOT NULL,
    first_seen  INTEGER NOT NULL,
    scope       INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX relaybox_business_keys_age ON relaybox_business_keys (first_seen);
CREATE INDEX relaybox_business_keys_scope_age ON relaybox_business_keys (scope, first_seen);

DROP INDEX relaybox_operations_age;
DROP INDEX relaybox_operations_source_age;

INSERT INTO relaybox_keys_backfill (kind, finished_at)
SELECT 'operation', CAST(strftime('%s', 'now') AS REAL) WHERE NOT EXISTS (SELECT 1 FROM relaybox_operations);
