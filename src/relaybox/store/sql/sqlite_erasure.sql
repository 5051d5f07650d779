-- Erasing one subject (relaybox.erasure, ErasureStore). Each erase_* statement empties
-- one batch of a subject's rows (by digest through relaybox_subjects) or a tenant's
-- (by the tenant column of relaybox_messages, relaybox_inbox and relaybox_quarantine)
-- and returns their ids: payload and
-- headers become NULL (JSON null where the column is NOT NULL), erased_at and
-- purged_at are set; error text (last_error, each attempt's error: an exception may
-- quote the payload) becomes '(erased)'; keys, fingerprints, statuses, dead-letter
-- reasons (codes), attempt counts and outcomes stay.
-- Pending rows are left to a later run (they are still needed). No SKIP LOCKED:
-- BEGIN IMMEDIATE makes each batch the only writer until its COMMIT.

-- The batch's rows emptied, each table as the header says: a statement choosing its
-- batch (a CTE `batch` of ids, ?1 the digest or tenant, ?3 its size) includes its
-- table's part (?2: now).

-- part: erase_inbox_batch
UPDATE relaybox_inbox
SET payload = NULL, headers = NULL, erased_at = ?2, purged_at = coalesce(purged_at, ?2),
    last_error = CASE WHEN last_error IS NOT NULL THEN '(erased)' END
WHERE id IN (SELECT id FROM batch) AND erased_at IS NULL AND status <> 'pending'
RETURNING id

-- part: erase_quarantine_batch
UPDATE relaybox_quarantine
SET payload = NULL, headers = NULL, erased_at = ?2, purged_at = coalesce(purged_at, ?2)
WHERE id IN (SELECT id FROM batch) AND erased_at IS NULL
RETURNING id

-- part: erase_outbox_set
-- What an erasure empties of an outbox row (erase_outbox_batch, and
-- erase_handler_outbox_ids): its payload and its error text.
UPDATE relaybox_outbox
SET payload = 'null', erased_at = ?2, purged_at = coalesce(purged_at, ?2),
    last_error = CASE WHEN last_error IS NOT NULL THEN '(erased)' END

-- part: erase_outbox_batch
-- include: erase_outbox_set
WHERE id IN (SELECT id FROM batch) AND erased_at IS NULL AND status <> 'pending'
RETURNING id

-- part: erase_messages_batch
UPDATE relaybox_messages
SET body = 'null', erased_at = ?2, purged_at = coalesce(purged_at, ?2)
WHERE id IN (SELECT id FROM batch) AND erased_at IS NULL
RETURNING id

-- part: outbox_row_holds
-- An outbox row o (not erased) still holds what an erasure empties: it is not purged,
-- or it keeps error text, or one of its attempts keeps a response, headers or error text.
AND (o.purged_at IS NULL OR o.last_error IS NOT NULL
     OR EXISTS (SELECT 1 FROM relaybox_outbox_attempts a
                WHERE a.outbox_id = o.id
                  AND (a.response IS NOT NULL OR a.headers IS NOT NULL
                       OR (a.error IS NOT NULL AND a.error <> '(erased)'))))

-- name: erase_inbox_subject
WITH batch AS (
    SELECT i.id FROM relaybox_subjects s
    JOIN relaybox_inbox i ON i.id = CAST(s.ref AS INTEGER)
    WHERE s.digest = ?1 AND s.kind = 'inbox' AND i.erased_at IS NULL
      AND i.status <> 'pending'
    LIMIT ?3)
-- include: erase_inbox_batch

-- name: erase_quarantine_subject
-- The quarantine entries stored under the event keys of the subject's inbox rows (a
-- conflicting content), whenever they came: also those that came after an earlier
-- erasure had emptied their inbox row, which a later erasure of the subject must
-- reach.
WITH batch AS (
    SELECT q.id FROM relaybox_subjects s
    JOIN relaybox_quarantine q ON q.inbox_id = CAST(s.ref AS INTEGER)
    WHERE s.digest = ?1 AND s.kind = 'inbox' AND q.erased_at IS NULL
    LIMIT ?3)
-- include: erase_quarantine_batch

-- name: erase_outbox_subject
-- The deliveries of the subject's messages that are not pending (sent, dead, held).
WITH batch AS (
    SELECT o.id FROM relaybox_subjects s
    JOIN relaybox_outbox o ON o.message_id = s.ref
    WHERE s.digest = ?1 AND s.kind = 'message' AND o.erased_at IS NULL
      AND o.status <> 'pending'
    LIMIT ?3)
-- include: erase_outbox_batch

-- name: erase_handler_outbox_subject
-- The rows handlers added to the outbox (ctx.outbox.add: an e-mail's address and text)
-- while handling the subject's inbox events, once they are not pending.
WITH batch AS (
    SELECT o.id FROM relaybox_subjects s
    JOIN relaybox_outbox o ON o.inbox_id = CAST(s.ref AS INTEGER)
    WHERE s.digest = ?1 AND s.kind = 'inbox' AND o.erased_at IS NULL
      AND o.status <> 'pending'
    LIMIT ?3)
-- include: erase_outbox_batch

-- name: erase_outbox_tenant
WITH batch AS (
    SELECT o.id FROM relaybox_messages m
    JOIN relaybox_outbox o ON o.message_id = m.id
    WHERE m.tenant = ?1 AND o.erased_at IS NULL AND o.status <> 'pending'
    LIMIT ?3)
-- include: erase_outbox_batch

-- name: erase_attempts
-- What the receivers answered to the deliveries just erased (?1: their ids): response
-- excerpt and headers, and the attempt's error text (a channel's error may quote the
-- payload). Outcome, status code and timing stay.
UPDATE relaybox_outbox_attempts
SET response = NULL, headers = NULL,
    error = CASE WHEN error IS NOT NULL THEN '(erased)' END
WHERE outbox_id IN (SELECT value FROM json_each(?1))
  AND (response IS NOT NULL OR headers IS NOT NULL
       OR (error IS NOT NULL AND error <> '(erased)'))
RETURNING id

-- name: erase_inbox_attempts
-- The error text of the handler attempts of the inbox rows just erased (?1: their
-- ids): an exception's message may quote the payload. Outcome, worker and timing stay.
UPDATE relaybox_inbox_attempts SET error = '(erased)'
WHERE inbox_id IN (SELECT value FROM json_each(?1))
  AND error IS NOT NULL AND error <> '(erased)'
RETURNING id

-- name: erase_messages_subject
-- A message's body goes once none of its deliveries keeps its payload: the body is
-- what a retry signs.
WITH batch AS (
    SELECT m.id FROM relaybox_subjects s
    JOIN relaybox_messages m ON m.id = s.ref
    WHERE s.digest = ?1 AND s.kind = 'message' AND m.erased_at IS NULL
      AND (SELECT 1 FROM relaybox_outbox o
           WHERE o.message_id = m.id AND o.erased_at IS NULL LIMIT 1) IS NULL
    LIMIT ?3)
-- include: erase_messages_batch

-- name: erase_messages_tenant
WITH batch AS (
    SELECT m.id FROM relaybox_messages m
    WHERE m.tenant = ?1 AND m.erased_at IS NULL
      AND (SELECT 1 FROM relaybox_outbox o
           WHERE o.message_id = m.id AND o.erased_at IS NULL LIMIT 1) IS NULL
    LIMIT ?3)
-- include: erase_messages_batch

-- name: erase_waiting_subject
-- The subject's rows not erased yet: pending ones, and any a batch skipped.
SELECT (SELECT count(*) FROM relaybox_subjects s
        JOIN relaybox_inbox i ON i.id = CAST(s.ref AS INTEGER)
        WHERE s.digest = ?1 AND s.kind = 'inbox' AND i.erased_at IS NULL)
     + (SELECT count(*) FROM relaybox_subjects s
        JOIN relaybox_messages m ON m.id = s.ref
        WHERE s.digest = ?1 AND s.kind = 'message' AND m.erased_at IS NULL)
     + (SELECT count(*) FROM relaybox_subjects s
        JOIN relaybox_outbox o ON o.inbox_id = CAST(s.ref AS INTEGER)
        WHERE s.digest = ?1 AND s.kind = 'inbox' AND o.erased_at IS NULL)

-- name: erase_inbox_tenant
-- The events received for the tenant that are not pending, once no row their handler
-- added to the outbox is pending (see the PostgreSQL statement).
WITH batch AS (
    SELECT i.id FROM relaybox_inbox i
    WHERE i.tenant = ?1 AND i.erased_at IS NULL AND i.status <> 'pending'
      AND NOT EXISTS (SELECT 1 FROM relaybox_outbox o
                      WHERE o.inbox_id = i.id AND o.status = 'pending')
    LIMIT ?3)
-- include: erase_inbox_batch

-- name: erase_quarantine_tenant
WITH batch AS (
    SELECT q.id FROM relaybox_quarantine q
    WHERE q.tenant = ?1 AND q.erased_at IS NULL
    LIMIT ?3)
-- include: erase_quarantine_batch

-- name: erase_handler_outbox_ids
-- ?1: the ids of the inbox rows just erased, as a JSON array.
-- include: erase_outbox_set
WHERE inbox_id IN (SELECT value FROM json_each(?1)) AND erased_at IS NULL
  AND status <> 'pending'
RETURNING id

-- name: erase_waiting_tenant
SELECT (SELECT count(*) FROM relaybox_messages WHERE tenant = ?1 AND erased_at IS NULL)
     + (SELECT count(*) FROM relaybox_inbox WHERE tenant = ?1 AND erased_at IS NULL)
     + (SELECT count(*) FROM relaybox_quarantine WHERE tenant = ?1 AND erased_at IS NULL)

-- name: erasure_find_open
-- The erasure of the same subject (or tenant) that is still waiting for rows: asking
-- again resumes it rather than recording another.
SELECT id FROM relaybox_erasures
WHERE finished_at IS NULL AND scope = ?1
  AND digest IS ?2 AND tenant IS ?3
ORDER BY id LIMIT 1

-- name: erasure_insert
INSERT INTO relaybox_erasures (actor, reason, scope, digest, tenant, created_at, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)
RETURNING id

-- name: erasure_add
-- Rows one batch erased, added to the erasure's counts in the batch's transaction.
UPDATE relaybox_erasures
SET inbox = inbox + ?2, quarantine = quarantine + ?3, outbox = outbox + ?4,
    attempts = attempts + ?5, messages = messages + ?6,
    inbox_attempts = inbox_attempts + ?7, projections = projections + ?8,
    updated_at = ?9
WHERE id = ?1

-- name: erasure_settle
-- After a run: how many of its rows still wait; finished once none does.
UPDATE relaybox_erasures
SET waiting = ?2, updated_at = ?3,
    finished_at = CASE WHEN ?2 = 0 THEN coalesce(finished_at, ?3) END
WHERE id = ?1

-- name: erasure_get
SELECT id, actor, reason, scope, digest, tenant, created_at, updated_at, finished_at,
       waiting, inbox, quarantine, outbox, attempts, messages, inbox_attempts,
       projections
FROM relaybox_erasures WHERE id = ?1

-- name: erasure_list
SELECT id, actor, reason, scope, digest, tenant, created_at, updated_at, finished_at,
       waiting, inbox, quarantine, outbox, attempts, messages, inbox_attempts,
       projections
FROM relaybox_erasures ORDER BY id DESC LIMIT ?1

-- name: erasure_open_ids
SELECT id FROM relaybox_erasures WHERE finished_at IS NULL ORDER BY id LIMIT ?1

-- name: subject_inherit_inbox
-- An operational event's message (?1) about inbox row ?2 (relaybox.inbox.dead, whose
-- error may quote the payload): indexed under every digest of that row.
INSERT INTO relaybox_subjects (digest, kind, ref)
SELECT DISTINCT digest, 'message', ?1 FROM relaybox_subjects
WHERE CAST(ref AS INTEGER) = ?2 AND kind = 'inbox'
ON CONFLICT DO NOTHING

-- name: subject_inherit_outbox
-- An operational event's message (?1) about outbox row ?2 (its last error): indexed
-- under every digest of the row's message, or of the inbox row whose handler added it
-- (two probes of the index of each kind's references, one each).
INSERT INTO relaybox_subjects (digest, kind, ref)
SELECT DISTINCT d.digest, 'message', ?1 FROM (
    SELECT s.digest FROM relaybox_outbox o
    JOIN relaybox_subjects s ON s.ref = o.message_id AND s.kind = 'message'
    WHERE o.id = ?2
    UNION ALL
    SELECT s.digest FROM relaybox_outbox o
    JOIN relaybox_subjects s ON CAST(s.ref AS INTEGER) = o.inbox_id AND s.kind = 'inbox'
    WHERE o.id = ?2
) d
WHERE true  -- (SQLite: an upsert's SELECT needs a WHERE)
ON CONFLICT DO NOTHING

-- name: erase_projections_subject
-- The states of versioned projections an event of the subject wrote (see the
-- PostgreSQL statement).
UPDATE relaybox_projections
SET state = NULL, erased_at = ?2
WHERE resource_key IN (SELECT p.resource_key FROM relaybox_projections p
                       WHERE p.subject = ?1 AND p.erased_at IS NULL
                       LIMIT ?3)
  AND erased_at IS NULL
RETURNING resource_key

-- name: erase_projections_ids
-- ?1: the ids of the inbox rows just erased, as a JSON array.
UPDATE relaybox_projections
SET state = NULL, erased_at = ?2
WHERE inbox_id IN (SELECT value FROM json_each(?1)) AND erased_at IS NULL
RETURNING resource_key

-- name: subjects_forget_inbox
-- The subject index's rows of the inbox rows ?1 (ids, a JSON array) deleted once
-- nothing found through them holds what an erasure empties (see the PostgreSQL
-- statement).
DELETE FROM relaybox_subjects
WHERE kind = 'inbox' AND CAST(ref AS INTEGER) IN (SELECT value FROM json_each(?1))
  AND NOT EXISTS (
      SELECT 1 FROM relaybox_inbox i
      WHERE i.id = CAST(relaybox_subjects.ref AS INTEGER) AND i.erased_at IS NULL
        AND (i.purged_at IS NULL OR i.last_error IS NOT NULL
             OR EXISTS (SELECT 1 FROM relaybox_inbox_attempts a
                        WHERE a.inbox_id = i.id AND a.error IS NOT NULL
                          AND a.error <> '(erased)')))
  AND NOT EXISTS (
      SELECT 1 FROM relaybox_quarantine q
      WHERE q.inbox_id = CAST(relaybox_subjects.ref AS INTEGER)
        AND q.erased_at IS NULL AND q.purged_at IS NULL)
  AND NOT EXISTS (
      SELECT 1 FROM relaybox_outbox o
      WHERE o.inbox_id = CAST(relaybox_subjects.ref AS INTEGER) AND o.erased_at IS NULL
        -- include: outbox_row_holds
      )
RETURNING ref

-- name: subjects_forget_messages
-- The subject index's rows of the messages ?1 (ids, a JSON array) deleted once nothing
-- found through them holds what an erasure empties.
DELETE FROM relaybox_subjects
WHERE kind = 'message' AND ref IN (SELECT value FROM json_each(?1))
  AND NOT EXISTS (
      SELECT 1 FROM relaybox_messages m
      WHERE m.id = relaybox_subjects.ref AND m.erased_at IS NULL AND m.purged_at IS NULL)
  AND NOT EXISTS (
      SELECT 1 FROM relaybox_outbox o
      WHERE o.message_id = relaybox_subjects.ref AND o.erased_at IS NULL
        -- include: outbox_row_holds
      )
RETURNING ref

-- name: subjects_refs_quarantine
SELECT DISTINCT inbox_id FROM relaybox_quarantine WHERE id IN (SELECT value FROM json_each(?1))

-- name: subjects_refs_outbox
SELECT inbox_id, message_id FROM relaybox_outbox WHERE id IN (SELECT value FROM json_each(?1))

-- name: subjects_inbox_refs_below
SELECT CAST(ref AS INTEGER) FROM relaybox_subjects
WHERE kind = 'inbox' AND CAST(ref AS INTEGER) > ?1 AND CAST(ref AS INTEGER) < ?2
ORDER BY CAST(ref AS INTEGER)
LIMIT ?3

-- name: subjects_inbox_low
SELECT min(id) FROM relaybox_inbox

-- name: subjects_message_refs_below
SELECT ref FROM relaybox_subjects
WHERE kind = 'message' AND ref > ?1 AND ref < ?2
ORDER BY ref
LIMIT ?3

-- name: subjects_messages_low
SELECT min(id) FROM relaybox_messages
