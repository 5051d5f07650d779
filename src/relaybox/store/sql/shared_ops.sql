-- Operating relaybox: the statements both backends run as written (sql/<backend>_ops.sql
-- has the others).

-- name: ops_stats_inbox
-- One row per (source, status, reason, discarded), in three parts so each reads an
-- index: finished rows from the (status, source) index on PostgreSQL, from the
-- partial "finished" index (source, status; its WHERE is this part's, word for word)
-- on SQLite; pending rows from the partial "due" index (they are few: oldest,
-- retrying and attempts cost nothing), dead rows from the partial "dead" index.
-- Nothing here scans the payloads.
SELECT source, status, '' AS reason, false AS discarded, count(*) AS n,
       NULL AS oldest, 0 AS retrying, 0 AS attempts
FROM relaybox_inbox WHERE status IN ('done', 'ignored')
GROUP BY source, status
UNION ALL
SELECT source, 'pending', '', false, count(*), min(received_at),
       sum(CASE WHEN attempts > 0 THEN 1 ELSE 0 END), sum(attempts)
FROM relaybox_inbox WHERE status = 'pending'
GROUP BY source
UNION ALL
SELECT source, 'dead', coalesce(dead_reason, ''), discarded_at IS NOT NULL, count(*),
       NULL, 0, 0
FROM relaybox_inbox WHERE status = 'dead'
GROUP BY source, coalesce(dead_reason, ''), discarded_at IS NOT NULL

-- name: ops_stats_quarantine
SELECT source, count(*) AS n FROM relaybox_quarantine WHERE resolved_at IS NULL GROUP BY 1

-- name: ops_migrations_applied
SELECT version FROM relaybox_migrations ORDER BY version

-- name: ops_endpoint_backlog
-- Undelivered rows per endpoint (the partial index on status <> 'sent' serves it).
SELECT endpoint_id,
       sum(CASE WHEN status = 'pending' THEN 1 ELSE 0 END) AS pending,
       sum(CASE WHEN status = 'dead' THEN 1 ELSE 0 END) AS dead,
       sum(CASE WHEN status = 'held' THEN 1 ELSE 0 END) AS held,
       min(CASE WHEN status = 'pending' THEN created_at END) AS oldest
FROM relaybox_outbox
WHERE endpoint_id IS NOT NULL AND status <> 'sent'
GROUP BY endpoint_id

-- part: stats_outbox_columns
-- ops_stats_outbox's columns, in the shape of ops_stats_inbox's rows, over the outbox
-- rows (channel, status, dead_reason, created_at, attempts) its backend reads.
SELECT channel AS source, status, coalesce(dead_reason, '') AS reason, false AS discarded,
       count(*) AS n,
       min(CASE WHEN status = 'pending' THEN created_at END) AS oldest,
       sum(CASE WHEN status = 'pending' AND attempts > 0 THEN 1 ELSE 0 END) AS retrying,
       sum(CASE WHEN status = 'pending' THEN attempts ELSE 0 END) AS attempts

-- part: quarantine_entry_with_original
-- ops_quarantine_get: a quarantined delivery next to the original it collided with.
SELECT q.id, q.inbox_id, q.source, q.account, q.event_id, q.event_type, q.tenant,
       q.received_at, q.resolved_at, q.resolution, q.resolved_by, q.resolution_reason,
       q.payload, q.headers, q.purged_at,
       i.status AS original_status, i.event_type AS original_event_type,
       i.received_at AS original_received_at, i.payload AS original_payload,
       i.headers AS original_headers, i.purged_at AS original_purged_at
FROM relaybox_quarantine q LEFT JOIN relaybox_inbox i ON i.id = q.inbox_id

-- part: inbox_list_columns
-- An inbox row as ops_inbox_list and ops_dead_list show it.
SELECT id, source, account, event_id, event_type, tenant, status, dead_reason, attempts,
       received_at, updated_at, done_at, next_attempt_at, last_error,
       payload IS NULL AS purged, discarded_at
FROM relaybox_inbox
