-- Keys apart from the history (migration 0027, relaybox.store.keys): the backfill of
-- the keys of rows stored before them, and their expiry by age. (postgres)

-- name: keys_backfill_finished
-- Whether the backfill of kind $1 ('event', 'message') has finished.
SELECT 1 AS done FROM relaybox_keys_backfill WHERE kind = $1 AND finished_at IS NOT NULL

-- name: keys_backfill_state
SELECT kind, last_id, rows, finished_at FROM relaybox_keys_backfill WHERE kind = $1

-- name: keys_backfill_save
-- One batch done: the last id read ($2), $3 more rows, finished at $4 (or NULL).
INSERT INTO relaybox_keys_backfill (kind, last_id, rows, finished_at)
VALUES ($1, $2, $3, $4)
ON CONFLICT (kind) DO UPDATE SET last_id = excluded.last_id,
    rows = relaybox_keys_backfill.rows + excluded.rows, finished_at = excluded.finished_at

-- name: keys_backfill_events_page
-- Up to $2 inbox rows after id $1, in id order (the primary key).
SELECT id, source, account, event_id, fingerprint, received_at FROM relaybox_inbox
WHERE id > $1 ORDER BY id LIMIT $2

-- name: keys_backfill_messages_page
-- Up to $2 messages after id $1, in id order (the primary key).
SELECT id, tenant, idempotency_key, created_at FROM relaybox_messages
WHERE id > $1 ORDER BY id LIMIT $2

-- name: message_keys_insert
-- Idempotency keys of stored messages (digest, scope, first day, message id); a key
-- that exists is left alone.
INSERT INTO relaybox_message_keys (digest, scope, first_seen, message_id)
SELECT * FROM unnest($1::bytea[], $2::bigint[], $3::integer[], $4::text[])
ON CONFLICT DO NOTHING

-- name: keys_expire_event
-- One batch of expiry: up to $2 event keys first seen before day $1, oldest first.
DELETE FROM relaybox_event_keys WHERE digest IN (
    SELECT digest FROM relaybox_event_keys WHERE first_seen < $1 ORDER BY first_seen LIMIT $2)

-- name: keys_expire_event_scope
-- As keys_expire_event, only the keys of scope $3.
DELETE FROM relaybox_event_keys WHERE digest IN (
    SELECT digest FROM relaybox_event_keys WHERE scope = $3 AND first_seen < $1
    ORDER BY first_seen LIMIT $2)

-- name: keys_expire_message
-- One batch of expiry: up to $2 message keys first seen before day $1, oldest first.
DELETE FROM relaybox_message_keys WHERE digest IN (
    SELECT digest FROM relaybox_message_keys WHERE first_seen < $1 ORDER BY first_seen LIMIT $2)

-- name: keys_expire_message_scope
-- As keys_expire_message, only the keys of scope $3.
DELETE FROM relaybox_message_keys WHERE digest IN (
    SELECT digest FROM relaybox_message_keys WHERE scope = $3 AND first_seen < $1
    ORDER BY first_seen LIMIT $2)

-- name: keys_expire_operation
-- One batch of expiry: up to $2 business keys first seen before day $1, oldest first
-- (by the day, as relaybox_operations_age indexes it).
DELETE FROM relaybox_operations WHERE business_key IN (
    SELECT business_key FROM relaybox_operations WHERE floor(created_at / 86400)::integer < $1
    ORDER BY floor(created_at / 86400)::integer LIMIT $2)

-- name: keys_expire_operation_scope
-- As keys_expire_operation, only the keys of source $3.
DELETE FROM relaybox_operations WHERE business_key IN (
    SELECT business_key FROM relaybox_operations WHERE source = $3 AND floor(created_at / 86400)::integer < $1
    ORDER BY floor(created_at / 86400)::integer LIMIT $2)
