-- Named queries that tell a waiting loop when to look again (SQLite; see
-- postgres_wakeups.sql).

-- name: outbox_next_due
SELECT min(next_attempt_at) FROM relaybox_outbox
WHERE status = 'pending' AND next_attempt_at > ?1 AND channel IN (SELECT value FROM json_each(?2))
