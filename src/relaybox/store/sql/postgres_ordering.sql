-- Ordering area: versioned projections, reconciliation tickets, pull-based recovery.
-- Same names and parameter order as sqlite_ordering.sql.

-- name: projection_upsert
-- Compare-and-set in one statement: the row is written only when it is new or the
-- stored version_key is lower ("C" collation: byte order), and only within one
-- origin. Two workers racing on one resource queue on the row, and the second one
-- re-evaluates the condition against the first one's committed version.
-- The state is stored with the subject of the event that wrote it (its digest in
-- relaybox_subjects, one probe of the index of inbox references; NULL: none), which
-- an erasure of that subject reads to empty it.
INSERT INTO relaybox_projections AS p
    (resource_key, origin, version, version_key, state, source, inbox_id, updated_at, subject)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8,
        (SELECT s.digest FROM relaybox_subjects s
         WHERE s.kind = 'inbox' AND s.ref::bigint = $7::bigint LIMIT 1))
ON CONFLICT (resource_key) DO UPDATE
SET version = excluded.version, version_key = excluded.version_key, state = excluded.state,
    source = excluded.source, inbox_id = excluded.inbox_id, updated_at = excluded.updated_at,
    subject = excluded.subject, erased_at = NULL
WHERE p.version_key < excluded.version_key AND p.origin = excluded.origin
RETURNING p.resource_key

-- name: projection_get
-- The stored state of a resource (after a refused write: the row is already locked
-- by the ON CONFLICT that refused it, so this is the version that won).
SELECT resource_key, origin, version, version_key, state, source, inbox_id, updated_at
FROM relaybox_projections WHERE resource_key = $1

-- name: inbox_mark_superseded
-- In the handler's transaction: rolled back with its savepoint if the handler fails.
UPDATE relaybox_inbox SET superseded_by = coalesce(superseded_by || ', ', '') || $2::text WHERE id = $1

-- name: inbox_clear_superseded
-- A replayed row is judged again.
UPDATE relaybox_inbox SET superseded_by = NULL WHERE id = $1

-- name: reconcile_ticket
-- Issued in its own short transaction BEFORE the fetch: a later ticket belongs to a
-- read that started later. Also returns the request counter seen now, so requests
-- that arrive during the fetch stay pending.
INSERT INTO relaybox_reconcile AS r (source, resource_id, issued)
VALUES ($1, $2, 1)
ON CONFLICT (source, resource_id) DO UPDATE SET issued = r.issued + 1
RETURNING r.issued, r.requested

-- name: reconcile_lock
-- Serialises the write phase of one resource (read stored state, compare, write):
-- short, and never held across the provider call.
SELECT issued FROM relaybox_reconcile WHERE source = $1 AND resource_id = $2 FOR UPDATE

-- name: reconcile_done
UPDATE relaybox_reconcile
SET handled = GREATEST(handled, $3::bigint), last_checked_at = $4::double precision,
    divergences = divergences + $5::integer,
    last_diverged_at = CASE WHEN $5::integer > 0 THEN $4::double precision
                            ELSE last_diverged_at END
WHERE source = $1 AND resource_id = $2

-- name: reconcile_request
-- A handler asks for a reconciliation in its own transaction (no remote call there).
INSERT INTO relaybox_reconcile AS r (source, resource_id, requested)
VALUES ($1, $2, 1)
ON CONFLICT (source, resource_id) DO UPDATE SET requested = r.requested + 1

-- name: reconcile_ids_all
SELECT resource_id FROM relaybox_reconcile WHERE source = $1 ORDER BY resource_id LIMIT $2

-- name: reconcile_ids_requested
SELECT resource_id FROM relaybox_reconcile
WHERE source = $1 AND requested > handled ORDER BY resource_id LIMIT $2

-- name: inbox_find_events
-- Which of these event ids a source already holds, whatever the account.
SELECT event_id, id, status FROM relaybox_inbox
WHERE source = $1 AND event_id = ANY($2::text[])

-- name: inbox_mark_recovered
UPDATE relaybox_inbox SET recovered_via = $2 WHERE id = $1

-- name: recovery_record
INSERT INTO relaybox_recoveries (source, event_id, delivery_id, action, inbox_id, recovered_at)
VALUES ($1, $2, $3, $4, $5, $6)
