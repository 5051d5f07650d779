-- Ordering area: versioned projections, reconciliation tickets, pull-based recovery.
-- Same names and parameter order as postgres_ordering.sql. One writer at a time
-- (BEGIN IMMEDIATE): the compare-and-set cannot interleave with another writer.

-- name: projection_upsert
-- Compare-and-set: written only when new or when the stored version_key is lower
-- (BINARY collation: byte order), and only within one origin.
-- With the subject of the event that wrote it (see the PostgreSQL statement).
INSERT INTO relaybox_projections AS p
    (resource_key, origin, version, version_key, state, source, inbox_id, updated_at, subject)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8,
        (SELECT s.digest FROM relaybox_subjects s
         WHERE s.kind = 'inbox' AND CAST(s.ref AS INTEGER) = ?7 LIMIT 1))
ON CONFLICT (resource_key) DO UPDATE
SET version = excluded.version, version_key = excluded.version_key, state = excluded.state,
    source = excluded.source, inbox_id = excluded.inbox_id, updated_at = excluded.updated_at,
    subject = excluded.subject, erased_at = NULL
WHERE p.version_key < excluded.version_key AND p.origin = excluded.origin
RETURNING resource_key

-- name: projection_get
SELECT resource_key, origin, version, version_key, state, source, inbox_id, updated_at
FROM relaybox_projections WHERE resource_key = ?1

-- name: inbox_mark_superseded
UPDATE relaybox_inbox SET superseded_by = coalesce(superseded_by || ', ', '') || ?2 WHERE id = ?1

-- name: inbox_clear_superseded
UPDATE relaybox_inbox SET superseded_by = NULL WHERE id = ?1

-- name: reconcile_ticket
-- Issued in its own short transaction BEFORE the fetch.
INSERT INTO relaybox_reconcile AS r (source, resource_id, issued)
VALUES (?1, ?2, 1)
ON CONFLICT (source, resource_id) DO UPDATE SET issued = r.issued + 1
RETURNING issued, requested

-- name: reconcile_lock
-- BEGIN IMMEDIATE already excludes every other writer until COMMIT.
SELECT issued FROM relaybox_reconcile WHERE source = ?1 AND resource_id = ?2

-- name: reconcile_done
UPDATE relaybox_reconcile
SET handled = max(handled, ?3), last_checked_at = ?4,
    divergences = divergences + ?5,
    last_diverged_at = CASE WHEN ?5 > 0 THEN ?4 ELSE last_diverged_at END
WHERE source = ?1 AND resource_id = ?2

-- name: reconcile_request
INSERT INTO relaybox_reconcile AS r (source, resource_id, requested)
VALUES (?1, ?2, 1)
ON CONFLICT (source, resource_id) DO UPDATE SET requested = r.requested + 1

-- name: reconcile_ids_all
SELECT resource_id FROM relaybox_reconcile WHERE source = ?1 ORDER BY resource_id LIMIT ?2

-- name: reconcile_ids_requested
SELECT resource_id FROM relaybox_reconcile
WHERE source = ?1 AND requested > handled ORDER BY resource_id LIMIT ?2

-- name: inbox_find_events
-- Event ids come as a JSON array.
SELECT event_id, id, status FROM relaybox_inbox
WHERE source = ?1 AND event_id IN (SELECT value FROM json_each(?2))

-- name: inbox_mark_recovered
UPDATE relaybox_inbox SET recovered_via = ?2 WHERE id = ?1

-- name: recovery_record
INSERT INTO relaybox_recoveries (source, event_id, delivery_id, action, inbox_id, recovered_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6)
