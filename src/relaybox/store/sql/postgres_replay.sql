-- Replay: put finished rows back on the same idempotent path (the worker and the
-- handler's business keys), recording who asked and why.

-- name: replay_select
-- Rows matching a selection (discarded dead letters marked: the caller decides);
-- NULL parameters do not filter. Pending rows are
-- already on their way and are never selected.
SELECT id, status, dead_reason, payload IS NULL AS purged,
       discarded_at IS NOT NULL AS discarded
FROM relaybox_inbox
WHERE status <> 'pending'
  AND ($1::bigint[] IS NULL OR id = ANY($1::bigint[]))
  AND ($2::text IS NULL OR source = $2)
  AND ($3::double precision IS NULL OR received_at >= $3)
  AND ($4::double precision IS NULL OR received_at < $4)
  AND ($5::text[] IS NULL OR status = ANY($5::text[]))
ORDER BY id
LIMIT $6

-- name: replay_mark
-- Only a row still in the status it was selected in is replayed (no double replay).
UPDATE relaybox_inbox
SET status = 'pending', dead_reason = NULL, attempts = 0, started_at = NULL,
    discarded_at = NULL, discarded_by = NULL, discard_reason = NULL, next_attempt_at = $2,
    updated_at = $2, done_at = NULL
WHERE id = $1 AND status = $3 AND payload IS NOT NULL
RETURNING id

-- name: replay_record
INSERT INTO relaybox_replays (inbox_id, actor, reason, previous_status, previous_reason, replayed_at)
VALUES ($1, $2, $3, $4, $5, $6)
