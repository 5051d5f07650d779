-- Named queries of the sending side (SQLite). Parameters are numbered (?n) in the
-- same order as postgres_outbound.sql; lists come as JSON arrays (json_each). One
-- writer at a time: BEGIN IMMEDIATE already excludes other leasers until COMMIT, so
-- no SKIP LOCKED is needed.

-- name: endpoint_insert
INSERT INTO relaybox_endpoints
    (id, tenant, url, description, event_types, status, signature, timeout, schedule,
     created_at, updated_at, payload_filter, ordered, on_dead, trace_context)
VALUES (?1, ?2, ?3, ?4, ?5, 'enabled', ?6, ?7, ?8, ?9, ?9, ?10, ?11, ?12, ?13)

-- name: endpoint_quota_lock
-- Nothing to lock: the transaction began IMMEDIATE (one writer), so endpoint_count and
-- endpoint_filters see every endpoint committed before and no other write runs meanwhile.
SELECT ?1 AS tenant

-- name: endpoint_count
SELECT count(*) AS n FROM relaybox_endpoints WHERE tenant = ?1

-- name: endpoint_filters
SELECT payload_filter FROM relaybox_endpoints
WHERE tenant = ?1 AND id <> ?2 AND payload_filter IS NOT NULL
ORDER BY id

-- name: endpoint_update
UPDATE relaybox_endpoints
SET url = ?3, description = ?4, event_types = ?5, signature = ?6, timeout = ?7,
    schedule = ?8, updated_at = ?9, payload_filter = ?10, ordered = ?11, on_dead = ?12,
    trace_context = ?13
WHERE id = ?1 AND tenant = ?2
RETURNING id

-- name: endpoint_get
-- include: endpoint_row
WHERE e.id = ?1 AND (?2 IS NULL OR e.tenant = ?2)

-- name: endpoint_list
-- include: endpoint_row
WHERE (?1 IS NULL OR e.tenant = ?1)
ORDER BY e.created_at, e.id
LIMIT ?2

-- name: endpoint_delete
DELETE FROM relaybox_endpoints WHERE id = ?1 AND tenant = ?2 RETURNING id

-- name: publish_context
-- What a publish reads, in one statement: the catalog's schema and subject path of
-- the event type ?2 (a row with a NULL id and the path in the second column, when it
-- has either) and the endpoints of tenant ?1 it fans out to (id, event type
-- patterns, payload filter), by id.
SELECT NULL AS id, subject AS event_types, NULL AS payload_filter, schema
FROM relaybox_event_types
WHERE name = ?2 AND (schema IS NOT NULL AND schema <> '' OR subject IS NOT NULL)
UNION ALL
SELECT id, event_types, payload_filter, NULL FROM relaybox_endpoints
WHERE tenant = ?1 AND status = 'enabled'
ORDER BY id NULLS FIRST

-- name: endpoint_set_status
UPDATE relaybox_endpoints
SET status = ?2, disabled_reason = ?3, updated_at = ?4,
    failing_since = CASE WHEN ?2 = 'enabled' THEN NULL ELSE failing_since END,
    failures = CASE WHEN ?2 = 'enabled' THEN 0 ELSE failures END,
    failing_level = CASE WHEN ?2 = 'enabled' THEN 0 ELSE failing_level END
WHERE id = ?1 AND status <> ?2
RETURNING id, tenant, url, failing_since

-- name: endpoint_failed
UPDATE relaybox_endpoints
SET failing_since = COALESCE(failing_since, ?2), failures = failures + 1
WHERE id = ?1
RETURNING status, failing_since, failures, failing_level

-- name: endpoint_succeeded
-- Ends the failure streak; notes the last success (?2) at most once a minute.
UPDATE relaybox_endpoints SET failing_since = NULL, failures = 0,
    last_success_at = COALESCE(?2, last_success_at)
WHERE id = ?1
  AND (failing_since IS NOT NULL
       OR (?2 IS NOT NULL AND (last_success_at IS NULL OR last_success_at < ?2 - 60)))

-- name: endpoint_secret_insert
INSERT INTO relaybox_endpoint_secrets (endpoint_id, secret, created_at) VALUES (?1, ?2, ?3)

-- name: endpoint_secret_expire
UPDATE relaybox_endpoint_secrets SET expires_at = ?2
WHERE endpoint_id = ?1 AND (expires_at IS NULL OR expires_at > ?2)

-- name: endpoint_secrets_active
SELECT endpoint_id, secret, created_at, expires_at FROM relaybox_endpoint_secrets
WHERE endpoint_id IN (SELECT value FROM json_each(?1)) AND (expires_at IS NULL OR expires_at > ?2)
ORDER BY endpoint_id, id DESC

-- name: endpoint_secrets_reveal
-- The endpoint's active secrets never shown in the portal, marked shown at ?2: each
-- is revealed once, whoever asks at the same time.
UPDATE relaybox_endpoint_secrets SET revealed_at = ?2
WHERE endpoint_id = ?1 AND revealed_at IS NULL AND (expires_at IS NULL OR expires_at > ?2)
RETURNING endpoint_id, secret, created_at, expires_at

-- name: endpoint_secrets_page
-- Up to ?2 stored secrets after id ?1 (expired ones too), in id order: the sealing
-- passes (relaybox migrate, relaybox endpoints seal-secrets) and doctor walk the table
-- in pages, each in a short transaction of its own.
SELECT id, secret FROM relaybox_endpoint_secrets WHERE id > ?1 ORDER BY id LIMIT ?2

-- name: endpoint_secrets_plaintext_page
-- Like endpoint_secrets_page, only the secrets stored in plaintext (by versions that
-- did not seal them): what relaybox migrate seals.
SELECT id, secret FROM relaybox_endpoint_secrets
WHERE id > ?1 AND secret NOT LIKE 'fernet:%' ORDER BY id LIMIT ?2

-- name: endpoint_secret_sealed_any
-- Whether any stored secret is sealed: a key file that is missing while one is means
-- the key was lost, and relaybox makes no new one then (see outbound/vault.py).
SELECT 1 AS found FROM relaybox_endpoint_secrets WHERE secret LIKE 'fernet:%' LIMIT 1

-- name: endpoint_secret_swap
-- Compare-and-set: the stored value becomes ?3 only while it is still ?2, so that
-- processes sealing at once never undo each other's work (the later one updates
-- nothing and returns no row).
UPDATE relaybox_endpoint_secrets SET secret = ?3 WHERE id = ?1 AND secret = ?2 RETURNING id

-- name: lane_upsert
INSERT INTO relaybox_lanes (lane, max_in_flight, rate_limit) VALUES (?1, ?2, ?3)
ON CONFLICT (lane) DO UPDATE
SET max_in_flight = excluded.max_in_flight, rate_limit = excluded.rate_limit

-- name: lane_delete
DELETE FROM relaybox_lanes WHERE lane = ?1

-- name: message_key_insert
-- A message's idempotency key (?1: its digest, ?2: the tenant's scope, ?3: the
-- publish time, ?4, ?5: the message id as relaybox.store.keys.message_ref stores it,
-- its 16 bytes or its text), in the publisher's transaction: the primary key decides
-- which publish is first, whether or not the first message still exists.
INSERT INTO relaybox_message_keys (scope, first_seen, digest, message_uuid, message_text)
VALUES (?2, CAST(?3 / 86400 AS INTEGER), ?1, ?4, ?5)
ON CONFLICT DO NOTHING
RETURNING 1

-- name: message_insert
-- After message_key_insert (when the message has a key): the message itself.
INSERT INTO relaybox_messages
    (id, tenant, event_type, idempotency_key, body, created_at, ordering_key, sequence,
     traceparent)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
ON CONFLICT DO NOTHING
RETURNING id

-- name: message_key_adopt
-- message_insert inserted nothing after message_key_insert: the messages' old UNIQUE
-- (tenant, idempotency_key) found a message stored before the keys table had its key
-- (?1: the digest, ?2, ?3: tenant and key). The key names that message, by its id as
-- text (SQLite has no unhex() before 3.41 to make its 16 bytes: either is read).
UPDATE relaybox_message_keys SET message_uuid = NULL, message_text = (
    SELECT m.id FROM relaybox_messages m WHERE m.tenant = ?2 AND m.idempotency_key = ?3)
WHERE digest = ?1
  AND EXISTS (SELECT 1 FROM relaybox_messages m
              WHERE m.tenant = ?2 AND m.idempotency_key = ?3)

-- name: message_get_by_key
-- The message published under an idempotency key (?1: its digest; ?2, ?3: the
-- tenant and the key): the keys table names it, with the day it was first seen; its
-- columns are NULL when the message row is gone (its history dropped). Until the
-- backfill of message keys has finished, a message stored before the keys table
-- existed is found by its old (tenant, idempotency_key) key.
SELECT k.id, m.tenant, m.event_type, m.idempotency_key, m.body,
       m.created_at, m.ordering_key, m.sequence, k.first_seen
FROM (SELECT coalesce(message_text, 'msg_' || substr(lower(hex(message_uuid)), 6)) AS id,
             first_seen
      FROM relaybox_message_keys WHERE digest = ?1) k
LEFT JOIN relaybox_messages m ON m.id = k.id
UNION ALL
SELECT m.id, m.tenant, m.event_type, m.idempotency_key, m.body, m.created_at,
       m.ordering_key, m.sequence, NULL
FROM relaybox_messages m
WHERE m.tenant = ?2 AND m.idempotency_key = ?3
  AND NOT EXISTS (SELECT 1 FROM relaybox_keys_backfill b
                  WHERE b.kind = 'message' AND b.finished_at IS NOT NULL)
  AND NOT EXISTS (SELECT 1 FROM relaybox_message_keys k WHERE k.digest = ?1)

-- name: message_get
SELECT id, tenant, event_type, idempotency_key, body, created_at, ordering_key, sequence
FROM relaybox_messages
WHERE id = ?1 AND (?2 IS NULL OR tenant = ?2)

-- name: message_list
SELECT id, tenant, event_type, idempotency_key, body, created_at, ordering_key, sequence
FROM relaybox_messages
WHERE (?1 IS NULL OR tenant = ?1) AND (?2 IS NULL OR event_type = ?2)
  AND (?3 IS NULL OR (created_at, id) < (?3, ?4)) AND (?6 IS NULL OR idempotency_key = ?6)
ORDER BY created_at DESC, id DESC
LIMIT ?5

-- name: message_sequence_next
-- The next sequence number of (tenant ?1, ordering key ?2); one writer at a time, so
-- numbers increase in commit order.
INSERT INTO relaybox_outbound_sequences (tenant, ordering_key, last_sequence)
VALUES (?1, ?2, 1)
ON CONFLICT (tenant, ordering_key) DO UPDATE
SET last_sequence = relaybox_outbound_sequences.last_sequence + 1
RETURNING last_sequence

-- name: delivery_insert
-- "WHERE true" keeps SQLite from reading ON CONFLICT as part of the SELECT's join.
-- A keyed message (?5, ?6) gives its key and sequence to the rows of ordered
-- endpoints only (see postgres_outbound.sql).
INSERT INTO relaybox_outbox
    (channel, key, payload, tenant, status, next_attempt_at, created_at, updated_at,
     lane, endpoint_id, message_id, ordering_key, sequence)
SELECT 'webhook', ?1 || ':' || e.value, 'null', ?2, 'pending', ?3, ?3, ?3, e.value, e.value, ?1,
       CASE WHEN k.ordered THEN ?5 END, CASE WHEN k.ordered THEN ?6 END
FROM json_each(?4) AS e
JOIN (SELECT x.id, ?5 IS NOT NULL AND x.ordered AS ordered FROM relaybox_endpoints x) AS k
    ON k.id = e.value
WHERE true
ON CONFLICT (channel, key) DO NOTHING
RETURNING id

-- name: delivery_list
-- ``broker``: the destination of an endpoint routed to one (``broker:<name>``).
SELECT o.id, o.message_id, o.endpoint_id, o.channel, o.key, o.tenant, o.status, o.dead_reason,
       o.attempts, o.next_attempt_at, o.last_error, o.last_status, o.created_at,
       o.updated_at, o.sent_at, m.event_type,
       CASE WHEN e.url LIKE 'broker:%' THEN substr(e.url, 8) END AS broker
FROM relaybox_outbox o LEFT JOIN relaybox_messages m ON m.id = o.message_id
LEFT JOIN relaybox_endpoints e ON e.id = o.endpoint_id
WHERE (?1 IS NULL OR o.tenant = ?1) AND (?2 IS NULL OR o.message_id = ?2)
  AND (?3 IS NULL OR o.endpoint_id = ?3)
  AND (NOT ?4 OR o.status <> 'sent')
ORDER BY o.created_at DESC, o.id DESC
LIMIT ?5

-- name: delivery_log_list
SELECT o.id, o.message_id, o.endpoint_id, o.channel, o.key, o.tenant, o.status, o.dead_reason,
       o.attempts, o.next_attempt_at, o.last_error, o.last_status, o.created_at,
       o.updated_at, o.sent_at, m.event_type
FROM relaybox_outbox o LEFT JOIN relaybox_messages m ON m.id = o.message_id
WHERE (?1 IS NULL OR o.tenant = ?1) AND (?2 IS NULL OR o.status = ?2)
  AND (?3 IS NULL OR m.event_type = ?3) AND (?4 IS NULL OR o.message_id = ?4)
  AND (?5 IS NULL OR m.idempotency_key = ?5)
  AND (?6 IS NULL OR o.created_at >= ?6) AND (?7 IS NULL OR o.created_at < ?7)
ORDER BY o.created_at DESC, o.id DESC
LIMIT ?8

-- name: delivery_redeliver
UPDATE relaybox_outbox
SET status = 'pending', dead_reason = NULL, attempts = 0, next_attempt_at = ?4,
    lease_owner = NULL, lease_until = NULL, uncertain = 0, sent_at = NULL, updated_at = ?4
WHERE message_id = ?1 AND (?2 IS NULL OR tenant = ?2) AND (?3 IS NULL OR endpoint_id = ?3)
  AND status IN ('sent', 'dead', 'held') AND purged_at IS NULL
  AND endpoint_id IN (SELECT id FROM relaybox_endpoints WHERE status = 'enabled')
RETURNING id

-- name: delivery_recover
UPDATE relaybox_outbox
SET status = 'pending', dead_reason = NULL, attempts = 0, next_attempt_at = ?4,
    lease_owner = NULL, lease_until = NULL, uncertain = 0, updated_at = ?4
WHERE endpoint_id = ?1 AND status = 'dead' AND purged_at IS NULL AND created_at >= ?2
  AND (?3 IS NULL OR created_at < ?3)
RETURNING id

-- name: endpoint_pause
UPDATE relaybox_endpoints
SET paused_at = ?3, updated_at = ?4,
    failing_since = CASE WHEN ?3 IS NULL THEN NULL ELSE failing_since END
WHERE id = ?1 AND (?2 IS NULL OR tenant = ?2) AND (paused_at IS NULL) <> (?3 IS NULL)
RETURNING id, tenant

-- name: message_missing_page
SELECT m.id, m.event_type, m.body, m.created_at FROM relaybox_messages m
WHERE m.tenant = ?1 AND m.created_at >= ?3 AND m.created_at <= ?7 AND m.purged_at IS NULL
  AND (?4 IS NULL OR m.created_at > ?4 OR (m.created_at = ?4 AND m.id > ?5))
  AND NOT EXISTS (SELECT 1 FROM relaybox_outbox o
                  WHERE o.channel = 'webhook' AND o.key = m.id || ':' || ?2)
ORDER BY m.created_at, m.id
LIMIT ?6

-- name: delivery_insert_missing
-- One writer at a time: the transaction's checks hold until its COMMIT.
INSERT INTO relaybox_outbox
    (channel, key, payload, tenant, status, next_attempt_at, created_at, updated_at,
     lane, endpoint_id, message_id)
SELECT 'webhook', m.id || ':' || ?1, 'null', ?2, 'pending', ?3, ?3, ?3, ?1, ?1, m.id
FROM json_each(?4) AS j JOIN relaybox_messages m ON m.id = j.value
WHERE m.tenant = ?2 AND m.purged_at IS NULL
ORDER BY j.key
ON CONFLICT (channel, key) DO NOTHING
RETURNING id

-- name: endpoint_paused_backlog
SELECT e.id, count(o.id) AS waiting FROM relaybox_endpoints e
LEFT JOIN relaybox_outbox o ON o.endpoint_id = e.id AND o.status = 'pending'
WHERE e.paused_at IS NOT NULL
GROUP BY e.id

-- name: delivery_lock_endpoint
-- The endpoint's waiting rows (postgres_outbound.sql locks them; one writer here).
SELECT id FROM relaybox_outbox WHERE endpoint_id = ?1 AND status = 'pending'

-- name: delivery_kill_endpoint
-- Those rows ($4) go to dead letters, except those under a live lease.
UPDATE relaybox_outbox SET status = 'dead', dead_reason = ?2, updated_at = ?3
WHERE id IN (SELECT value FROM json_each(?4)) AND endpoint_id = ?1 AND status = 'pending'
  AND (lease_until IS NULL OR lease_until <= ?3)

-- name: delivery_strays
-- Waiting rows of disabled endpoints (?2 at most) that no live lease holds
-- (postgres_outbound.sql says which), through the lane's partial index.
SELECT o.id, e.id
FROM relaybox_endpoints e
JOIN relaybox_outbox o
  ON coalesce(o.lane, o.channel) = e.id AND o.status = 'pending' AND o.endpoint_id = e.id
WHERE e.status = 'disabled' AND (o.lease_until IS NULL OR o.lease_until <= ?1)
LIMIT ?2

-- name: delivery_lock_ids
-- Those rows (postgres_outbound.sql locks them; one writer here).
SELECT id FROM relaybox_outbox
WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'pending'

-- name: delivery_kill_strays
-- delivery_kill_endpoint for the strays of endpoint ?1, with the ids it killed.
UPDATE relaybox_outbox SET status = 'dead', dead_reason = ?2, updated_at = ?3
WHERE id IN (SELECT value FROM json_each(?4)) AND endpoint_id = ?1 AND status = 'pending'
  AND (lease_until IS NULL OR lease_until <= ?3)
RETURNING id

-- name: delivery_attempts
SELECT a.outbox_id, o.endpoint_id, a.attempt, a.started_at, a.duration, a.outcome,
       a.status_code, a.error, a.response, a.headers
FROM relaybox_outbox_attempts a JOIN relaybox_outbox o ON o.id = a.outbox_id
WHERE o.message_id = ?1 AND (?2 IS NULL OR o.tenant = ?2)
ORDER BY a.id

-- name: event_type_upsert
INSERT INTO relaybox_event_types (name, description, schema, created_at, updated_at, subject)
VALUES (?1, ?2, ?3, ?4, ?4, ?5)
ON CONFLICT (name) DO UPDATE
SET description = excluded.description, schema = excluded.schema, updated_at = excluded.updated_at,
    subject = excluded.subject

-- name: event_type_list
SELECT name, description, schema, subject FROM relaybox_event_types ORDER BY name

-- name: api_key_insert
INSERT INTO relaybox_api_keys (id, tenant, name, key_hash, created_at) VALUES (?1, ?2, ?3, ?4, ?5)

-- name: api_key_lookup
SELECT id, tenant FROM relaybox_api_keys WHERE key_hash = ?1 AND revoked_at IS NULL

-- name: api_key_list
SELECT id, tenant, name, created_at, revoked_at FROM relaybox_api_keys
WHERE (?1 IS NULL OR tenant = ?1) ORDER BY created_at, id

-- name: api_key_revoke
UPDATE relaybox_api_keys SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL RETURNING id

-- name: outbox_lease_lanes
-- Lanes with due, unleased rows and room under their in-flight cap (at most ?4, the
-- dispatcher's concurrency: a cap stored above it is clamped) and rate limit, least
-- recently served first (round robin), with their endpoint's tenant. A lane at
-- capacity is not returned, so a hanging endpoint's backlog never fills a lease; nor
-- is a lane of a tenant in ?5 (the dispatcher holds all that tenant may have).
SELECT lane, max_in_flight, rate_limit, tokens, refilled_at, in_flight, tenant FROM (
    SELECT l.lane, l.max_in_flight, l.rate_limit, l.tokens, l.refilled_at, l.leased_at,
           e.tenant,
           (SELECT count(*) FROM relaybox_outbox f
            WHERE COALESCE(f.lane, f.channel) = l.lane AND f.status = 'pending'
              AND f.lease_until IS NOT NULL AND f.lease_until > ?1) AS in_flight
    FROM relaybox_lanes l
    LEFT JOIN relaybox_endpoints e ON e.id = l.lane
    WHERE ((e.id IS NULL AND l.lane IN (SELECT value FROM json_each(?3)))
           OR (e.status = 'enabled' AND e.paused_at IS NULL AND 'webhook' IN (SELECT value FROM json_each(?3))
               AND e.tenant NOT IN (SELECT value FROM json_each(?5))))
      AND (l.rate_limit IS NULL OR l.tokens + (?1 - l.refilled_at) * l.rate_limit >= 1)
      AND EXISTS (SELECT 1 FROM relaybox_outbox o
                  WHERE COALESCE(o.lane, o.channel) = l.lane AND o.status = 'pending'
                    AND o.next_attempt_at <= ?1
                    AND (o.lease_until IS NULL OR o.lease_until <= ?1)
                    AND (o.ordering_key IS NULL OR NOT EXISTS (
                        SELECT 1 FROM relaybox_outbox h
                        WHERE h.endpoint_id = o.endpoint_id
                          AND h.ordering_key = o.ordering_key
                          AND h.sequence < o.sequence AND h.status IN ('pending', 'dead')
                          AND (h.status = 'pending' OR e.on_dead = 'hold')))))
WHERE in_flight < min(max_in_flight, ?4)
ORDER BY leased_at, lane
LIMIT ?2

-- name: outbox_lease_rows
-- Lease up to ?5[i] due rows of lane ?4[i] (see outbox_lease in postgres_outbound.sql):
-- owner, fencing token + 1, lease end, attempt counted. SET reads the
-- row's values from before the update, so uncertain says "a lease expired unrecorded".
UPDATE relaybox_outbox
SET lease_owner = ?2, lease_token = COALESCE(lease_token, 0) + 1, lease_until = ?3,
    uncertain = (lease_until IS NOT NULL), attempts = attempts + 1, updated_at = ?1
WHERE id IN (
    SELECT id FROM (
        SELECT f.id, q.n,
               row_number() OVER (PARTITION BY q.lane ORDER BY f.next_attempt_at, f.id) AS rn
        FROM (SELECT l.value AS lane, n.value AS n
              FROM json_each(?4) AS l JOIN json_each(?5) AS n ON n.key = l.key) AS q
        JOIN relaybox_outbox f ON COALESCE(f.lane, f.channel) = q.lane
        WHERE f.status = 'pending' AND f.next_attempt_at <= ?1
          AND (f.lease_until IS NULL OR f.lease_until <= ?1)
          -- include: ordered_turn
        )
    WHERE rn <= n)
RETURNING id, channel, key, payload, tenant, lane, endpoint_id, message_id, attempts,
          lease_token, uncertain

-- name: lane_mark
UPDATE relaybox_lanes
SET leased_at = ?1, refilled_at = ?1,
    tokens = (SELECT t.value FROM json_each(?2) AS l JOIN json_each(?3) AS t ON t.key = l.key
              WHERE l.value = relaybox_lanes.lane)
WHERE lane IN (SELECT value FROM json_each(?2))

-- name: delivery_messages
SELECT id, event_type, body, sequence, traceparent FROM relaybox_messages
WHERE id IN (SELECT value FROM json_each(?1))

-- name: delivery_endpoints
SELECT id, tenant, url, signature, timeout, schedule, headers, credentials,
       failing_level, trace_context
FROM relaybox_endpoints
WHERE id IN (SELECT value FROM json_each(?1))

-- name: outbox_release
-- Leases never started (postgres_outbound.sql; the SQLite dispatcher does not lease
-- ahead, so only a stopping one could call it): the rows are due again, the lease's
-- attempt not counted; an uncertain row keeps an expired lease.
UPDATE relaybox_outbox
SET lease_owner = NULL,
    lease_until = CASE WHEN r.uncertain THEN 0 ELSE NULL END,
    attempts = attempts - CASE WHEN r.uncertain THEN 0 ELSE 1 END
FROM (SELECT i.value AS id, json_extract(?2, '$[' || i.key || ']') AS token,
             json_extract(?3, '$[' || i.key || ']') AS uncertain
      FROM json_each(?1) AS i) AS r
WHERE relaybox_outbox.id = r.id AND relaybox_outbox.lease_token = r.token
  AND relaybox_outbox.status = 'pending'

-- name: outbox_record
-- Group commit of outcomes (see postgres_outbound.sql): element i of the JSON arrays
-- ?2..?8 is one finished attempt, fenced on its lease token. Element i of each array
-- is read by its position (json_extract): joining one json_each per array on the key
-- had SQLite nest a loop per array, n^7 steps (a batch of 16 never finished).
UPDATE relaybox_outbox
SET status = u.status,
    dead_reason = CASE WHEN u.status = 'pending' THEN dead_reason ELSE u.reason END,
    next_attempt_at = CASE WHEN u.status = 'pending' THEN u.next_at ELSE next_attempt_at END,
    last_error = u.error, last_status = u.code, updated_at = ?1,
    sent_at = CASE WHEN u.status = 'sent' THEN ?1 ELSE sent_at END,
    lease_owner = NULL, lease_until = NULL
FROM (SELECT i.value AS id, json_extract(?3, '$[' || i.key || ']') AS token,
             json_extract(?4, '$[' || i.key || ']') AS status,
             json_extract(?5, '$[' || i.key || ']') AS next_at,
             json_extract(?6, '$[' || i.key || ']') AS reason,
             json_extract(?7, '$[' || i.key || ']') AS error,
             json_extract(?8, '$[' || i.key || ']') AS code
      FROM json_each(?2) AS i) AS u
WHERE relaybox_outbox.id = u.id AND relaybox_outbox.lease_token = u.token
  AND relaybox_outbox.status = 'pending'
RETURNING id, lease_token

-- name: outbox_attempts_insert
-- Element i of each array by its position, as in outbox_record (linear in the batch).
-- What the receiver answered, and the error text, is not kept for a delivery erased
-- meanwhile (an attempt recorded late, fenced, after an erasure emptied its row:
-- relaybox.erasure).
INSERT INTO relaybox_outbox_attempts
    (outbox_id, attempt, lease_token, dispatcher, started_at, duration, outcome, status_code,
     error, response, headers)
SELECT i.value, json_extract(?2, '$[' || i.key || ']'), json_extract(?3, '$[' || i.key || ']'),
       json_extract(?4, '$[' || i.key || ']'), json_extract(?5, '$[' || i.key || ']'),
       json_extract(?6, '$[' || i.key || ']'), json_extract(?7, '$[' || i.key || ']'),
       json_extract(?8, '$[' || i.key || ']'),
       CASE WHEN o.id IS NULL OR json_extract(?9, '$[' || i.key || ']') IS NULL
            THEN json_extract(?9, '$[' || i.key || ']') ELSE '(erased)' END,
       CASE WHEN o.id IS NULL THEN json_extract(?10, '$[' || i.key || ']') END,
       CASE WHEN o.id IS NULL THEN json_extract(?11, '$[' || i.key || ']') END
FROM json_each(?1) AS i
LEFT JOIN relaybox_outbox o ON o.id = i.value AND o.erased_at IS NOT NULL
ORDER BY i.key

-- name: endpoints_succeeded
-- Ends the failure streaks; notes the last success (?2) at most once a minute.
UPDATE relaybox_endpoints SET failing_since = NULL, failures = 0,
    last_success_at = COALESCE(?2, last_success_at)
WHERE id IN (SELECT value FROM json_each(?1))
  AND (failing_since IS NOT NULL
       OR (?2 IS NOT NULL AND (last_success_at IS NULL OR last_success_at < ?2 - 60)))

-- name: ops_attempt_minutes
SELECT CAST(started_at / 60 AS INTEGER) * 60 AS minute, outcome, count(*) AS n
FROM relaybox_outbox_attempts
WHERE started_at >= ?1
GROUP BY 1, 2
ORDER BY 1, 2
-- name: ordering_blocked_keys
-- See postgres_outbound.sql.
SELECT o.endpoint_id, e.tenant, o.ordering_key, min(o.sequence) AS sequence,
       count(*) AS dead,
       (SELECT count(*) FROM relaybox_outbox w
        WHERE w.endpoint_id = o.endpoint_id AND w.ordering_key = o.ordering_key
          AND w.status = 'pending') AS waiting
FROM relaybox_outbox o JOIN relaybox_endpoints e ON e.id = o.endpoint_id
WHERE o.ordering_key IS NOT NULL AND o.status = 'dead' AND e.on_dead = 'hold'
  AND (?1 IS NULL OR o.endpoint_id = ?1) AND (?2 IS NULL OR e.tenant = ?2)
GROUP BY o.endpoint_id, e.tenant, o.ordering_key
ORDER BY o.endpoint_id, o.ordering_key
LIMIT ?3

-- name: ordering_key_release
UPDATE relaybox_outbox SET ordering_key = NULL, updated_at = ?3
WHERE endpoint_id = ?1 AND ordering_key = ?2 AND status = 'dead'
RETURNING id

-- name: ordering_blocked_count
-- How many (endpoint, key) pairs dead deliveries hold (the blocked-keys gauge).
SELECT count(*) AS n FROM (
    SELECT DISTINCT o.endpoint_id, o.ordering_key
    FROM relaybox_outbox o JOIN relaybox_endpoints e ON e.id = o.endpoint_id
    WHERE o.ordering_key IS NOT NULL AND o.status = 'dead' AND e.on_dead = 'hold') k

-- name: ordering_clear
-- An endpoint no longer ordered: its waiting and dead deliveries drop their keys, so
-- nothing holds them back any more.
UPDATE relaybox_outbox SET ordering_key = NULL
WHERE endpoint_id = ?1 AND ordering_key IS NOT NULL AND status IN ('pending', 'dead')

-- name: replay_job_active
SELECT id FROM relaybox_replay_jobs
WHERE endpoint_id = ?1 AND status IN ('queued', 'running')

-- name: replay_job_recent
SELECT count(*), min(created_at) FROM relaybox_replay_jobs
WHERE tenant = ?1 AND created_at > ?2

-- name: replay_job_insert
INSERT INTO relaybox_replay_jobs
    (id, tenant, endpoint_id, since, until_at, max_queued, status, created_at, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'queued', ?7, ?7)
ON CONFLICT DO NOTHING
RETURNING id, tenant, endpoint_id, since, until_at, max_queued, status, scanned, queued, cursor_at,
       cursor_id, resume_since, error, created_at, started_at, finished_at

-- name: replay_job_get
SELECT id, tenant, endpoint_id, since, until_at, max_queued, status, scanned, queued, cursor_at,
       cursor_id, resume_since, error, created_at, started_at, finished_at
FROM relaybox_replay_jobs WHERE id = ?1 AND (?2 IS NULL OR tenant = ?2)

-- name: replay_job_claim
-- One writer at a time (BEGIN IMMEDIATE): the lease is checked and taken at once.
UPDATE relaybox_replay_jobs
SET status = 'running', lease_owner = ?1, lease_until = ?2 + ?3,
    started_at = coalesce(started_at, ?2), updated_at = ?2
WHERE id = (
    SELECT id FROM relaybox_replay_jobs
    WHERE status IN ('queued', 'running') AND (lease_until IS NULL OR lease_until <= ?2)
      AND (?4 IS NULL OR id = ?4)
    ORDER BY created_at, id LIMIT 1
)
RETURNING id, tenant, endpoint_id, since, until_at, max_queued, status, scanned, queued, cursor_at,
       cursor_id, resume_since, error, created_at, started_at, finished_at

-- name: replay_job_advance
UPDATE relaybox_replay_jobs
SET scanned = scanned + ?3, queued = queued + ?4, cursor_at = ?5, cursor_id = ?6,
    lease_until = ?7 + ?8, updated_at = ?7
WHERE id = ?1 AND lease_owner = ?2 AND status = 'running'
RETURNING scanned, queued

-- name: replay_job_finish
UPDATE relaybox_replay_jobs
SET status = ?3, error = ?4, resume_since = ?5, finished_at = ?6, updated_at = ?6,
    lease_owner = NULL, lease_until = NULL
WHERE id = ?1 AND lease_owner = ?2 AND status = 'running'
RETURNING id

-- name: replay_job_release
UPDATE relaybox_replay_jobs SET lease_owner = NULL, lease_until = NULL, updated_at = ?3
WHERE id = ?1 AND lease_owner = ?2 AND status = 'running'

-- name: replay_job_latest
SELECT id, tenant, endpoint_id, since, until_at, max_queued, status, scanned, queued, cursor_at,
       cursor_id, resume_since, error, created_at, started_at, finished_at
FROM relaybox_replay_jobs WHERE endpoint_id = ?1 ORDER BY created_at DESC, id DESC LIMIT 1

-- name: replay_jobs_purge
DELETE FROM relaybox_replay_jobs
WHERE id IN (SELECT id FROM relaybox_replay_jobs
             WHERE status IN ('done', 'failed') AND finished_at < ?1 LIMIT ?2)
RETURNING id
