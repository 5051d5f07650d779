-- Business keys apart from the history, as narrow as the other keys (0027). One row a
-- business key (ctx.once(), a handler's declared key): its 16-byte BLAKE2b digest
-- (uuid: 16 bytes with no length header, in the heap and in the PRIMARY KEY's index;
-- the database decides which concurrent writer is first), the first 8 bytes of the
-- BLAKE2b digest of the operation's fingerprint as a signed bigint (what tells a
-- repeat from another operation reusing the key), the scope (the source of the event
-- whose handler recorded it, as relaybox.store.keys.scope_of) and the first day, for
-- expiry by age. Columns in alignment order: 8-byte, 4-byte, then the uuid.
CREATE TABLE relaybox_business_keys (
    scope       BIGINT NOT NULL,
    fingerprint BIGINT NOT NULL,
    first_seen  INTEGER NOT NULL,
    digest      UUID NOT NULL,
    CONSTRAINT relaybox_business_keys_pkey PRIMARY KEY (digest)
);
CREATE INDEX relaybox_business_keys_age ON relaybox_business_keys (first_seen);
CREATE INDEX relaybox_business_keys_scope_age ON relaybox_business_keys (scope, first_seen);

-- relaybox_operations keeps the readable row (the key, its fingerprint, the event, its
-- source and tenant) as history: the retention purge deletes it with its event's
-- payload once the backfill below has copied every key. Its PRIMARY KEY stays: until
-- then it still decides for the keys stored before this migration. Expiry by age is
-- the keys table's now.
DROP INDEX relaybox_operations_age;
DROP INDEX relaybox_operations_source_age;

-- The keys of operations recorded before this migration: copied by the resumable
-- backfill (Store.keys_backfill('operation'), in business key order); nothing to do
-- without any.
INSERT INTO relaybox_keys_backfill (kind, finished_at)
SELECT 'operation', extract(epoch FROM now()) WHERE NOT EXISTS (SELECT 1 FROM relaybox_operations);

-- A tenant's keys window set through the admin API (relaybox.retention.policy): how
-- long the idempotency keys of its messages are kept (NULL: the configuration's, else
-- for good). A policy may set only this.
ALTER TABLE relaybox_retention_policies ADD COLUMN keys_max_age DOUBLE PRECISION
    CHECK (keys_max_age >= 86400);
ALTER TABLE relaybox_retention_policies DROP CONSTRAINT relaybox_retention_policies_check;
ALTER TABLE relaybox_retention_policies ADD CONSTRAINT relaybox_retention_policies_check
    CHECK (payload_max_age IS NOT NULL OR outbox_payload_max_age IS NOT NULL
           OR keys_max_age IS NOT NULL);
