-- Named queries that tell a waiting loop when to look again (PostgreSQL). The same
-- names, with the same parameters in the same order, are in sqlite_wakeups.sql.

-- name: outbox_next_due
-- The earliest due time after $1 of a pending row of the channels $2: a dispatcher
-- sets its wake-up by it instead of waiting for its poll. One probe of the partial
-- index relaybox_outbox_due (next_attempt_at, pending rows only).
SELECT min(next_attempt_at) FROM relaybox_outbox
WHERE status = 'pending' AND next_attempt_at > $1 AND channel = ANY($2::text[])
