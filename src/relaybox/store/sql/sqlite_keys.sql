-- Keys apart from the history (migration 0027, relaybox.store.keys): the backfill of
-- the keys of rows stored before them, and their expiry by age. (sqlite)

-- name: keys_backfill_finished
-- Whether the backfill of kind ?1 ('event', 'message', 'operation') has finished.
SELECT 1 AS done FROM relaybox_keys_backfill WHERE kind = ?1 AND finished_at IS NOT NULL

-- name: keys_backfill_state
SELECT kind, last_id, rows, finished_at FROM relaybox_keys_backfill WHERE kind = ?1

-- name: keys_backfill_save
-- One batch done: the last id read (?2), ?3 more rows, finished at ?4 (or NULL).
INSERT INTO relaybox_keys_backfill (kind, last_id, rows, finished_at)
VALUES (?1, ?2, ?3, ?4)
ON CONFLICT (kind) DO UPDATE SET last_id = excluded.last_id,
    rows = relaybox_keys_backfill.rows + excluded.rows, finished_at = excluded.finished_at

-- name: keys_backfill_events_page
-- Up to ?2 inbox rows after id ?1, in id order (the primary key).
SELECT id, source, account, event_id, fingerprint, received_at FROM relaybox_inbox
WHERE id > ?1 ORDER BY id LIMIT ?2

-- name: keys_backfill_outbox_page
-- Up to ?2 outbox rows after id ?1: nothing to copy on SQLite, whose outbox keeps its
-- UNIQUE (channel, key) (migration 0034 marks this backfill finished).
SELECT id FROM relaybox_outbox WHERE id > ?1 ORDER BY id LIMIT ?2

-- name: keys_backfill_messages_page
-- Up to ?2 messages after id ?1, in id order (the primary key).
SELECT id, tenant, idempotency_key, created_at FROM relaybox_messages
WHERE id > ?1 ORDER BY id LIMIT ?2

-- name: message_keys_insert_one
-- One idempotency key of a stored message: digest, scope, first day, the message id
-- as relaybox.store.keys.message_ref stores it (16 bytes or its text).
INSERT INTO relaybox_message_keys (digest, scope, first_seen, message_uuid, message_text)
VALUES (?, ?, ?, ?, ?)
ON CONFLICT DO NOTHING

-- name: keys_expire_event
-- One batch of expiry: up to ?2 event keys first seen before day ?1, oldest first.
DELETE FROM relaybox_event_keys WHERE digest IN (
    SELECT digest FROM relaybox_event_keys WHERE first_seen < ?1 ORDER BY first_seen LIMIT ?2)

-- name: keys_expire_event_scope
-- One batch of the expiry of scope ?3: up to ?2 of its keys first seen on
-- day ?1 (relaybox.store.keys_store goes day by day from the oldest: a batch
-- reads one day's keys through the index by day, not every older one).
DELETE FROM relaybox_event_keys WHERE digest IN (
    SELECT digest FROM relaybox_event_keys WHERE first_seen = ?1 AND scope = ?3 LIMIT ?2)

-- name: keys_expire_message
-- One batch of expiry: up to ?2 message keys first seen before day ?1, oldest first.
DELETE FROM relaybox_message_keys WHERE digest IN (
    SELECT digest FROM relaybox_message_keys WHERE first_seen < ?1 ORDER BY first_seen LIMIT ?2)

-- name: keys_expire_message_scope
-- One batch of the expiry of scope ?3: up to ?2 of its keys first seen on
-- day ?1 (relaybox.store.keys_store goes day by day from the oldest: a batch
-- reads one day's keys through the index by day, not every older one).
DELETE FROM relaybox_message_keys WHERE digest IN (
    SELECT digest FROM relaybox_message_keys WHERE first_seen = ?1 AND scope = ?3 LIMIT ?2)

-- name: keys_expire_operation
-- One batch of expiry: up to ?2 business keys first seen before day ?1, oldest first.
DELETE FROM relaybox_business_keys WHERE digest IN (
    SELECT digest FROM relaybox_business_keys WHERE first_seen < ?1 ORDER BY first_seen LIMIT ?2)

-- name: keys_expire_operation_scope
-- One batch of the expiry of scope ?3 (a source's): up to ?2 of its keys first seen on
-- day ?1 (relaybox.store.keys_store goes day by day from the oldest: a batch
-- reads one day's keys through the index by day, not every older one).
DELETE FROM relaybox_business_keys WHERE digest IN (
    SELECT digest FROM relaybox_business_keys WHERE first_seen = ?1 AND scope = ?3 LIMIT ?2)

-- name: keys_backfill_operations_page
-- Up to ?2 business keys after ?1, in key order (the primary key).
SELECT business_key, fingerprint, source, created_at FROM relaybox_operations
WHERE business_key > ?1 ORDER BY business_key LIMIT ?2

-- name: operations_purge
-- The readable business keys of the events whose payload the retention purge just
-- dropped (?1: their ids, a JSON array), in the same transaction, once every key stored before
-- migration 0031 is in relaybox_business_keys (which keeps deciding).
DELETE FROM relaybox_operations
WHERE inbox_id IN (SELECT value FROM json_each(?1))
  AND EXISTS (SELECT 1 FROM relaybox_keys_backfill
              WHERE kind = 'operation' AND finished_at IS NOT NULL)

-- name: operation_keys_insert_one
-- One business key of an operation stored before migration 0031: digest, fingerprint
-- digest, scope, first day.
INSERT INTO relaybox_business_keys (digest, fingerprint, scope, first_seen)
VALUES (?, ?, ?, ?)
ON CONFLICT DO NOTHING

-- name: keys_expire_event_keep
-- As keys_expire_event_scope, but the keys of every scope except ?3 (they keep
-- theirs longer).
DELETE FROM relaybox_event_keys WHERE digest IN (
    SELECT digest FROM relaybox_event_keys WHERE first_seen = ?1 AND scope NOT IN (SELECT value FROM json_each(?3))
    LIMIT ?2)

-- name: keys_expire_message_keep
-- As keys_expire_message_scope, but the keys of every scope except ?3 (they keep
-- theirs longer).
DELETE FROM relaybox_message_keys WHERE digest IN (
    SELECT digest FROM relaybox_message_keys WHERE first_seen = ?1 AND scope NOT IN (SELECT value FROM json_each(?3))
    LIMIT ?2)

-- name: keys_expire_operation_keep
-- As keys_expire_operation_scope, but the keys of every scope except ?3 (they keep
-- theirs longer).
DELETE FROM relaybox_business_keys WHERE digest IN (
    SELECT digest FROM relaybox_business_keys WHERE first_seen = ?1 AND scope NOT IN (SELECT value FROM json_each(?3))
    LIMIT ?2)


-- name: keys_oldest_event
-- The oldest day from day ?2 on of an event key first seen before day ?1 (one probe
-- of the index by day): the next day of a day-by-day expiry.
SELECT min(first_seen) AS day FROM relaybox_event_keys WHERE first_seen >= ?2 AND first_seen < ?1

-- name: keys_oldest_message
-- The oldest day from day ?2 on of a message key first seen before day ?1 (one probe
-- of the index by day): the next day of a day-by-day expiry.
SELECT min(first_seen) AS day FROM relaybox_message_keys WHERE first_seen >= ?2 AND first_seen < ?1

-- name: keys_oldest_operation
-- The oldest day from day ?2 on of a business key first seen before day ?1 (one probe
-- of the index by day): the next day of a day-by-day expiry.
SELECT min(first_seen) AS day FROM relaybox_business_keys WHERE first_seen >= ?2 AND first_seen < ?1
