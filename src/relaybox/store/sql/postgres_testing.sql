-- relaybox.testing (PostgreSQL; same names, parameters and columns as sqlite_testing.sql):
-- read-only views of a test's box for its assertions (operator-style reads, not on a
-- hot path: they may scan). Each returns every matching row in insertion order, so a
-- test sees exactly what was stored, duplicates included.

-- name: testing_inbox_list
-- Inbox rows, optionally of one source ($1) and one event id ($2).
SELECT id, source, account, event_id, event_type, tenant, status, dead_reason, attempts,
       last_error, payload, headers, received_at, done_at, next_attempt_at
FROM relaybox_inbox
WHERE ($1::text IS NULL OR source = $1) AND ($2::text IS NULL OR event_id = $2)
ORDER BY id

-- name: testing_operations_list
-- Business keys recorded by handlers (ctx.once), optionally those starting with $1.
SELECT business_key, fingerprint, inbox_id, source, tenant, created_at
FROM relaybox_operations
WHERE ($1::text IS NULL OR starts_with(business_key, $1))
ORDER BY created_at, business_key

-- name: testing_outbox_list
-- Outbox rows (outgoing actions and webhook deliveries), optionally of one channel ($1).
SELECT id, channel, key, payload, tenant, inbox_id, status, dead_reason, attempts,
       last_error, last_status, endpoint_id, message_id, created_at, sent_at
FROM relaybox_outbox
WHERE ($1::text IS NULL OR channel = $1)
ORDER BY id
