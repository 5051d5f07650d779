-- Operating relaybox: the admin API, the dashboard, `relaybox stats`, /metrics and
-- retention. Read-mostly; every write is guarded by the state it expects, so two
-- operators acting at once cannot both discard, resolve or purge the same row.

-- part: inbox_list_page
-- The filters ops_inbox_list and ops_dead_list share (each has its own $3: status,
-- or dead reason), newest first, keyset-paginated on id ($7: the last id of the
-- previous page): a deep page costs what the first one does, and new arrivals never
-- shift a page.
AND ($1::text IS NULL OR source = $1)
AND ($2::text IS NULL OR event_type = $2)
AND ($4::text IS NULL OR tenant = $4)
AND ($5::double precision IS NULL OR received_at >= $5)
AND ($6::double precision IS NULL OR received_at < $6)
AND ($7::bigint IS NULL OR id < $7)
ORDER BY id DESC
LIMIT $8

-- name: ops_inbox_list
-- Inbox events of any status ($3: one only).
-- include: inbox_list_columns
WHERE ($3::text IS NULL OR status = $3)
  -- include: inbox_list_page

-- name: ops_dead_list
-- Dead letters still waiting for an operator (discarded ones have left the queue).
-- include: inbox_list_columns
WHERE status = 'dead' AND discarded_at IS NULL AND ($3::text IS NULL OR dead_reason = $3)
  -- include: inbox_list_page

-- name: ops_dead_discard
-- Only an undiscarded dead letter is discarded; the row, its error and attempts stay.
UPDATE relaybox_inbox
SET discarded_at = $2, discarded_by = $3, discard_reason = $4, updated_at = $2
WHERE id = $1 AND status = 'dead' AND discarded_at IS NULL
RETURNING id

-- name: ops_inbox_attempts
SELECT attempt, outcome, error, worker, started_at, finished_at
FROM relaybox_inbox_attempts WHERE inbox_id = $1 ORDER BY attempt, id

-- name: ops_inbox_operations
-- Business keys recorded while processing this event (kept forever).
SELECT business_key, fingerprint, created_at
FROM relaybox_operations WHERE inbox_id = $1 ORDER BY created_at, business_key

-- name: ops_inbox_outbox
SELECT o.id, o.channel, o.key, o.status, COALESCE(l.attempt, o.attempts) AS attempts,
       o.last_error, o.created_at, o.sent_at
FROM relaybox_outbox o LEFT JOIN relaybox_outbox_leases l ON l.outbox_id = o.id
WHERE o.inbox_id = $1 ORDER BY o.id

-- name: ops_inbox_replays
SELECT actor, reason, previous_status, previous_reason, replayed_at
FROM relaybox_replays WHERE inbox_id = $1 ORDER BY id

-- name: ops_inbox_quarantine
SELECT id, received_at, resolved_at, resolution
FROM relaybox_quarantine WHERE inbox_id = $1 ORDER BY id

-- name: ops_quarantine_list
-- The original's columns are NULL when its row is gone (its history dropped): its
-- inbox_id is then the id it had.
-- $2: NULL any, true resolved only, false open only.
SELECT q.id, q.inbox_id, q.source, q.account, q.event_id, q.event_type, q.tenant,
       q.received_at, q.resolved_at, q.resolution, q.resolved_by, q.resolution_reason,
       i.status AS original_status
FROM relaybox_quarantine q LEFT JOIN relaybox_inbox i ON i.id = q.inbox_id
WHERE ($1::text IS NULL OR q.source = $1)
  AND ($2::boolean IS NULL OR (q.resolved_at IS NOT NULL) = $2)
  AND ($3::bigint IS NULL OR q.id < $3)
ORDER BY q.id DESC
LIMIT $4

-- name: ops_quarantine_get
-- A quarantined delivery next to the original it collided with.
-- include: quarantine_entry_with_original
WHERE q.id = $1

-- name: ops_quarantine_resolve
-- Records the operator's decision once; the original inbox row is not touched.
UPDATE relaybox_quarantine
SET resolved_at = $2, resolution = $3, resolved_by = $4, resolution_reason = $5
WHERE id = $1 AND resolved_at IS NULL
RETURNING id

-- name: ops_stats_outbox
-- The outbox queue by channel (its "source"), same shape as the inbox rows.
-- include: stats_outbox_columns
FROM (SELECT o.channel, o.status, o.dead_reason, o.created_at,
             COALESCE(l.attempt, o.attempts) AS attempts
      FROM relaybox_outbox o LEFT JOIN relaybox_outbox_leases l ON l.outbox_id = o.id) o
GROUP BY 1, 2, 3

-- name: ops_throughput
-- Deliveries accepted per minute since $1, by their status now (the overview chart).
SELECT floor(received_at / 60)::bigint AS minute, status, count(*) AS n
FROM relaybox_inbox
WHERE received_at >= $1
GROUP BY 1, 2

-- name: ops_purge_count
-- What ops_purge_inbox would drop for cutoff $1: finished rows (done, ignored, dead
-- and discarded) whose payload is still there, unless an open quarantine entry needs
-- the original for comparison. Pending and undiscarded dead rows are never candidates.
SELECT count(*) FROM relaybox_inbox i
WHERE i.payload IS NOT NULL AND i.status <> 'pending' AND i.updated_at < $1
  -- include: inbox_purgeable

-- name: ops_purge_inbox
-- One batch: drop payload and headers, keep key, fingerprint, status and outcome.
-- SKIP LOCKED: a row a replay holds right now is purged by the next run instead.
-- The batch is a MATERIALIZED CTE, run once: as `id IN (SELECT … LIMIT)` the planner
-- may run the locking subquery again for each outer row (a nested-loop semi-join),
-- and with SKIP LOCKED each run can pick other rows: more than the limit purged.
WITH batch AS MATERIALIZED (
    SELECT i.id FROM relaybox_inbox i
    WHERE i.payload IS NOT NULL AND i.status <> 'pending' AND i.updated_at < $1
      -- include: inbox_purgeable
    ORDER BY i.updated_at LIMIT $3
    FOR NO KEY UPDATE SKIP LOCKED)
-- include: purge_inbox_batch

-- name: ops_purge_quarantine_count
SELECT count(*) FROM relaybox_quarantine
WHERE payload IS NOT NULL AND resolved_at IS NOT NULL AND resolved_at < $1

-- name: ops_purge_quarantine
-- Resolved quarantine entries lose their payload like finished events do.
-- One batch, a MATERIALIZED CTE as in ops_purge_inbox.
WITH batch AS MATERIALIZED (
    SELECT id FROM relaybox_quarantine
    WHERE payload IS NOT NULL AND resolved_at IS NOT NULL AND resolved_at < $1
    ORDER BY resolved_at LIMIT $3
    FOR UPDATE SKIP LOCKED)
UPDATE relaybox_quarantine t SET payload = NULL, headers = NULL, purged_at = $2
FROM batch
WHERE t.id = batch.id
RETURNING t.id

-- name: ops_purge_outbox_count
-- What ops_purge_outbox would drop for cutoff $1: deliveries that finished (sent, or
-- dead) before the cutoff and still have their payload. Pending rows (leased or not)
-- and held rows (waiting for a person) are never candidates.
SELECT count(*) FROM relaybox_outbox
WHERE purged_at IS NULL AND status IN ('sent', 'dead') AND updated_at < $1

-- name: ops_purge_outbox
-- One batch: the payload becomes JSON null (webhook rows carry that already: their
-- body is the message's) and purged_at is set; key, status, attempts and errors stay.
-- SKIP LOCKED: a row a dispatcher or a redelivery holds right now is left to the next
-- run, and the outer conditions re-read the row once it is locked.
-- The batch a MATERIALIZED CTE, as in ops_purge_inbox.
WITH batch AS MATERIALIZED (
    SELECT id FROM relaybox_outbox
    WHERE purged_at IS NULL AND status IN ('sent', 'dead') AND updated_at < $1
    ORDER BY updated_at LIMIT $3
    FOR NO KEY UPDATE SKIP LOCKED)
-- include: purge_outbox_batch

-- name: ops_purge_outbox_responses
-- The first bytes of the receivers' answers to the deliveries ops_purge_outbox just
-- purged ($1: their ids), in the same transaction. Outcome, status code, error and
-- timing stay.
UPDATE relaybox_outbox_attempts SET response = NULL, headers = NULL
WHERE outbox_id = ANY($1::bigint[]) AND (response IS NOT NULL OR headers IS NOT NULL)

-- name: ops_purge_messages_count
-- Messages a purge at cutoff $1 empties: published before the cutoff, body still
-- there, and no delivery that keeps its payload after the outbox purge (one that has
-- not finished, is held, or finished after the cutoff).
SELECT count(*) FROM relaybox_messages m
WHERE m.purged_at IS NULL AND m.created_at < $1
  AND NOT EXISTS (SELECT 1 FROM relaybox_outbox o
                  WHERE o.message_id = m.id AND o.purged_at IS NULL
                    AND NOT (o.status IN ('sent', 'dead') AND o.updated_at < $1))

-- name: ops_purge_messages
-- One batch: the body becomes JSON null once every delivery of the message is purged
-- (or it had none). The body is what a retry signs, so it stays while any delivery
-- may still be sent. Deliveries are only written with their message, so none can
-- appear after this check.
-- The check is a subquery per message (an index probe of relaybox_outbox_message),
-- not NOT EXISTS: PostgreSQL turns that into an anti-join, which it may plan as a
-- hash of every unpurged delivery, a scan of the whole outbox for each batch (a
-- purge of 5,000 messages ran past the statement timeout that way).
-- The batch a MATERIALIZED CTE, as in ops_purge_inbox.
WITH batch AS MATERIALIZED (
    SELECT m.id FROM relaybox_messages m
    WHERE m.purged_at IS NULL AND m.created_at < $1
      -- include: message_deliveries_purged
    ORDER BY m.created_at LIMIT $3
    FOR UPDATE SKIP LOCKED)
-- include: purge_messages_batch

-- name: ops_message_purged_at
-- When retention emptied a message's body (NULL: it is there).
SELECT purged_at FROM relaybox_messages WHERE id = $1

-- name: ops_maintenance_try_lock
-- One maintenance runner across every process: a session-level advisory lock, freed
-- by ops_maintenance_unlock or by the connection's end if the process dies.
SELECT pg_try_advisory_lock(hashtext('relaybox_maintenance'))

-- name: ops_maintenance_unlock
SELECT pg_advisory_unlock(hashtext('relaybox_maintenance'))

-- name: ops_db_now
-- The database server's clock (doctor compares it with this machine's).
SELECT extract(epoch FROM clock_timestamp())::double precision

-- name: health_open_transactions
-- The open transactions of this database's other sessions, oldest first, and whether
-- each holds a lock on one of relaybox's tables (a table read or written in it).
SELECT a.pid, a.state, a.application_name,
       extract(epoch FROM clock_timestamp() - a.xact_start)::double precision AS age,
       EXISTS (
           SELECT 1 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
           WHERE l.pid = a.pid AND left(c.relname, 9) = 'relaybox_'
       ) AS relaybox
FROM pg_stat_activity a
WHERE a.datname = current_database() AND a.xact_start IS NOT NULL
  AND a.pid <> pg_backend_pid()
ORDER BY a.xact_start

-- name: health_table_rows
-- Live and dead row estimates of relaybox's tables (the statistics collector's).
SELECT relname AS "table", n_live_tup AS live, n_dead_tup AS dead,
       extract(epoch FROM greatest(last_vacuum, last_autovacuum))::double precision
           AS vacuumed_at
FROM pg_stat_user_tables
WHERE schemaname = current_schema() AND left(relname, 9) = 'relaybox_'
ORDER BY relname

-- name: ops_table_exists
SELECT to_regclass($1) IS NOT NULL

-- name: ops_endpoint_health
-- Delivery attempts per endpoint since $1: how many, how many were accepted (outcome
-- sent), the last one. The overview's success rate and the endpoints page read it.
SELECT o.endpoint_id, count(*) AS attempts,
       sum(CASE WHEN a.outcome = 'sent' THEN 1 ELSE 0 END) AS succeeded,
       max(a.started_at) AS last_attempt_at
FROM relaybox_outbox_attempts a JOIN relaybox_outbox o ON o.id = a.outbox_id
WHERE a.started_at >= $1 AND o.endpoint_id IS NOT NULL
GROUP BY o.endpoint_id

-- name: ops_endpoint_attempts
-- An endpoint's most recent attempts, newest first.
SELECT a.outbox_id, o.message_id, a.attempt, a.started_at, a.duration, a.outcome,
       a.status_code, a.error
FROM relaybox_outbox_attempts a JOIN relaybox_outbox o ON o.id = a.outbox_id
WHERE o.endpoint_id = $1
ORDER BY a.id DESC
LIMIT $2
