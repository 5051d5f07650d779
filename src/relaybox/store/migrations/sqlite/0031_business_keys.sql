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

-- A tenant's keys window (the PostgreSQL migration 0031): the table made again, since
-- SQLite cannot change a CHECK constraint.
CREATE TABLE relaybox_retention_policies_0031 (
    tenant                 TEXT PRIMARY KEY,
    payload_max_age        REAL CHECK (payload_max_age > 0),
    outbox_payload_max_age REAL CHECK (outbox_payload_max_age > 0),
    updated_at             REAL NOT NULL,
    updated_by             TEXT NOT NULL,
    keys_max_age           REAL CHECK (keys_max_age >= 86400),
    CHECK (payload_max_age IS NOT NULL OR outbox_payload_max_age IS NOT NULL
           OR keys_max_age IS NOT NULL)
);
INSERT INTO relaybox_retention_policies_0031
    (tenant, payload_max_age, outbox_payload_max_age, updated_at, updated_by)
SELECT tenant, payload_max_age, outbox_payload_max_age, updated_at, updated_by
FROM relaybox_retention_policies;
DROP TABLE relaybox_retention_policies;
ALTER TABLE relaybox_retention_policies_0031 RENAME TO relaybox_retention_policies;
