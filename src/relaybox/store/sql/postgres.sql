-- Named queries for PostgreSQL. Each block starts with "-- name: NAME" and a line on
-- what it guarantees. Parameters are asyncpg's $n. A "-- part: NAME" block is SQL that
-- several statements share: a line "-- include: NAME" stands for it. What SQLite runs
-- as written too is in shared*.sql. Loaded once by relaybox.store.backend.load_queries.

-- part: inbox_batch_keys
-- A batch's event keys inserted, in a WITH after u (the batch, its deliveries numbered
-- n; raw the key digest, kfp the fingerprint digest as a bigint): d one delivery per key (the
-- first), f with its inbox id, k the keys inserted (the event keys table decides who
-- is first: a key that exists inserts nothing).
d AS MATERIALIZED (
    SELECT DISTINCT ON (u.raw) u.*, encode(u.raw, 'hex')::uuid AS digest FROM u
    ORDER BY u.raw, u.n
), f AS MATERIALIZED (
    -- ids in batch order (nextval runs after the sort): as the batch came, by key
    SELECT d.*, relaybox_inbox_id() AS id FROM d ORDER BY d.n
), k AS (
    INSERT INTO relaybox_event_keys (inbox_id, fingerprint, scope, first_seen, digest)
    SELECT f.id, f.kfp, f.scope, floor(f.received_at / 86400)::integer, f.digest
    FROM f
    ON CONFLICT DO NOTHING
    RETURNING digest
)

-- name: inbox_insert_batch
-- One statement for a batch inside the caller's transaction (inbox_insert): the event
-- keys table decides who is first, as in inbox_accept_fast ($12: now, $13: trace
-- contexts, $14: key digests, $15: fingerprint digests, $16: scopes). Returns the new
-- rows (id, source, account, event_id); the others are looked up by event_keys_get.
WITH u AS MATERIALIZED (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
                         $6::bytea[], $7::bytea[], $8::text[], $9::text[], $10::text[],
                         $11::double precision[], $13::text[], $14::bytea[], $15::bigint[],
                         $16::integer[]) WITH ORDINALITY
         AS u(source, account, event_id, event_type, tenant, fingerprint, payload, headers,
              version, status, received_at, traceparent, raw, kfp, scope, n)
),
-- include: inbox_batch_keys
, ins AS (
    INSERT INTO relaybox_inbox
        (id, source, account, event_id, event_type, tenant, fingerprint, payload, headers,
         version, status, attempts, next_attempt_at, received_at, updated_at, traceparent)
    SELECT f.id, f.source, f.account, f.event_id, f.event_type, f.tenant, f.fingerprint,
           f.payload, f.headers, f.version, f.status, 0, $12, f.received_at, $12,
           f.traceparent
    FROM f JOIN k USING (digest)
)
SELECT f.id, f.source, f.account, f.event_id FROM f JOIN k USING (digest)

-- name: event_keys_get
-- The stored keys among digests $1 (bytea, as given): one probe of the primary key per
-- digest; the fingerprint digests (bigint).
SELECT d.digest, e.inbox_id, e.fingerprint
FROM unnest($1::bytea[]) AS d(digest)
CROSS JOIN LATERAL (
    SELECT x.inbox_id, x.fingerprint FROM relaybox_event_keys x
    WHERE x.digest = encode(d.digest, 'hex')::uuid
    LIMIT 1
) e

-- name: event_keys_old_rows
-- Inbox rows stored under event keys $1-$3 (source, account, event_id) before the
-- keys table existed, whose key the backfill may not have copied yet: the store
-- copies them before an accept while Store.keys_backfill has not finished, or when
-- the inbox's old UNIQUE event key (kept until then) refused a row.
SELECT i.id, i.source, i.account, i.event_id, i.fingerprint, i.received_at
FROM unnest($1::text[], $2::text[], $3::text[]) AS k(source, account, event_id)
CROSS JOIN LATERAL (
    SELECT r.id, r.source, r.account, r.event_id, r.fingerprint, r.received_at
    FROM relaybox_inbox r
    WHERE r.source = k.source AND r.account = k.account AND r.event_id = k.event_id
    LIMIT 1
) i

-- name: event_keys_insert
-- Keys of stored inbox rows (the backfill, and the copy of old rows' keys before an
-- accept): (inbox id, scope, first day, digest, fingerprint digest); a key that exists
-- is left alone. Returns how many were new.
WITH k AS (
    INSERT INTO relaybox_event_keys (inbox_id, fingerprint, scope, first_seen, digest)
    SELECT i, fp, s, day, encode(d, 'hex')::uuid
    FROM unnest($1::bigint[], $2::integer[], $3::integer[], $4::bytea[], $5::bigint[])
         AS k(i, s, day, d, fp)
    ON CONFLICT DO NOTHING
    RETURNING 1
)
SELECT count(*) AS n FROM k

-- name: subject_index
-- One row indexed under a subject digest (relaybox_subjects), in the caller's
-- transaction.
INSERT INTO relaybox_subjects (digest, kind, ref) VALUES ($1, $2, $3)
ON CONFLICT DO NOTHING

-- name: quarantine_lock
-- Taken before quarantine_insert, until the transaction ends: two conflicting
-- deliveries of one event key quarantined at once are stored one after the other.
SELECT pg_advisory_xact_lock(7204, hashtext($1 || chr(10) || $2 || chr(10) || $3))

-- name: quarantine_insert
-- The newcomer is stored once per distinct content of its event key (quarantine_lock
-- held); the original row is not touched. Its inbox_id is the original row's, as the
-- event key remembers it, also when that row is gone (its history dropped).
INSERT INTO relaybox_quarantine
    (inbox_id, source, account, event_id, event_type, tenant, fingerprint, payload,
     headers, received_at)
SELECT $1::bigint, $2, $3, $4, $5, $6, $7, $8, $9, $10
WHERE NOT EXISTS (
    SELECT 1 FROM relaybox_quarantine q
    WHERE q.source = $2 AND q.event_id = $4 AND q.account = $3 AND q.fingerprint = $7)
ON CONFLICT DO NOTHING

-- name: notify_inbox
-- One notification per committed batch, not per row (NOTIFY serialises commits).
SELECT pg_notify('relaybox_inbox', '')

-- name: notify_outbox
SELECT pg_notify('relaybox_outbox', '')

-- name: notify_replay
SELECT pg_notify('relaybox_replay', '')

-- name: notify_channels
-- Store.wake: rows committed already, channels by name ('inbox', 'outbox'). Its own
-- short transaction, on the synchronous_commit=off pool.
SELECT pg_notify('relaybox_' || c, '') FROM unnest($1::text[]) AS c

-- name: inbox_get
SELECT * FROM relaybox_inbox WHERE id = $1

-- name: inbox_get_by_key
SELECT * FROM relaybox_inbox WHERE source = $1 AND account = $2 AND event_id = $3



-- name: inbox_lock
-- Locks claimed rows until COMMIT; the handler's effect and the completion commit
-- together. A row completed meanwhile by a late worker is no longer pending.
SELECT id, source, account, event_id, event_type, tenant, payload, headers, version,
       attempts, received_at, traceparent
FROM relaybox_inbox
-- "Not done, dead or ignored" is pending (the status CHECK) but matches no partial index:
-- the ids decide the path even in a generic plan made on a filled inbox before any
-- ANALYZE (which walked every pending row; tests/test_plans.py). Likewise below.
WHERE id = ANY($1::bigint[]) AND status NOT IN ('done', 'dead', 'ignored')
  AND id BETWEEN (SELECT min(x) FROM unnest($1::bigint[]) x)
             AND (SELECT max(x) FROM unnest($1::bigint[]) x)
ORDER BY id
FOR NO KEY UPDATE SKIP LOCKED

-- name: inbox_complete
UPDATE relaybox_inbox SET status = 'done', done_at = $2, updated_at = $2, started_at = NULL
WHERE id = ANY($1::bigint[]) AND status NOT IN ('done', 'dead', 'ignored')
  AND id BETWEEN (SELECT min(x) FROM unnest($1::bigint[]) x)
             AND (SELECT max(x) FROM unnest($1::bigint[]) x)

-- name: inbox_retry_later
-- Only a row still pending is rescheduled: a completion is never overwritten.
UPDATE relaybox_inbox SET next_attempt_at = $2, last_error = $3, updated_at = $4,
    started_at = NULL
WHERE id = $1 AND status = 'pending'

-- name: inbox_kill
UPDATE relaybox_inbox SET status = 'dead', dead_reason = $2, last_error = $3, updated_at = $4,
    started_at = NULL
WHERE id = $1 AND status = 'pending'

-- name: attempt_insert
INSERT INTO relaybox_inbox_attempts
    (inbox_id, attempt, outcome, error, worker, started_at, finished_at)
VALUES ($1, $2, $3, $4, $5, $6, $7)

-- name: operation_insert
-- A business key: its digest's PRIMARY KEY in relaybox_business_keys decides whether
-- this operation already happened ($1 digest, $2 fingerprint digest, $3 scope, $4
-- day); only a new key writes its readable row ($5 key, $6 fingerprint, $7 inbox id,
-- $8 source, $9 tenant, $10 now), over the row of an expired key, but not over one
-- that the backfill of keys stored before migration 0031 has not reached yet: then
-- keyed is 1 and created 0 (the old row decides: a repeat).
WITH k AS (
  INSERT INTO relaybox_business_keys (digest, fingerprint, scope, first_seen)
  VALUES (encode($1::bytea, 'hex')::uuid, $2, $3, $4)
  ON CONFLICT (digest) DO NOTHING
  RETURNING 1
), o AS (
  INSERT INTO relaybox_operations (business_key, fingerprint, inbox_id, source, tenant, created_at)
  SELECT $5, $6, $7, $8, $9, $10 FROM k
  -- include: operation_upsert
)
SELECT (SELECT count(*) FROM k) AS keyed, (SELECT count(*) FROM o) AS created

-- name: operation_record
-- operation_insert's second half alone ($1 key, $2 fingerprint, $3 inbox id, $4
-- source, $5 tenant, $6 now), as SQLite runs it after its key insert.
INSERT INTO relaybox_operations (business_key, fingerprint, inbox_id, source, tenant, created_at)
VALUES ($1, $2, $3, $4, $5, $6)
-- include: operation_upsert

-- name: operation_get
-- A business key's fingerprint digest ($1 its digest) and, while its readable row
-- is kept, its fingerprint ($2 the key).
SELECT (SELECT fingerprint FROM relaybox_business_keys
        WHERE digest = encode($1::bytea, 'hex')::uuid) AS code,
       (SELECT fingerprint FROM relaybox_operations WHERE business_key = $2) AS fingerprint

-- name: operation_key_fix
-- A key of before migration 0031 that operation_insert wrote ahead of the backfill:
-- its fingerprint digest is its readable row's ($2).
UPDATE relaybox_business_keys SET fingerprint = $2 WHERE digest = encode($1::bytea, 'hex')::uuid

-- name: outbox_insert
-- One outgoing action per (channel, key), recorded with the change that causes it:
-- its key (relaybox_outbox_keys, migration 0034) first, the row only when the key is
-- new (the key's primary key decides between two writers, and stays when the row's
-- partition is dropped). The dispatchers are woken after COMMIT by whoever commits
-- (Store.wake), not by a NOTIFY in this transaction (notifying COMMITs are serialised).
WITH k AS (
    INSERT INTO relaybox_outbox_keys (digest, first_seen)
    VALUES (relaybox_outbox_digest($1::text, $2::text),
            floor($6::double precision / 86400)::integer)
    ON CONFLICT DO NOTHING
    RETURNING digest
)
INSERT INTO relaybox_outbox
    (channel, key, payload, tenant, inbox_id, status, next_attempt_at, created_at,
     updated_at)
SELECT $1::text, $2::text, $3::text, $4::text, $5::bigint, 'pending', $6::double precision,
       $6::double precision, $6::double precision
FROM k
ON CONFLICT DO NOTHING
RETURNING id

-- name: outbox_insert_rows
-- A group's outbox rows, sent with its COMMIT (simple query protocol): the texts come
-- as hex, decoded here. One row per (channel, key), the first one kept (its key decides,
-- as in outbox_insert).
WITH r AS (
    SELECT DISTINCT ON (digest) *
    FROM (SELECT r.*, relaybox_outbox_digest(r.channel, r.key) AS digest
          FROM (SELECT convert_from(decode(r.channel, 'hex'), 'UTF8') AS channel,
                       convert_from(decode(r.key, 'hex'), 'UTF8') AS key,
                       convert_from(decode(r.payload, 'hex'), 'UTF8') AS payload,
                       convert_from(decode(r.tenant, 'hex'), 'UTF8') AS tenant, r.inbox_id, r.ord
                FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[])
                     WITH ORDINALITY AS r(channel, key, payload, tenant, inbox_id, ord)) r) r
    ORDER BY digest, ord
), k AS (
    INSERT INTO relaybox_outbox_keys (digest, first_seen)
    SELECT digest, floor($6::double precision / 86400)::integer FROM r
    ON CONFLICT DO NOTHING
    RETURNING digest
)
INSERT INTO relaybox_outbox
    (channel, key, payload, tenant, inbox_id, status, next_attempt_at, created_at,
     updated_at)
SELECT r.channel, r.key, r.payload, r.tenant, r.inbox_id, 'pending', $6, $6, $6
FROM r JOIN k ON k.digest = r.digest ORDER BY r.ord
ON CONFLICT DO NOTHING

-- name: stats_inbox
SELECT status, dead_reason, count(*) AS n, min(CASE WHEN status = 'pending' THEN received_at END) AS oldest
FROM relaybox_inbox GROUP BY status, dead_reason

-- name: stats_quarantine
SELECT count(*) AS n FROM relaybox_quarantine WHERE resolved_at IS NULL

-- part: inbox_accept_rows
-- inbox_accept_fast's CTEs after u: the keys inserted, then ins, the inbox rows of
-- those (a held one started at $13: see inbox_accept_fast).
-- include: inbox_batch_keys
, ins AS (
    INSERT INTO relaybox_inbox
        (id, source, account, event_id, event_type, tenant, fingerprint, payload, headers,
         version, status, attempts, next_attempt_at, started_at, received_at, updated_at,
         traceparent)
    SELECT f.id, f.source, f.account, f.event_id, f.event_type, f.tenant, f.fingerprint,
           f.payload, f.headers, f.version, f.status,
           CASE WHEN f.held_until IS NULL THEN 0 ELSE 1 END, coalesce(f.held_until, $13),
           CASE WHEN f.held_until IS NOT NULL THEN $13 END, f.received_at, $13, f.traceparent
    FROM f JOIN k USING (digest)
)

-- part: inbox_accept_answer
-- inbox_accept_fast's rows: the new keys' (inserted), then those found.
SELECT f.id, f.source, f.account, f.event_id, f.kfp AS fingerprint, true AS inserted
FROM f JOIN k USING (digest)
UNION ALL
-- One probe of the key's primary key per key, whatever the statistics say: LIMIT
-- keeps the lookup a per-key subquery (a plain join was planned as a sequential scan
-- + hash join while the table looked empty, and the cached generic plan kept scanning
-- every row; tests/store/test_plans.py checks the plan on an empty table).
SELECT e.inbox_id, f.source, f.account, f.event_id, e.fingerprint, false
FROM f
CROSS JOIN LATERAL (
    SELECT x.inbox_id, x.fingerprint FROM relaybox_event_keys x
    WHERE x.digest = f.digest
    LIMIT 1
) e

-- name: inbox_accept_fast
-- The group-commit fast path: one autocommit statement decides, inserts and commits
-- the whole batch (one round trip, one fsync, synchronous_commit unchanged). The event
-- keys table decides who is first: each key's first delivery in the batch (f, in
-- batch order, which the store sorts by key: two batches insert shared keys in one
-- order) gets its inbox id from the sequence, its key inserted with ON CONFLICT DO NOTHING, and only the keys
-- inserted get their inbox row. Rows come back with inserted = true for the new keys
-- (their inbox id and fingerprint digest) and inserted = false for the keys that
-- existed before the statement began (duplicates and conflicts, compared with the
-- stored fingerprint digest, whether or not their inbox row still exists). The outer
-- SELECT does not see the rows k inserts (one snapshot per statement). A key in
-- neither set was committed by a concurrent inserter after that snapshot (ON
-- CONFLICT waited for it): event_keys_get resolves it. The inbox insert has no ON
-- CONFLICT: while the old UNIQUE event key of the inbox still exists, an old row whose
-- key the backfill has not copied yet fails the statement (unique_violation), and
-- the store copies those keys (event_keys_adopt) and runs it again.
-- The workers are woken after this COMMIT (Store.wake), not by a NOTIFY in it.
-- A row with a hold ($12, NewDelivery.held_until) goes to this process's worker from
-- here: it goes in with its first attempt counted and started at $13, held back from
-- every claimer until then, as a claim that started it would leave it.
-- $15: key digests, $16: fingerprint digests (bigint), $17: scopes (integer; relaybox.store.keys);
-- the key digests come as bytea and are stored as uuid (migration 0035): f.digest is the key's.
WITH u AS MATERIALIZED (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
                         $6::bytea[], $7::bytea[], $8::text[], $9::text[], $10::text[],
                         $11::double precision[], $12::double precision[], $14::text[],
                         $15::bytea[], $16::bigint[], $17::integer[]) WITH ORDINALITY
         AS u(source, account, event_id, event_type, tenant, fingerprint, payload, headers,
              version, status, received_at, held_until, traceparent, raw, kfp, scope, n)
),
-- include: inbox_accept_rows
-- include: inbox_accept_answer

-- name: inbox_accept_fast_subjects
-- inbox_accept_fast for a batch with subjects ($18: each delivery's subject digest or
-- NULL, NewDelivery.subject): the new rows are indexed under them in the same
-- statement, so in the same commit (an erasure finds every row that was acknowledged).
-- Batches without one run inbox_accept_fast: the accept pays nothing when no source
-- declares a subject path.
WITH u AS MATERIALIZED (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
                         $6::bytea[], $7::bytea[], $8::text[], $9::text[], $10::text[],
                         $11::double precision[], $12::double precision[], $14::text[],
                         $15::bytea[], $16::bigint[], $17::integer[], $18::bytea[])
                  WITH ORDINALITY
         AS u(source, account, event_id, event_type, tenant, fingerprint, payload, headers,
              version, status, received_at, held_until, traceparent, raw, kfp, scope,
              subject, n)
),
-- include: inbox_accept_rows
, idx AS (
    INSERT INTO relaybox_subjects (digest, kind, ref)
    SELECT DISTINCT f.subject, 'inbox', f.id::text
    FROM f JOIN k USING (digest)
    WHERE f.subject IS NOT NULL
    ON CONFLICT DO NOTHING
)
-- include: inbox_accept_answer

-- name: inbox_claim
-- Holds up to $2 due rows back for $3 seconds: nobody else claims them while this
-- worker starts them. Attempts are counted when an event starts (inbox_start), not
-- here, so rows waiting their turn are not charged if the process dies; except the
-- first $5 rows (by due time), which the worker starts at once (chains free for them):
-- their attempts are counted here, the claim serving as their start mark (one round
-- trip fewer between the claim and the handler). Rows come back with what the handler
-- needs: the worker does not read them again. A row whose last attempt started but
-- never recorded an outcome (started_at still set) was being processed when its
-- worker died: with its budget ($4) used up it goes to dead letters; otherwise it
-- comes back flagged as a suspect and runs alone (never counted here).
-- One statement over one range of the partial index on due pending rows, planned once
-- per connection (PostgresBackend.start_pool forces the generic plan): with time
-- partitions a plan made for each claim cost more than the claim's work, and grew with
-- the partitions (bench/README.md, "The fixed cost of a partitioned statement"). The
-- rows claimed are then found by their ids (= ANY of the CTE's ids: a probe of each
-- partition's primary key, even in that generic plan; a join on id alone was planned
-- as a scan of the whole inbox and a hash join).
WITH due AS MATERIALIZED (
    SELECT d.id, d.suspect,
           NOT d.suspect AND row_number() OVER (PARTITION BY d.suspect ORDER BY d.next_attempt_at, d.id) <= $5 AS starts
    FROM (SELECT id, next_attempt_at, started_at IS NOT NULL AS suspect FROM relaybox_inbox
          WHERE status = 'pending' AND next_attempt_at <= $1
          ORDER BY next_attempt_at LIMIT $2
          FOR NO KEY UPDATE SKIP LOCKED) d
)
UPDATE relaybox_inbox i SET
    status = CASE WHEN due.suspect AND i.attempts >= $4 THEN 'dead' ELSE 'pending' END,
    dead_reason = CASE WHEN due.suspect AND i.attempts >= $4 THEN 'exhausted' END,
    last_error = CASE WHEN due.suspect AND i.attempts >= $4
        THEN 'attempt ' || i.attempts || ' did not finish: the worker process died'
        ELSE i.last_error END,
    next_attempt_at = CASE WHEN due.suspect AND i.attempts >= $4 THEN i.next_attempt_at ELSE $1 + $3 END,
    attempts = CASE WHEN due.starts THEN i.attempts + 1 ELSE i.attempts END,
    started_at = CASE WHEN due.starts THEN $1 ELSE i.started_at END,
    updated_at = $1
FROM due
WHERE i.id = ANY (ARRAY(SELECT id FROM due)) AND i.id = due.id
RETURNING i.id, i.status, i.source, i.account, i.event_id, i.attempts,
          due.suspect, i.event_type, i.tenant, i.payload, i.headers,
          i.version, i.received_at, due.starts, i.traceparent

-- name: inbox_keep_hold
-- A live worker keeps the hold on the rows of its claim not finished yet ($1), which
-- still carry a hold it wrote ($2: the claim's, then each renewal's): until $3. Without
-- it a row waiting for its turn, or started and waiting for a lock, came back when the
-- hold ran out, as if its worker had died, and could be dead-lettered "exhausted"
-- while that worker was still running it. Rows locked by the worker's own transaction
-- in progress are skipped (no claimer can take them either); rows rescheduled,
-- completed or claimed by another worker no longer match $2.
UPDATE relaybox_inbox i SET next_attempt_at = $3
FROM (SELECT id FROM relaybox_inbox
      WHERE id = ANY($1::bigint[]) AND status NOT IN ('done', 'dead', 'ignored')
        AND id BETWEEN (SELECT min(x) FROM unnest($1::bigint[]) x)
                   AND (SELECT max(x) FROM unnest($1::bigint[]) x)
        AND next_attempt_at = ANY($2::double precision[])
      FOR NO KEY UPDATE SKIP LOCKED) k
WHERE i.id = k.id

-- name: inbox_start
-- An attempt starts: counted durably before the handler runs (a worker killed in the
-- handler has used it). Sent on a connection with synchronous_commit off: losing the
-- mark in a crash of the database server costs at most one extra attempt.
UPDATE relaybox_inbox SET attempts = attempts + 1, started_at = $2
WHERE id = ANY($1::bigint[]) AND status NOT IN ('done', 'dead', 'ignored')
  AND id BETWEEN (SELECT min(x) FROM unnest($1::bigint[]) x)
             AND (SELECT max(x) FROM unnest($1::bigint[]) x)
RETURNING id, attempts

-- name: inbox_begin_done
-- The first statement of an event's transaction, sent in one round trip with its BEGIN
-- (literals, simple query protocol): completes the row up front, taking its row lock;
-- a failing handler rolls it back with its effect. Only the attempt this worker started
-- ($3) matches: a row completed meanwhile, or started again by another worker after
-- its hold ran out, is left alone (the UPDATE waits for that worker's COMMIT, then
-- finds the row no longer matching).
UPDATE relaybox_inbox SET status = 'done', done_at = $2, updated_at = $2, started_at = NULL
WHERE id = $1 AND status = 'pending' AND attempts = $3

-- name: inbox_lock_group
-- The first statement of a group's transaction, sent with its BEGIN (literals): the
-- rows locked while still pending at the attempt this worker started ($2[i] for row
-- $1[i]), and in the same statement the group's declared business keys claimed (as
-- operation_insert does: $3 digests as hex texts, $4 fingerprint digests, $5 scopes,
-- $6 days; $7 keys, $8 fingerprints, $10 sources, $11 tenants as hex texts; $9 the
-- events' inbox ids; $12 now; empty arrays when none). Its row count is the rows
-- locked plus the keys inserted: both are complete only when it is len($1) + len($3)
-- (a key that exists, or that two events name, inserts nothing; the caller then runs
-- the group again without claims). The completions of the events that succeed go with the COMMIT
-- (inbox_complete).
WITH locked AS (
  SELECT i.id FROM relaybox_inbox i
  JOIN unnest($1::bigint[], $2::bigint[]) AS g(id, attempts) ON i.id = g.id
  WHERE i.id = ANY($1::bigint[]) AND i.status NOT IN ('done', 'dead', 'ignored')
    AND i.id BETWEEN (SELECT min(x) FROM unnest($1::bigint[]) x)
                 AND (SELECT max(x) FROM unnest($1::bigint[]) x)
    AND i.attempts = g.attempts
  FOR NO KEY UPDATE OF i
), keyed AS (
  INSERT INTO relaybox_business_keys (digest, fingerprint, scope, first_seen)
  SELECT k.digest::uuid, k.code, k.scope, k.day
  FROM unnest($3::text[], $4::bigint[], $5::integer[], $6::integer[])
       AS k(digest, code, scope, day)
  ON CONFLICT (digest) DO NOTHING
  RETURNING digest
), claimed AS (
  INSERT INTO relaybox_operations
      (business_key, fingerprint, inbox_id, source, tenant, created_at)
  SELECT DISTINCT ON (keyed.digest)
         convert_from(decode(k.key, 'hex'), 'UTF8'), convert_from(decode(k.fp, 'hex'), 'UTF8'),
         k.inbox_id, convert_from(decode(k.source, 'hex'), 'UTF8'),
         convert_from(decode(k.tenant, 'hex'), 'UTF8'), $12
  FROM unnest($3::text[], $7::text[], $8::text[], $9::bigint[], $10::text[], $11::text[])
       AS k(digest, key, fp, inbox_id, source, tenant)
  JOIN keyed ON keyed.digest = k.digest::uuid
  -- include: operation_upsert
)
SELECT 1 FROM locked UNION ALL SELECT 1 FROM claimed

-- name: operations_release
-- Declared business keys the group's BEGIN claimed (inbox_lock_group) and no
-- handler asked for ($1 their digests as hex texts, $2 the keys as hex texts):
-- released with the COMMIT, the key and its readable row. convert_from's result
-- takes the "C" collation of its encoding name: the key's index needs the column's.
WITH keys AS (
  DELETE FROM relaybox_business_keys
  WHERE digest = ANY(ARRAY(SELECT d::uuid FROM unnest($1::text[]) d))
)
DELETE FROM relaybox_operations
WHERE business_key = ANY(ARRAY(
    SELECT convert_from(decode(k, 'hex'), 'UTF8') COLLATE "default" FROM unnest($2::text[]) k))

-- name: inbox_start_next_group
-- inbox_start_next for the next group: $1[i] a row, $2[i] its attempts as claimed.
UPDATE relaybox_inbox i SET attempts = i.attempts + 1, started_at = $3
FROM unnest($1::bigint[], $2::bigint[]) AS g(id, attempts)
WHERE i.id = ANY($1::bigint[]) AND i.status NOT IN ('done', 'dead', 'ignored')
  AND i.id BETWEEN (SELECT min(x) FROM unnest($1::bigint[]) x)
               AND (SELECT max(x) FROM unnest($1::bigint[]) x)
  AND i.id = g.id AND i.attempts = g.attempts

-- name: inbox_start_next
-- The next event's start mark, sent with the previous event's COMMIT on the same
-- connection (one round trip for both): counted as that event starts, durable before
-- its handler runs. $3 is the attempts seen at the claim: if anything started the row
-- since, this mark does nothing and inbox_begin_done finds no match.
UPDATE relaybox_inbox SET attempts = attempts + 1, started_at = $2
WHERE id = $1 AND status = 'pending' AND attempts = $3
