-- Replay: put finished rows back on the same idempotent path, recording who and why.

-- name: replay_select
-- Rows matching a selection (discarded dead letters marked: the caller decides);
-- NULL parameters do not filter. Ids and statuses come
-- as JSON arrays. Pending rows are already on their way and are never selected.
SELECT id, status, dead_reason, payload IS NULL AS purged,
       discarded_at IS NOT NULL AS discarded
FROM relaybox_inbox
WHERE status <> 'pending'
  AND (?1 IS NULL OR id IN (SELECT value FROM json_each(?1)))
  AND (?2 IS NULL OR source = ?2)
  AND (?3 IS NULL OR received_at >= ?3)
  AND (?4 IS NULL OR received_at < ?4)
  AND (?5 IS NULL OR status IN (SELECT value FROM json_each(?5)))
ORDER BY id
LIMIT ?6

-- name: replay_mark
-- Only a row still in the status it was selected in is replayed (no double replay).
UPDATE relaybox_inbox
SET status = 'pending', dead_reason = NULL, attempts = 0, started_at = NULL,
    discarded_at = NULL, discarded_by = NULL, discard_reason = NULL, next_attempt_at = ?2,
    updated_at = ?2, done_at = NULL
WHERE id = ?1 AND status = ?3 AND payload IS NOT NULL
RETURNING id

-- name: replay_record
INSERT INTO relaybox_replays (inbox_id, actor, reason, previous_status, previous_reason, replayed_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6)
