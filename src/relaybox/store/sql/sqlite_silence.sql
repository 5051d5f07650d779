-- Silence detection (SQLite; numbered ?n parameters, same names and order as
-- postgres_silence.sql).

-- name: silence_sources_seen
SELECT s.value AS name,
       (SELECT i.received_at FROM relaybox_inbox i
        WHERE i.source = s.value ORDER BY i.id DESC LIMIT 1) AS last_seen
FROM json_each(?1) AS s

-- name: silence_arrivals
SELECT received_at FROM relaybox_inbox
WHERE source = ?1 AND received_at >= ?2
ORDER BY id DESC
LIMIT ?3

-- name: silence_endpoints
SELECT e.id, e.tenant, e.url, e.last_success_at, e.created_at,
       (SELECT min(f.created_at) FROM (
            SELECT o.created_at FROM relaybox_outbox o
            WHERE COALESCE(o.lane, o.channel) = e.id AND o.status = 'pending'
            ORDER BY COALESCE(o.lane, o.channel), o.next_attempt_at
            LIMIT 100
        ) f) AS waiting_since
FROM relaybox_endpoints e
WHERE e.status = 'enabled' AND e.paused_at IS NULL AND e.tenant <> ?1
ORDER BY e.id

-- name: silence_silent_endpoints
-- The silent endpoints, longest silence first (?1 at most: the silent index).
SELECT kind, name, last_seen, expected, silent_since, learned, learned_at, checked_at
FROM relaybox_silences WHERE kind = 'endpoint' AND silent_since IS NOT NULL
ORDER BY kind, last_seen
LIMIT ?1

-- name: silence_silent_endpoints_count
-- How many endpoints are silent, counted up to ?1.
SELECT count(*) FROM (
    SELECT 1 FROM relaybox_silences WHERE kind = 'endpoint' AND silent_since IS NOT NULL
    LIMIT ?1
) x

-- name: silence_rows
SELECT kind, name, last_seen, expected, silent_since, learned, learned_at, checked_at
FROM relaybox_silences WHERE kind = ?1

-- name: silence_note
-- ?2: a JSON array of [name, last_seen, expected] (WHERE true: SQLite's upsert after
-- a SELECT needs it).
INSERT INTO relaybox_silences (kind, name, last_seen, expected, checked_at)
SELECT ?1, json_extract(r.value, '$[0]'), json_extract(r.value, '$[1]'),
       json_extract(r.value, '$[2]'), ?3
FROM json_each(?2) AS r WHERE true
ON CONFLICT (kind, name) DO UPDATE
SET last_seen = excluded.last_seen, expected = excluded.expected,
    checked_at = excluded.checked_at

-- name: silence_raise
UPDATE relaybox_silences SET silent_since = ?3
WHERE kind = ?1 AND name = ?2 AND silent_since IS NULL
RETURNING silent_since

-- name: silence_end
UPDATE relaybox_silences SET silent_since = NULL
WHERE kind = ?1 AND name = ?2 AND silent_since IS NOT NULL
RETURNING kind

-- name: silence_learned
INSERT INTO relaybox_silences (kind, name, learned, learned_at, checked_at)
VALUES (?1, ?2, ?3, ?4, ?4)
ON CONFLICT (kind, name) DO UPDATE SET learned = ?3, learned_at = ?4

-- name: silence_forget
DELETE FROM relaybox_silences
WHERE kind = ?1 AND name NOT IN (SELECT value FROM json_each(?2))
RETURNING name
