-- Named queries for SQLite. Parameters are qmark (?). One writer at a time: the
-- claim needs no SKIP LOCKED, because BEGIN IMMEDIATE already excludes every other
-- writer until COMMIT. Parts ("-- part: NAME", included by "-- include: NAME") and
-- shared*.sql as postgres.sql says. Loaded once by relaybox.store.backend.load_queries.

-- name: inbox_insert
-- A batch's rows inside its single transaction, many rows a statement: the store
-- repeats the VALUES row (SQLiteStore.INSERT_ROWS at most). SQLite sets up a
-- statement's cursors and its AUTOINCREMENT counter once per statement, so one
-- statement per 32 rows took about half the CPU a row of one statement per row.
-- Only rows whose event key is not in relaybox_event_keys come here (the keys table
-- decides); a row the inbox's own UNIQUE event key refuses (stored before the keys
-- table had its key) is not inserted. RETURNING names the inserted rows by their key,
-- in no set order.
INSERT INTO relaybox_inbox
    (source, account, event_id, event_type, tenant, fingerprint, payload, headers,
     version, status, attempts, next_attempt_at, received_at, updated_at, traceparent)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?)
ON CONFLICT DO NOTHING
RETURNING id, source, account, event_id

-- name: event_keys_get
-- The stored keys among a batch's digests (the store repeats the placeholder).
SELECT digest, inbox_id, fingerprint FROM relaybox_event_keys WHERE digest IN (?)

-- name: event_keys_old_row
-- The inbox row stored under an event key before the keys table had it.
SELECT id, source, account, event_id, fingerprint, received_at FROM relaybox_inbox
WHERE source = ? AND account = ? AND event_id = ?

-- name: event_keys_insert_one
-- One event key: digest, fingerprint digest, first day, scope, inbox id.
INSERT INTO relaybox_event_keys (digest, fingerprint, first_seen, scope, inbox_id)
VALUES (?, ?, ?, ?, ?)
ON CONFLICT DO NOTHING

-- name: subject_index
-- One row indexed under a subject digest (relaybox_subjects), in the caller's
-- transaction.
INSERT INTO relaybox_subjects (digest, kind, ref) VALUES (?, ?, ?)
ON CONFLICT DO NOTHING

-- name: quarantine_insert
-- The newcomer is stored once per distinct content of its event key (one writer at a
-- time: the check and the insert see the same rows); the original row is not touched.
INSERT INTO relaybox_quarantine
    (inbox_id, source, account, event_id, event_type, tenant, fingerprint, payload,
     headers, received_at)
SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10
WHERE NOT EXISTS (
    SELECT 1 FROM relaybox_quarantine q
    WHERE q.source = ?2 AND q.event_id = ?4 AND q.account = ?3 AND q.fingerprint = ?7)
ON CONFLICT DO NOTHING

-- name: inbox_get
SELECT * FROM relaybox_inbox WHERE id = ?

-- name: inbox_get_by_key
SELECT * FROM relaybox_inbox WHERE source = ? AND account = ? AND event_id = ?



-- name: inbox_lock
-- BEGIN IMMEDIATE already holds the database's write lock until COMMIT.
SELECT id, source, account, event_id, event_type, tenant, payload, headers, version,
       attempts, received_at, traceparent
FROM relaybox_inbox
WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'pending'
ORDER BY id

-- name: inbox_complete
UPDATE relaybox_inbox SET status = 'done', done_at = ?2, updated_at = ?2, started_at = NULL
WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'pending'

-- name: inbox_retry_later
-- Only a row still pending is rescheduled: a completion is never overwritten.
UPDATE relaybox_inbox SET next_attempt_at = ?2, last_error = ?3, updated_at = ?4,
    started_at = NULL
WHERE id = ?1 AND status = 'pending'

-- name: inbox_kill
UPDATE relaybox_inbox SET status = 'dead', dead_reason = ?2, last_error = ?3, updated_at = ?4,
    started_at = NULL
WHERE id = ?1 AND status = 'pending'

-- name: attempt_insert
INSERT INTO relaybox_inbox_attempts
    (inbox_id, attempt, outcome, error, worker, started_at, finished_at)
VALUES (?, ?, ?, ?, ?, ?, ?)

-- name: operation_insert
-- A business key (?1 digest, ?2 fingerprint digest, ?3 scope, ?4 day): its digest's
-- PRIMARY KEY decides whether this operation already happened (a row: it is new, and
-- operation_record writes its readable row; PostgreSQL does both in one statement).
INSERT INTO relaybox_business_keys (digest, fingerprint, scope, first_seen)
VALUES (?1, ?2, ?3, ?4)
ON CONFLICT (digest) DO NOTHING
RETURNING 1

-- name: operation_record
-- A new business key's readable row (?1 key, ?2 fingerprint, ?3 inbox id, ?4 source,
-- ?5 tenant, ?6 now), over the row of an expired key, but not over one that the
-- backfill of keys stored before migration 0031 has not reached yet (no row: that
-- one decides, a repeat).
INSERT INTO relaybox_operations (business_key, fingerprint, inbox_id, source, tenant, created_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6)
-- include: operation_upsert

-- name: operation_get
-- A business key's fingerprint digest (?1 its digest) and, while its readable row is
-- kept, its fingerprint (?2 the key).
SELECT (SELECT fingerprint FROM relaybox_business_keys WHERE digest = ?1) AS code,
       (SELECT fingerprint FROM relaybox_operations WHERE business_key = ?2) AS fingerprint

-- name: operation_key_fix
-- A key of before migration 0031 that operation_key_insert wrote ahead of the
-- backfill: its fingerprint digest is its readable row's (?2).
UPDATE relaybox_business_keys SET fingerprint = ?2 WHERE digest = ?1

-- name: outbox_insert
-- One outgoing action per (channel, key), recorded with the change that causes it.
INSERT INTO relaybox_outbox
    (channel, key, payload, tenant, inbox_id, status, next_attempt_at, created_at, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6, ?6, ?6)
ON CONFLICT (channel, key) DO NOTHING
RETURNING id

-- name: stats_inbox
SELECT status, dead_reason, count(*) AS n, min(CASE WHEN status = 'pending' THEN received_at END) AS oldest
FROM relaybox_inbox GROUP BY status, dead_reason

-- name: stats_quarantine
SELECT count(*) AS n FROM relaybox_quarantine WHERE resolved_at IS NULL

-- name: inbox_claim
-- Holds up to ?2 due rows back ?3 seconds. Attempts are counted when an event starts
-- (inbox_start), not here (the worker runs a claim as one batch: no row starts
-- ahead). A row whose last attempt never recorded an outcome (started_at still set)
-- was running when its worker died: dead once its budget (?4) is used up, otherwise
-- returned as a suspect to run alone.
UPDATE relaybox_inbox SET
    status = CASE WHEN started_at IS NOT NULL AND attempts >= ?4 THEN 'dead' ELSE 'pending' END,
    dead_reason = CASE WHEN started_at IS NOT NULL AND attempts >= ?4 THEN 'exhausted' END,
    last_error = CASE WHEN started_at IS NOT NULL AND attempts >= ?4
        THEN 'attempt ' || attempts || ' did not finish: the worker process died'
        ELSE last_error END,
    next_attempt_at = CASE WHEN started_at IS NOT NULL AND attempts >= ?4 THEN next_attempt_at ELSE ?1 + ?3 END,
    updated_at = ?1
WHERE id IN (SELECT id FROM relaybox_inbox
             WHERE status = 'pending' AND next_attempt_at <= ?1
             ORDER BY next_attempt_at LIMIT ?2)
RETURNING id, status, source, account, event_id, attempts, started_at IS NOT NULL AS suspect,
          event_type, tenant, payload, headers, version, received_at, 0 AS starts, traceparent

-- name: inbox_start
-- An attempt starts: counted durably before the handler runs.
UPDATE relaybox_inbox SET attempts = attempts + 1, started_at = ?2
WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'pending'
RETURNING id, attempts

-- name: inbox_begin_done
-- The first statement of an event's own transaction: completes the row up front (a
-- failing handler rolls it back), only for the attempt this worker started (?3).
UPDATE relaybox_inbox SET status = 'done', done_at = ?2, updated_at = ?2, started_at = NULL
WHERE id = ?1 AND status = 'pending' AND attempts = ?3
RETURNING id

-- name: inbox_start_next
-- The next event's start mark, committed with the previous event (?3: attempts seen at
-- the claim; a row started since is left alone).
UPDATE relaybox_inbox SET attempts = attempts + 1, started_at = ?2
WHERE id = ?1 AND status = 'pending' AND attempts = ?3
