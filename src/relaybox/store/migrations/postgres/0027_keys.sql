-- Keys apart from the history. What decides a duplicate across time lives in narrow
-- tables of digests, written in the same transaction as the accept and the publish,
-- so that the history tables (inbox, attempts, outbox, messages, quarantine) can lose
-- whole rows (time partitions dropped by retention) without forgetting that an event
-- was seen or a message published. Each row: a 16-byte BLAKE2b digest of the key (its
-- PRIMARY KEY: the database decides which concurrent writer is first), the day it was
-- first seen (days since 1970-01-01, UTC) and a scope (the first 8 bytes of the
-- BLAKE2b digest of the source or the tenant, as a signed bigint) for expiry by age
-- (Store.keys_expire; kept forever by default), and what the live path answers with.
-- The old UNIQUE constraints stay for now: until the backfill (relaybox_keys_backfill)
-- has copied every existing row's key, they still catch a duplicate of an old event.

-- An event key (source, event_id, account) with the BLAKE2b-128 digest of the
-- delivery's content fingerprint (duplicate or conflict) and the inbox row it created
-- (which may be gone). Columns in alignment order: 8-byte, then 4-byte, then bytes.
CREATE TABLE relaybox_event_keys (
    inbox_id    BIGINT NOT NULL,
    scope       BIGINT NOT NULL,
    first_seen  INTEGER NOT NULL,
    digest      BYTEA NOT NULL,
    fingerprint BYTEA NOT NULL,
    CONSTRAINT relaybox_event_keys_pkey PRIMARY KEY (digest)
);
CREATE INDEX relaybox_event_keys_age ON relaybox_event_keys (first_seen);
CREATE INDEX relaybox_event_keys_scope_age ON relaybox_event_keys (scope, first_seen);

-- A message's idempotency key (tenant, idempotency_key) and the message it named.
CREATE TABLE relaybox_message_keys (
    scope      BIGINT NOT NULL,
    first_seen INTEGER NOT NULL,
    digest     BYTEA NOT NULL,
    message_id TEXT NOT NULL,
    CONSTRAINT relaybox_message_keys_pkey PRIMARY KEY (digest)
);
CREATE INDEX relaybox_message_keys_age ON relaybox_message_keys (first_seen);
CREATE INDEX relaybox_message_keys_scope_age ON relaybox_message_keys (scope, first_seen);

-- Business keys stay in relaybox_operations (one row per operation, not per event,
-- never partitioned): indexed here for their expiry by age, per source or not, by
-- the day as an integer (many keys a day: B-tree deduplication, which float keys
-- do not get, keeps each index ~7 bytes a key, where the exact time took ~23-32).
CREATE INDEX relaybox_operations_age
    ON relaybox_operations ((floor(created_at / 86400)::integer));
CREATE INDEX relaybox_operations_source_age
    ON relaybox_operations (source, (floor(created_at / 86400)::integer));

-- The backfill of the keys of rows stored before this migration, per kind ('event',
-- 'message'): resumable batches in id order (Store.keys_backfill), the last id done.
CREATE TABLE relaybox_keys_backfill (
    kind        TEXT PRIMARY KEY,
    last_id     TEXT,
    rows        BIGINT NOT NULL DEFAULT 0,
    finished_at DOUBLE PRECISION
);
-- A database without history has nothing to backfill.
INSERT INTO relaybox_keys_backfill (kind, finished_at)
SELECT 'event', extract(epoch FROM now()) WHERE NOT EXISTS (SELECT 1 FROM relaybox_inbox);
INSERT INTO relaybox_keys_backfill (kind, finished_at)
SELECT 'message', extract(epoch FROM now()) WHERE NOT EXISTS (SELECT 1 FROM relaybox_messages);

-- A conflicting delivery whose original inbox row is gone (its history dropped) is
-- still quarantined, under the original's inbox id that its event key remembers (an
-- erasure of the subject still reaches it through that id): the reference to the
-- inbox row can no longer be a foreign key. Quarantine rows are found by their event
-- key (one per distinct content).
ALTER TABLE relaybox_quarantine DROP CONSTRAINT relaybox_quarantine_inbox_id_fkey;
CREATE INDEX relaybox_quarantine_event ON relaybox_quarantine (source, event_id, account);
