-- Erasing one subject (relaybox.erasure, ErasureStore). Each erase_* statement empties
-- one batch of a subject's rows (by digest through relaybox_subjects) or a tenant's
-- (by the tenant column of relaybox_messages, relaybox_inbox and relaybox_quarantine)
-- and returns their ids: payload and
-- headers become NULL (JSON null where the column is NOT NULL), erased_at and
-- purged_at are set; error text (last_error, each attempt's error: an exception may
-- quote the payload) becomes '(erased)'; keys, fingerprints, statuses, dead-letter
-- reasons (codes), attempt counts and outcomes stay.
-- Pending rows are left to a later run (they are still needed); rows another
-- transaction holds right now (SKIP LOCKED) too. A batch is a MATERIALIZED CTE, run
-- once (see ops_purge_inbox).

-- The batch's rows emptied, each table as the header says: a statement choosing its
-- batch (a MATERIALIZED CTE `batch` of ids, $1 the digest or tenant, $3 its size)
-- includes its table's part ($2: now).

-- part: erase_inbox_batch
UPDATE relaybox_inbox t
SET payload = NULL, headers = NULL, erased_at = $2, purged_at = coalesce(t.purged_at, $2),
    last_error = CASE WHEN t.last_error IS NOT NULL THEN '(erased)' END
FROM batch
WHERE t.id = batch.id AND t.erased_at IS NULL AND t.status <> 'pending'
RETURNING t.id

-- part: erase_quarantine_batch
UPDATE relaybox_quarantine t
SET payload = NULL, headers = NULL, erased_at = $2, purged_at = coalesce(t.purged_at, $2)
FROM batch
WHERE t.id = batch.id AND t.erased_at IS NULL
RETURNING t.id

-- part: erase_outbox_set
-- What an erasure empties of an outbox row (erase_outbox_batch, and
-- erase_handler_outbox_ids): its payload and its error text.
UPDATE relaybox_outbox t
SET payload = 'null', erased_at = $2, purged_at = coalesce(t.purged_at, $2),
    last_error = CASE WHEN t.last_error IS NOT NULL THEN '(erased)' END

-- part: erase_outbox_batch
-- include: erase_outbox_set
FROM batch
WHERE t.id = batch.id AND t.erased_at IS NULL AND t.status <> 'pending'
RETURNING t.id

-- part: erase_messages_batch
UPDATE relaybox_messages t
SET body = 'null', erased_at = $2, purged_at = coalesce(t.purged_at, $2)
FROM batch
WHERE t.id = batch.id AND t.erased_at IS NULL
RETURNING t.id

-- part: outbox_row_holds
-- An outbox row o (not erased) still holds what an erasure empties: it is not purged,
-- or it keeps error text, or one of its attempts keeps a response, headers or error text.
AND (o.purged_at IS NULL OR o.last_error IS NOT NULL
     OR (SELECT 1 FROM relaybox_outbox_attempts a
         WHERE a.outbox_id = o.id
           AND (a.response IS NOT NULL OR a.headers IS NOT NULL
                OR (a.error IS NOT NULL AND a.error <> '(erased)'))
         LIMIT 1) IS NOT NULL)

-- name: erase_inbox_subject
WITH batch AS MATERIALIZED (
    SELECT i.id FROM relaybox_subjects s
    JOIN relaybox_inbox i ON i.id = s.ref::bigint
    WHERE s.digest = $1 AND s.kind = 'inbox' AND i.erased_at IS NULL
      AND i.status <> 'pending'
    LIMIT $3
    FOR NO KEY UPDATE OF i SKIP LOCKED)
-- include: erase_inbox_batch

-- name: erase_quarantine_subject
-- The quarantine entries stored under the event keys of the subject's inbox rows (a
-- conflicting content), whenever they came: also those that came after an earlier
-- erasure had emptied their inbox row, which a later erasure of the subject must
-- reach. By the quarantine's (inbox_id, fingerprint) index.
WITH batch AS MATERIALIZED (
    SELECT q.id FROM relaybox_subjects s
    JOIN relaybox_quarantine q ON q.inbox_id = s.ref::bigint
    WHERE s.digest = $1 AND s.kind = 'inbox' AND q.erased_at IS NULL
    LIMIT $3
    FOR NO KEY UPDATE OF q SKIP LOCKED)
-- include: erase_quarantine_batch

-- name: erase_outbox_subject
-- The deliveries of the subject's messages that are not pending (sent, dead, held).
WITH batch AS MATERIALIZED (
    SELECT o.id FROM relaybox_subjects s
    JOIN relaybox_outbox o ON o.message_id = s.ref
    WHERE s.digest = $1 AND s.kind = 'message' AND o.erased_at IS NULL
      AND o.status <> 'pending'
    LIMIT $3
    FOR NO KEY UPDATE OF o SKIP LOCKED)
-- include: erase_outbox_batch

-- name: erase_handler_outbox_subject
-- The rows handlers added to the outbox (ctx.outbox.add: an e-mail's address and text)
-- while handling the subject's inbox events, once they are not pending.
WITH batch AS MATERIALIZED (
    SELECT o.id FROM relaybox_subjects s
    JOIN relaybox_outbox o ON o.inbox_id = s.ref::bigint
    WHERE s.digest = $1 AND s.kind = 'inbox' AND o.erased_at IS NULL
      AND o.status <> 'pending'
    LIMIT $3
    FOR NO KEY UPDATE OF o SKIP LOCKED)
-- include: erase_outbox_batch

-- name: erase_outbox_tenant
-- The deliveries of each of the tenant's messages by the message index: as a join, a
-- tenant with many messages was planned as a scan of the whole outbox.
WITH batch AS MATERIALIZED (
    SELECT o.id FROM relaybox_messages m
    CROSS JOIN LATERAL (
        SELECT o.id FROM relaybox_outbox o
        WHERE o.message_id = m.id AND o.erased_at IS NULL AND o.status <> 'pending'
        FOR NO KEY UPDATE SKIP LOCKED) o
    WHERE m.tenant = $1 AND m.erased_at IS NULL
    LIMIT $3)
-- include: erase_outbox_batch

-- name: erase_attempts
-- What the receivers answered to the deliveries just erased ($1: their ids): response
-- excerpt and headers, and the attempt's error text (a channel's error may quote the
-- payload). Outcome, status code and timing stay.
UPDATE relaybox_outbox_attempts
SET response = NULL, headers = NULL,
    error = CASE WHEN error IS NOT NULL THEN '(erased)' END
WHERE outbox_id = ANY($1::bigint[])
  AND (response IS NOT NULL OR headers IS NOT NULL
       OR (error IS NOT NULL AND error <> '(erased)'))
RETURNING id

-- name: erase_inbox_attempts
-- The error text of the handler attempts of the inbox rows just erased ($1: their
-- ids): an exception's message may quote the payload. Outcome, worker and timing stay.
UPDATE relaybox_inbox_attempts SET error = '(erased)'
WHERE inbox_id = ANY($1::bigint[])
  AND error IS NOT NULL AND error <> '(erased)'
RETURNING id

-- name: erase_messages_subject
-- A message's body goes once none of its deliveries keeps its payload: the body is
-- what a retry signs.
WITH batch AS MATERIALIZED (
    SELECT m.id FROM relaybox_subjects s
    JOIN relaybox_messages m ON m.id = s.ref
    WHERE s.digest = $1 AND s.kind = 'message' AND m.erased_at IS NULL
      AND (SELECT 1 FROM relaybox_outbox o
           WHERE o.message_id = m.id AND o.erased_at IS NULL LIMIT 1) IS NULL
    LIMIT $3
    FOR UPDATE OF m SKIP LOCKED)
-- include: erase_messages_batch

-- name: erase_messages_tenant
WITH batch AS MATERIALIZED (
    SELECT m.id FROM relaybox_messages m
    WHERE m.tenant = $1 AND m.erased_at IS NULL
      AND (SELECT 1 FROM relaybox_outbox o
           WHERE o.message_id = m.id AND o.erased_at IS NULL LIMIT 1) IS NULL
    LIMIT $3
    FOR UPDATE SKIP LOCKED)
-- include: erase_messages_batch

-- name: erase_waiting_subject
-- The subject's rows not erased yet: pending ones, and any a batch skipped.
SELECT (SELECT count(*) FROM relaybox_subjects s
        JOIN relaybox_inbox i ON i.id = s.ref::bigint
        WHERE s.digest = $1 AND s.kind = 'inbox' AND i.erased_at IS NULL)
     + (SELECT count(*) FROM relaybox_subjects s
        JOIN relaybox_messages m ON m.id = s.ref
        WHERE s.digest = $1 AND s.kind = 'message' AND m.erased_at IS NULL)
     + (SELECT count(*) FROM relaybox_subjects s
        JOIN relaybox_outbox o ON o.inbox_id = s.ref::bigint
        WHERE s.digest = $1 AND s.kind = 'inbox' AND o.erased_at IS NULL)

-- name: erase_inbox_tenant
-- The events received for the tenant (their verified account mapped to it) that are
-- not pending, by the relaybox_inbox_tenant_unerased index, once no row their handler
-- added to the outbox is pending (erase_handler_outbox_ids empties those rows in the
-- same batch: an erased event no longer leads to them).
WITH batch AS MATERIALIZED (
    SELECT i.id FROM relaybox_inbox i
    WHERE i.tenant = $1 AND i.erased_at IS NULL AND i.status <> 'pending'
      AND NOT EXISTS (SELECT 1 FROM relaybox_outbox o
                      WHERE o.inbox_id = i.id AND o.status = 'pending')
    LIMIT $3
    FOR NO KEY UPDATE OF i SKIP LOCKED)
-- include: erase_inbox_batch

-- name: erase_quarantine_tenant
-- The tenant's quarantine entries, whenever they came (by relaybox_quarantine_tenant).
WITH batch AS MATERIALIZED (
    SELECT q.id FROM relaybox_quarantine q
    WHERE q.tenant = $1 AND q.erased_at IS NULL
    LIMIT $3
    FOR NO KEY UPDATE OF q SKIP LOCKED)
-- include: erase_quarantine_batch

-- name: erase_handler_outbox_ids
-- The rows handlers added to the outbox while handling the inbox rows just erased
-- ($1: their ids; none of them pending, erase_inbox_tenant waited for that).
-- One probe of relaybox_outbox_inbox an id: a LATERAL subquery that locks (SKIP
-- LOCKED, as every batch) is not flattened, so the id is a parameter that proves the
-- partial index's predicate; with `inbox_id = ANY($1)` or a plain join, a table never
-- analyzed was planned as a scan.
-- include: erase_outbox_set
FROM unnest($1::bigint[]) AS erased(id)
CROSS JOIN LATERAL (
    SELECT o.id FROM relaybox_outbox o
    WHERE o.inbox_id = erased.id AND o.erased_at IS NULL AND o.status <> 'pending'
    FOR NO KEY UPDATE SKIP LOCKED) b
WHERE t.id = b.id AND t.erased_at IS NULL AND t.status <> 'pending'
RETURNING t.id

-- name: erase_waiting_tenant
-- The tenant's rows not erased yet: its messages, the events received for it and
-- their quarantine entries (pending ones, and any a batch skipped).
SELECT (SELECT count(*) FROM relaybox_messages WHERE tenant = $1 AND erased_at IS NULL)
     + (SELECT count(*) FROM relaybox_inbox WHERE tenant = $1 AND erased_at IS NULL)
     + (SELECT count(*) FROM relaybox_quarantine WHERE tenant = $1 AND erased_at IS NULL)

-- name: erasure_find_open
-- The erasure of the same subject (or tenant) that is still waiting for rows: asking
-- again resumes it rather than recording another.
SELECT id FROM relaybox_erasures
WHERE finished_at IS NULL AND scope = $1
  AND digest IS NOT DISTINCT FROM $2 AND tenant IS NOT DISTINCT FROM $3
ORDER BY id LIMIT 1

-- name: erasure_insert
INSERT INTO relaybox_erasures (actor, reason, scope, digest, tenant, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $6)
RETURNING id

-- name: erasure_add
-- Rows one batch erased, added to the erasure's counts in the batch's transaction.
UPDATE relaybox_erasures
SET inbox = inbox + $2, quarantine = quarantine + $3, outbox = outbox + $4,
    attempts = attempts + $5, messages = messages + $6,
    inbox_attempts = inbox_attempts + $7, projections = projections + $8,
    updated_at = $9
WHERE id = $1

-- name: erasure_settle
-- After a run: how many of its rows still wait; finished once none does.
UPDATE relaybox_erasures
SET waiting = $2::bigint, updated_at = $3,
    finished_at = CASE WHEN $2::bigint = 0 THEN coalesce(finished_at, $3) END
WHERE id = $1

-- name: erasure_get
SELECT id, actor, reason, scope, digest, tenant, created_at, updated_at, finished_at,
       waiting, inbox, quarantine, outbox, attempts, messages, inbox_attempts,
       projections
FROM relaybox_erasures WHERE id = $1

-- name: erasure_list
SELECT id, actor, reason, scope, digest, tenant, created_at, updated_at, finished_at,
       waiting, inbox, quarantine, outbox, attempts, messages, inbox_attempts,
       projections
FROM relaybox_erasures ORDER BY id DESC LIMIT $1

-- name: erasure_open_ids
SELECT id FROM relaybox_erasures WHERE finished_at IS NULL ORDER BY id LIMIT $1

-- name: subject_inherit_inbox
-- An operational event's message ($1) about inbox row $2 (relaybox.inbox.dead, whose
-- error may quote the payload): indexed under every digest of that row.
INSERT INTO relaybox_subjects (digest, kind, ref)
SELECT DISTINCT digest, 'message', $1 FROM relaybox_subjects
WHERE ref::bigint = $2::bigint AND kind = 'inbox'
ON CONFLICT DO NOTHING

-- name: subject_inherit_outbox
-- An operational event's message ($1) about outbox row $2 (its last error): indexed
-- under every digest of the row's message, or of the inbox row whose handler added it
-- (two probes of the index of each kind's references, one each).
INSERT INTO relaybox_subjects (digest, kind, ref)
SELECT DISTINCT d.digest, 'message', $1 FROM (
    SELECT s.digest FROM relaybox_outbox o
    JOIN relaybox_subjects s ON s.ref = o.message_id AND s.kind = 'message'
    WHERE o.id = $2
    UNION ALL
    SELECT s.digest FROM relaybox_outbox o
    JOIN relaybox_subjects s ON s.ref::bigint = o.inbox_id AND s.kind = 'inbox'
    WHERE o.id = $2
) d
WHERE true  -- (SQLite: an upsert's SELECT needs a WHERE)
ON CONFLICT DO NOTHING

-- name: erase_projections_subject
-- The states of versioned projections (ctx.project) that an event of the subject wrote
-- (relaybox_projections.subject, set with the state): state NULL, erased_at set. The
-- resource key, origin and version stay: an older event is still refused.
WITH batch AS MATERIALIZED (
    SELECT p.resource_key FROM relaybox_projections p
    WHERE p.subject = $1 AND p.erased_at IS NULL
    LIMIT $3
    FOR NO KEY UPDATE SKIP LOCKED)
UPDATE relaybox_projections t
SET state = NULL, erased_at = $2
FROM batch
WHERE t.resource_key = batch.resource_key AND t.subject = $1 AND t.erased_at IS NULL
RETURNING t.resource_key

-- name: erase_projections_ids
-- The states of versioned projections written by the inbox rows just erased ($1: their
-- ids), by the projections' inbox_id index (a tenant's erasure: projections hold no
-- tenant).
-- One probe of relaybox_projections_inbox an id (a LATERAL that locks is not
-- flattened: see erase_handler_outbox_ids).
UPDATE relaybox_projections t
SET state = NULL, erased_at = $2
FROM unnest($1::bigint[]) AS erased(id)
CROSS JOIN LATERAL (
    SELECT p.resource_key FROM relaybox_projections p
    WHERE p.inbox_id = erased.id AND p.erased_at IS NULL
    FOR NO KEY UPDATE SKIP LOCKED) b
WHERE t.resource_key = b.resource_key AND t.erased_at IS NULL
RETURNING t.resource_key

-- name: subjects_forget_inbox
-- The subject index's rows of the inbox rows $1 (ids) deleted once nothing found
-- through them holds what an erasure empties: the row (gone, erased, or purged with no
-- error text left on it or its handler attempts), the quarantine entries under its key
-- (purged or erased), the rows its handler added to the outbox (purged with no error
-- text, response or headers left, or erased). A row that still holds some keeps its
-- index rows: the purge of what holds it (or an erasure, or its partition's drop)
-- asks again. Each test is a subquery with LIMIT 1 run per reference (a probe of the
-- table's index by the inbox id), never a join a generic plan could make a scan of.
DELETE FROM relaybox_subjects s
USING unnest($1::bigint[]) AS r(id)
WHERE s.kind = 'inbox' AND s.ref::bigint = r.id
  AND (SELECT 1 FROM relaybox_inbox i
       WHERE i.id = r.id AND i.erased_at IS NULL
         AND (i.purged_at IS NULL OR i.last_error IS NOT NULL
              OR (SELECT 1 FROM relaybox_inbox_attempts a
                  WHERE a.inbox_id = i.id AND a.error IS NOT NULL AND a.error <> '(erased)'
                  LIMIT 1) IS NOT NULL)
       LIMIT 1) IS NULL
  AND (SELECT 1 FROM relaybox_quarantine q
       WHERE q.inbox_id = r.id AND q.erased_at IS NULL AND q.purged_at IS NULL
       LIMIT 1) IS NULL
  AND (SELECT 1 FROM relaybox_outbox o
       WHERE o.inbox_id = r.id AND o.erased_at IS NULL
         -- include: outbox_row_holds
       LIMIT 1) IS NULL
RETURNING s.ref

-- name: subjects_forget_messages
-- The subject index's rows of the messages $1 (ids) deleted once nothing found through
-- them holds what an erasure empties: the message (gone, purged or erased) and its
-- deliveries (as in subjects_forget_inbox).
DELETE FROM relaybox_subjects s
USING unnest($1::text[]) AS r(id)
WHERE s.kind = 'message' AND s.ref = r.id
  AND (SELECT 1 FROM relaybox_messages m
       WHERE m.id = r.id AND m.erased_at IS NULL AND m.purged_at IS NULL
       LIMIT 1) IS NULL
  AND (SELECT 1 FROM relaybox_outbox o
       WHERE o.message_id = r.id AND o.erased_at IS NULL
         -- include: outbox_row_holds
       LIMIT 1) IS NULL
RETURNING s.ref

-- name: subjects_refs_quarantine
-- The inbox rows the quarantine entries $1 (ids) are stored under: one probe of the
-- primary key an id (a LATERAL with LIMIT is not flattened into a join).
SELECT DISTINCT q.inbox_id FROM unnest($1::bigint[]) AS r(id)
CROSS JOIN LATERAL (
    SELECT inbox_id FROM relaybox_quarantine WHERE id = r.id LIMIT 1) q

-- name: subjects_refs_outbox
-- The inbox row (a handler's row) or the message (a delivery) of the outbox rows $1.
SELECT o.inbox_id, o.message_id FROM unnest($1::bigint[]) AS r(id)
CROSS JOIN LATERAL (
    SELECT inbox_id, message_id FROM relaybox_outbox WHERE id = r.id LIMIT 1) o

-- name: subjects_inbox_refs_below
-- Up to $3 inbox references of the index after $1 and below $2 (the lowest id the
-- inbox still holds, once time partitions were dropped), in id order: what
-- subjects_forget_inbox is asked about after a drop. By relaybox_subjects_inbox.
SELECT s.ref::bigint FROM relaybox_subjects s
WHERE s.kind = 'inbox' AND s.ref::bigint > $1::bigint AND s.ref::bigint < $2::bigint
ORDER BY s.ref::bigint
LIMIT $3

-- name: subjects_inbox_low
-- The lowest id the inbox holds (NULL: none).
SELECT min(id) FROM relaybox_inbox

-- name: subjects_message_refs_below
-- Up to $3 message references of the index after $1 and below $2 (the lowest id the
-- messages still hold, once time partitions of the sending side were dropped; ids sort
-- by time), in id order: what subjects_forget_messages is asked about after a drop.
-- By relaybox_subjects_message.
SELECT s.ref FROM relaybox_subjects s
WHERE s.kind = 'message' AND s.ref > $1::text AND s.ref < $2::text
ORDER BY s.ref
LIMIT $3

-- name: subjects_messages_low
-- The lowest id the messages hold (NULL: none).
SELECT min(id) FROM relaybox_messages
