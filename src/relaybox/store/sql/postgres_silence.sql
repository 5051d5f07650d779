-- Silence detection (relaybox.silence): what the maintenance check reads and the
-- state it keeps in relaybox_silences. Each read is one statement whose cost is set
-- by the number of watched sources or endpoints, never by history: an index gives
-- each source's newest arrival and each endpoint's first waiting deliveries.

-- name: silence_sources_seen
-- Per watched source ($1), its newest arrival: one backward step of the
-- (source, id) index each.
SELECT s.name,
       (SELECT i.received_at FROM relaybox_inbox i
        WHERE i.source = s.name ORDER BY i.id DESC LIMIT 1) AS last_seen
FROM unnest($1::text[]) AS s(name)

-- name: silence_arrivals
-- Learning a source's window: the arrival times of its newest $3 events received
-- since $2 (a bounded walk back along the (source, id) index), newest first.
SELECT received_at FROM relaybox_inbox
WHERE source = $1 AND received_at >= $2
ORDER BY id DESC
LIMIT $3

-- name: silence_endpoints
-- Every enabled, unpaused endpoint outside the operational tenant ($1), its last
-- success, and since when deliveries wait for it: the oldest of its first 100 pending
-- rows in the order the dispatcher takes them (the lane-due index; NULL: none waits).
SELECT e.id, e.tenant, e.url, e.last_success_at, e.created_at, w.waiting_since
FROM relaybox_endpoints e
CROSS JOIN LATERAL (
    SELECT min(f.created_at) AS waiting_since FROM (
        SELECT o.created_at FROM relaybox_outbox o
        WHERE COALESCE(o.lane, o.channel) = e.id AND o.status = 'pending'
        ORDER BY COALESCE(o.lane, o.channel), o.next_attempt_at, o.id
        LIMIT 100
    ) f
) w
WHERE e.status = 'enabled' AND e.paused_at IS NULL AND e.tenant <> $1
ORDER BY e.id

-- name: silence_silent_endpoints
-- The silent endpoints, longest silence first ($1 at most: the silent index).
SELECT kind, name, last_seen, expected, silent_since, learned, learned_at, checked_at
FROM relaybox_silences WHERE kind = 'endpoint' AND silent_since IS NOT NULL
ORDER BY kind, last_seen
LIMIT $1

-- name: silence_silent_endpoints_count
-- How many endpoints are silent, counted up to $1.
SELECT count(*) FROM (
    SELECT 1 FROM relaybox_silences WHERE kind = 'endpoint' AND silent_since IS NOT NULL
    LIMIT $1
) x

-- name: silence_rows
-- The state of every watched name of kind $1, as the last check left it.
SELECT kind, name, last_seen, expected, silent_since, learned, learned_at, checked_at
FROM relaybox_silences WHERE kind = $1

-- name: silence_note
-- What a check saw, for the names whose last_seen ($3) or window ($4) changed or that
-- are new ($2), in one statement; silent_since is left to silence_raise and
-- silence_end.
INSERT INTO relaybox_silences (kind, name, last_seen, expected, checked_at)
SELECT $1, r.name, r.last_seen, r.expected, $5
FROM unnest($2::text[], $3::double precision[], $4::double precision[])
    AS r(name, last_seen, expected)
ON CONFLICT (kind, name) DO UPDATE
SET last_seen = EXCLUDED.last_seen, expected = EXCLUDED.expected,
    checked_at = EXCLUDED.checked_at

-- name: silence_raise
-- Only the first check that finds the silence raises it (its event is published in
-- this transaction); any other gets no row.
UPDATE relaybox_silences SET silent_since = $3
WHERE kind = $1 AND name = $2 AND silent_since IS NULL
RETURNING silent_since

-- name: silence_end
-- Traffic resumed: only the first check that sees it ends the silence.
UPDATE relaybox_silences SET silent_since = NULL
WHERE kind = $1 AND name = $2 AND silent_since IS NOT NULL
RETURNING kind

-- name: silence_learned
INSERT INTO relaybox_silences (kind, name, learned, learned_at, checked_at)
VALUES ($1, $2, $3, $4, $4)
ON CONFLICT (kind, name) DO UPDATE SET learned = $3, learned_at = $4

-- name: silence_forget
-- Sources and endpoints no longer watched ($2: the watched names of kind $1) leave.
DELETE FROM relaybox_silences WHERE kind = $1 AND NOT (name = ANY($2::text[]))
RETURNING name
