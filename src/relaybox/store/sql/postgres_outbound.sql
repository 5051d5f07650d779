-- Named queries of the sending side (PostgreSQL). Parameters are asyncpg's $n; lists
-- are arrays. The same names, with the same parameters in the same order, are in
-- sqlite_outbound.sql.

-- name: endpoint_insert
INSERT INTO relaybox_endpoints
    (id, tenant, url, description, event_types, status, signature, timeout, schedule,
     created_at, updated_at, payload_filter, ordered, on_dead, trace_context)
VALUES ($1, $2, $3, $4, $5, 'enabled', $6, $7, $8, $9, $9, $10, $11, $12, $13)

-- name: endpoint_quota_lock
-- Creating an endpoint or changing its payload filter: one at a time per tenant (a
-- transaction-scoped advisory lock on the tenant), so that endpoint_count and
-- endpoint_filters, statements after it with their own snapshots, see every endpoint
-- committed before, and the quota and the tenant's filter cost hold.
SELECT pg_advisory_xact_lock(hashtextextended('relaybox.endpoints:' || $1::text, 0))

-- name: endpoint_count
-- The tenant's endpoints (relaybox_endpoints_tenant index).
SELECT count(*)::int AS n FROM relaybox_endpoints WHERE tenant = $1

-- name: endpoint_filters
-- The payload filters of tenant $1's endpoints other than $2, whatever their status:
-- what a filter saved on $2 adds to (filter_tenant_max_cost).
SELECT payload_filter FROM relaybox_endpoints
WHERE tenant = $1 AND id <> $2 AND payload_filter IS NOT NULL
ORDER BY id

-- name: endpoint_update
-- Every mutable field at once: the caller merged the patch into the current row.
UPDATE relaybox_endpoints
SET url = $3, description = $4, event_types = $5, signature = $6, timeout = $7,
    schedule = $8, updated_at = $9, payload_filter = $10, ordered = $11, on_dead = $12,
    trace_context = $13
WHERE id = $1 AND tenant = $2
RETURNING id

-- name: endpoint_get
-- One endpoint with its lane settings; $2 NULL reads any tenant (operators).
-- include: endpoint_row
WHERE e.id = $1 AND ($2::text IS NULL OR e.tenant = $2)

-- name: endpoint_list
-- include: endpoint_row
WHERE ($1::text IS NULL OR e.tenant = $1)
ORDER BY e.created_at, e.id
LIMIT $2

-- name: endpoint_delete
DELETE FROM relaybox_endpoints WHERE id = $1 AND tenant = $2 RETURNING id

-- name: publish_context
-- What a publish reads, in one round trip (in the publisher's own transaction): the
-- catalog's schema and subject path of the event type $2 (a row with a NULL id and
-- the path in the second column, when it has either) and the endpoints of tenant $1
-- it fans out to (id, event type patterns, payload filter), by id.
SELECT NULL::text AS id, subject AS event_types, NULL::text AS payload_filter, schema
FROM relaybox_event_types
WHERE name = $2 AND (schema IS NOT NULL AND schema <> '' OR subject IS NOT NULL)
UNION ALL
SELECT id, event_types, payload_filter, NULL FROM relaybox_endpoints
WHERE tenant = $1 AND status = 'enabled'
ORDER BY id NULLS FIRST

-- name: endpoint_set_status
-- Enabling clears the failure streak: the disable clock starts again.
UPDATE relaybox_endpoints
SET status = $2, disabled_reason = $3, updated_at = $4,
    failing_since = CASE WHEN $2 = 'enabled' THEN NULL ELSE failing_since END,
    failures = CASE WHEN $2 = 'enabled' THEN 0 ELSE failures END,
    failing_level = CASE WHEN $2 = 'enabled' THEN 0 ELSE failing_level END
WHERE id = $1 AND status <> $2
RETURNING id, tenant, url, failing_since

-- name: endpoint_failed
-- Starts the failure streak at the first failure after a success.
UPDATE relaybox_endpoints
SET failing_since = COALESCE(failing_since, $2), failures = failures + 1
WHERE id = $1
RETURNING status, failing_since, failures, failing_level

-- name: endpoint_succeeded
-- As endpoints_succeeded, for one endpoint.
UPDATE relaybox_endpoints SET failing_since = NULL, failures = 0,
    last_success_at = COALESCE($2::double precision, last_success_at)
WHERE id = $1
  AND (failing_since IS NOT NULL
       OR ($2::double precision IS NOT NULL
           AND (last_success_at IS NULL OR last_success_at < $2::double precision - 60)))

-- name: endpoint_secret_insert
INSERT INTO relaybox_endpoint_secrets (endpoint_id, secret, created_at) VALUES ($1, $2, $3)

-- name: endpoint_secret_expire
-- Rotation: every secret still active keeps signing until $2, no longer.
UPDATE relaybox_endpoint_secrets SET expires_at = $2
WHERE endpoint_id = $1 AND (expires_at IS NULL OR expires_at > $2)

-- name: endpoint_secrets_active
-- Newest first: the order in which they sign.
SELECT endpoint_id, secret, created_at, expires_at FROM relaybox_endpoint_secrets
WHERE endpoint_id = ANY($1::text[]) AND (expires_at IS NULL OR expires_at > $2)
ORDER BY endpoint_id, id DESC

-- name: endpoint_secrets_reveal
-- The endpoint's active secrets never shown in the portal, marked shown at $2: each
-- is revealed once, whoever asks at the same time.
UPDATE relaybox_endpoint_secrets SET revealed_at = $2
WHERE endpoint_id = $1 AND revealed_at IS NULL AND (expires_at IS NULL OR expires_at > $2)
RETURNING endpoint_id, secret, created_at, expires_at

-- name: endpoint_secrets_page
-- Up to $2 stored secrets after id $1 (expired ones too), in id order: the sealing
-- passes (relaybox migrate, relaybox endpoints seal-secrets) and doctor walk the table
-- in pages, each in a short transaction of its own.
SELECT id, secret FROM relaybox_endpoint_secrets WHERE id > $1 ORDER BY id LIMIT $2

-- name: endpoint_secrets_plaintext_page
-- Like endpoint_secrets_page, only the secrets stored in plaintext (by versions that
-- did not seal them): what relaybox migrate seals.
SELECT id, secret FROM relaybox_endpoint_secrets
WHERE id > $1 AND secret NOT LIKE 'fernet:%' ORDER BY id LIMIT $2

-- name: endpoint_secret_sealed_any
-- Whether any stored secret is sealed: a key file that is missing while one is means
-- the key was lost, and relaybox makes no new one then (see outbound/vault.py).
SELECT 1 AS found FROM relaybox_endpoint_secrets WHERE secret LIKE 'fernet:%' LIMIT 1

-- name: endpoint_secret_swap
-- Compare-and-set: the stored value becomes $3 only while it is still $2, so that
-- processes sealing at once never undo each other's work (the later one updates
-- nothing and returns no row).
UPDATE relaybox_endpoint_secrets SET secret = $3 WHERE id = $1 AND secret = $2 RETURNING id

-- name: lane_upsert
-- Lane settings come from the endpoint (API) or the channel (code); flow state stays.
INSERT INTO relaybox_lanes (lane, max_in_flight, rate_limit) VALUES ($1, $2, $3)
ON CONFLICT (lane) DO UPDATE
SET max_in_flight = excluded.max_in_flight, rate_limit = excluded.rate_limit

-- name: lane_delete
DELETE FROM relaybox_lanes WHERE lane = $1

-- name: message_key_insert
-- A message's idempotency key ($1: its digest as bytea, stored as uuid; $2: the tenant's scope, $3: the
-- publish time, $4, $5: the message id as relaybox.store.keys.message_ref stores it,
-- its 16 bytes or its text), in the publisher's transaction: the primary key decides
-- which publish is first, whether or not the first message still exists.
INSERT INTO relaybox_message_keys (scope, first_seen, digest, message_uuid, message_text)
VALUES ($2::integer, floor($3::double precision / 86400)::integer, encode($1::bytea, 'hex')::uuid,
        encode($4::bytea, 'hex')::uuid, $5::text)
ON CONFLICT DO NOTHING
RETURNING 1

-- name: message_insert
-- After message_key_insert (when the message has a key): the message itself.
INSERT INTO relaybox_messages
    (id, tenant, event_type, idempotency_key, body, created_at, ordering_key, sequence,
     traceparent)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT DO NOTHING
RETURNING id

-- name: message_key_adopt
-- message_insert inserted nothing after message_key_insert: the messages' old UNIQUE
-- (tenant, idempotency_key) found a message stored before the keys table had its key
-- ($1: the digest, $2, $3: tenant and key). The key names that message (its id
-- stored as message_key_insert stores one).
UPDATE relaybox_message_keys
SET message_uuid = relaybox_message_uuid(m.id),
    message_text = CASE WHEN relaybox_message_uuid(m.id) IS NULL THEN m.id END
FROM relaybox_messages m
WHERE m.tenant = $2 AND m.idempotency_key = $3
  AND relaybox_message_keys.digest = encode($1::bytea, 'hex')::uuid
  AND EXISTS (SELECT 1 FROM relaybox_messages m
              WHERE m.tenant = $2 AND m.idempotency_key = $3)

-- name: message_get_by_key
-- The message published under an idempotency key ($1: its digest; $2, $3: the
-- tenant and the key): the keys table names it, with the day it was first seen; its
-- columns are NULL when the message row is gone (its history dropped). Until the
-- backfill of message keys has finished, a message stored before the keys table
-- existed is found by its old (tenant, idempotency_key) key.
SELECT k.id, m.tenant, m.event_type, m.idempotency_key, m.body,
       m.created_at, m.ordering_key, m.sequence, k.first_seen
FROM (SELECT coalesce(message_text,
                      'msg_' || substr(replace(message_uuid::text, '-', ''), 6)) AS id,
             first_seen
      FROM relaybox_message_keys WHERE digest = encode($1::bytea, 'hex')::uuid) k
LEFT JOIN relaybox_messages m ON m.id = k.id
UNION ALL
SELECT m.id, m.tenant, m.event_type, m.idempotency_key, m.body, m.created_at,
       m.ordering_key, m.sequence, NULL
FROM relaybox_messages m
WHERE m.tenant = $2 AND m.idempotency_key = $3
  AND NOT EXISTS (SELECT 1 FROM relaybox_keys_backfill b
                  WHERE b.kind = 'message' AND b.finished_at IS NOT NULL)
  AND NOT EXISTS (SELECT 1 FROM relaybox_message_keys k
                  WHERE k.digest = encode($1::bytea, 'hex')::uuid)

-- name: message_get
SELECT id, tenant, event_type, idempotency_key, body, created_at, ordering_key, sequence
FROM relaybox_messages
WHERE id = $1 AND ($2::text IS NULL OR tenant = $2)

-- name: message_list
-- Newest first, keyset-paginated on (created_at, id) below $3/$4; $6: one
-- idempotency key, matched exactly.
SELECT id, tenant, event_type, idempotency_key, body, created_at, ordering_key, sequence
FROM relaybox_messages
WHERE ($1::text IS NULL OR tenant = $1) AND ($2::text IS NULL OR event_type = $2)
  AND ($3::double precision IS NULL OR (created_at, id) < ($3, $4::text))
  AND ($6::text IS NULL OR idempotency_key = $6)
ORDER BY created_at DESC, id DESC
LIMIT $5

-- name: message_sequence_next
-- The next sequence number of (tenant $1, ordering key $2). The upsert's row lock is
-- held until the publisher's transaction ends: a concurrent publish with the same key
-- waits here, then takes the next number, so numbers increase in commit order.
INSERT INTO relaybox_outbound_sequences (tenant, ordering_key, last_sequence)
VALUES ($1, $2, 1)
ON CONFLICT (tenant, ordering_key) DO UPDATE
SET last_sequence = relaybox_outbound_sequences.last_sequence + 1
RETURNING last_sequence

-- name: delivery_insert
-- One outbox row per subscribed endpoint, in the publisher's transaction. The lane
-- is the endpoint, so each endpoint has its own in-flight cap and rate limit. A keyed
-- message ($5, $6) gives its key and sequence to the rows of ordered endpoints only
-- (the endpoint is read only when there is a key). Each row's key (channel, message
-- id ':' endpoint id) goes first into relaybox_delivery_keys (migration 0037), with
-- its message's day: it lives as long as the message (as outbox_insert's otherwise).
WITH r AS (
    SELECT DISTINCT ON (e.id) e.id, e.ord,
           relaybox_outbox_digest('webhook', $1::text || ':' || e.id) AS digest
    FROM unnest($4::text[]) WITH ORDINALITY AS e(id, ord)
    ORDER BY e.id, e.ord
), k AS (
    INSERT INTO relaybox_delivery_keys (day, digest)
    SELECT relaybox_message_day($1::text), digest FROM r
    ON CONFLICT DO NOTHING
    RETURNING digest
)
INSERT INTO relaybox_outbox
    (channel, key, payload, tenant, status, next_attempt_at, created_at, updated_at,
     lane, endpoint_id, message_id, ordering_key, sequence)
SELECT 'webhook', $1::text || ':' || e.id, 'null', $2::text, 'pending', $3::double precision,
       $3::double precision, $3::double precision, e.id, e.id, $1::text,
       CASE WHEN o.ordered THEN $5::text END, CASE WHEN o.ordered THEN $6::bigint END
FROM r e JOIN k ON k.digest = e.digest
CROSS JOIN LATERAL (
    SELECT CASE WHEN $5::text IS NULL THEN false
                ELSE (SELECT x.ordered FROM relaybox_endpoints x WHERE x.id = e.id) END
               AS ordered) o
ORDER BY e.ord
ON CONFLICT DO NOTHING
RETURNING id

-- name: delivery_list
-- Deliveries of one message, or the undelivered ones (not sent) of a tenant or an
-- endpoint. Any NULL parameter does not filter. ``broker``: the destination of an
-- endpoint routed to one (``broker:<name>``), which its deliveries go out through.
-- A row under a lease has its attempt, counted before it was sent, in the lease.
SELECT o.id, o.message_id, o.endpoint_id, o.channel, o.key, o.tenant, o.status, o.dead_reason,
       COALESCE(l.attempt, o.attempts) AS attempts, o.next_attempt_at, o.last_error,
       o.last_status, o.created_at, o.updated_at, o.sent_at, m.event_type,
       CASE WHEN e.url LIKE 'broker:%' THEN substr(e.url, 8) END AS broker
FROM relaybox_outbox o LEFT JOIN relaybox_messages m ON m.id = o.message_id
LEFT JOIN relaybox_endpoints e ON e.id = o.endpoint_id
LEFT JOIN relaybox_outbox_leases l ON l.outbox_id = o.id
WHERE ($1::text IS NULL OR o.tenant = $1) AND ($2::text IS NULL OR o.message_id = $2)
  AND ($3::text IS NULL OR o.endpoint_id = $3)
  AND (NOT $4::boolean OR o.status <> 'sent')
ORDER BY o.created_at DESC, o.id DESC
LIMIT $5

-- name: delivery_log_list
-- The delivery log: outbox rows newest first, each filter applied when not NULL
-- (status, event type, message id, idempotency key, created in [since, until)).
SELECT o.id, o.message_id, o.endpoint_id, o.channel, o.key, o.tenant, o.status, o.dead_reason,
       COALESCE(l.attempt, o.attempts) AS attempts, o.next_attempt_at, o.last_error,
       o.last_status, o.created_at, o.updated_at, o.sent_at, m.event_type
FROM relaybox_outbox o LEFT JOIN relaybox_messages m ON m.id = o.message_id
LEFT JOIN relaybox_outbox_leases l ON l.outbox_id = o.id
WHERE ($1::text IS NULL OR o.tenant = $1) AND ($2::text IS NULL OR o.status = $2)
  AND ($3::text IS NULL OR m.event_type = $3) AND ($4::text IS NULL OR o.message_id = $4)
  AND ($5::text IS NULL OR m.idempotency_key = $5)
  AND ($6::double precision IS NULL OR o.created_at >= $6)
  AND ($7::double precision IS NULL OR o.created_at < $7)
ORDER BY o.created_at DESC, o.id DESC
LIMIT $8

-- name: delivery_redeliver
-- A finished delivery (sent, dead or held) of the message goes back to pending with
-- a fresh attempt budget and the same webhook-id; pending rows are already on their
-- way. Only to endpoints still enabled, never a row retention purged (its bytes are gone).
WITH again AS (
    UPDATE relaybox_outbox o
    SET status = 'pending', dead_reason = NULL, attempts = 0, next_attempt_at = $4,
        sent_at = NULL, updated_at = $4
    FROM relaybox_endpoints e
    WHERE e.id = o.endpoint_id AND e.status = 'enabled' AND o.message_id = $1
      AND ($2::text IS NULL OR o.tenant = $2) AND ($3::text IS NULL OR o.endpoint_id = $3)
      AND o.status IN ('sent', 'dead', 'held') AND o.purged_at IS NULL
    RETURNING o.id
), stale AS (
    -- A finished row has no lease; should one be left, it must not make the next
    -- attempt look uncertain.
    DELETE FROM relaybox_outbox_leases WHERE outbox_id IN (SELECT id FROM again)
)
SELECT id FROM again

-- name: delivery_recover
-- Recover: every dead delivery of an endpoint created since $2 (until $3) is retried,
-- unless retention purged it.
WITH again AS (
    UPDATE relaybox_outbox
    SET status = 'pending', dead_reason = NULL, attempts = 0, next_attempt_at = $4,
        updated_at = $4
    WHERE endpoint_id = $1 AND status = 'dead' AND purged_at IS NULL AND created_at >= $2
      AND ($3::double precision IS NULL OR created_at < $3)
    RETURNING id
), stale AS (
    DELETE FROM relaybox_outbox_leases WHERE outbox_id IN (SELECT id FROM again)
)
SELECT id FROM again

-- name: endpoint_pause
-- Pause ($3: when) or resume ($3 NULL) the endpoint; $2 NULL: of any tenant. Returns
-- the row only when this call changed it (pausing a paused endpoint changes nothing).
-- A resume ends the failure streak: the paused time is not failing time, and the first
-- failure after it must not disable the endpoint for a streak it never ran.
UPDATE relaybox_endpoints
SET paused_at = $3::double precision, updated_at = $4,
    failing_since = CASE WHEN $3::double precision IS NULL THEN NULL ELSE failing_since END
WHERE id = $1 AND ($2::text IS NULL OR tenant = $2)
  AND (paused_at IS NULL) <> ($3::double precision IS NULL)
RETURNING id, tenant

-- name: message_missing_page
-- Replay missing, one page: the tenant's messages published from $3 to $7, after the
-- keyset ($4, $5) (created_at, id), oldest first, whose body is still there and that
-- have no delivery to endpoint $2 (the delivery key is message id ':' endpoint id:
-- a probe of relaybox_delivery_keys per message, by its day and digest, which
-- remembers a delivery whose outbox partition was dropped; of relaybox_outbox_keys,
-- which holds the delivery keys written before migration 0037; and of the message's
-- deliveries, for a row stored before migration 0034 whose key the backfill has not
-- copied yet).
SELECT m.id, m.event_type, m.body, m.created_at FROM relaybox_messages m
WHERE m.tenant = $1 AND m.created_at >= $3 AND m.created_at <= $7 AND m.purged_at IS NULL
  AND ($4::double precision IS NULL OR (m.created_at, m.id) > ($4, $5::text))
  AND NOT EXISTS (SELECT 1 FROM relaybox_delivery_keys k
                  WHERE k.day = relaybox_message_day(m.id)
                    AND k.digest = relaybox_outbox_digest('webhook', m.id || ':' || $2::text))
  AND NOT EXISTS (SELECT 1 FROM relaybox_outbox_keys k
                  WHERE k.digest = relaybox_outbox_digest('webhook', m.id || ':' || $2::text))
  AND NOT EXISTS (SELECT 1 FROM relaybox_outbox o
                  WHERE o.message_id = m.id AND o.endpoint_id = $2::text)
ORDER BY m.created_at, m.id
LIMIT $6

-- name: delivery_insert_missing
-- Replay missing, the deliveries: one pending row to endpoint $1 per message of $4,
-- in that order (publish order), unless the message has one already (its key in
-- relaybox_delivery_keys: two replays at once insert each row once, the later one
-- waits for the earlier one's COMMIT and skips it; or, written before migration 0037,
-- in relaybox_outbox_keys, which gets no new delivery key) or retention emptied its
-- body meanwhile (the messages are locked FOR KEY SHARE, which ops_purge_messages'
-- FOR UPDATE SKIP LOCKED passes by).
WITH m AS (
    SELECT m.id, array_position($4::text[], m.id) AS ord,
           relaybox_outbox_digest('webhook', m.id || ':' || $1::text) AS digest
    FROM relaybox_messages m
    WHERE m.id = ANY ($4::text[]) AND m.tenant = $2 AND m.purged_at IS NULL
    FOR KEY SHARE OF m
), k AS (
    INSERT INTO relaybox_delivery_keys (day, digest)
    SELECT relaybox_message_day(m.id), m.digest FROM m
    WHERE NOT EXISTS (SELECT 1 FROM relaybox_outbox_keys o WHERE o.digest = m.digest)
    ON CONFLICT DO NOTHING
    RETURNING digest
)
INSERT INTO relaybox_outbox
    (channel, key, payload, tenant, status, next_attempt_at, created_at, updated_at,
     lane, endpoint_id, message_id)
SELECT 'webhook', m.id || ':' || $1::text, 'null', $2::text, 'pending', $3::double precision,
       $3::double precision, $3::double precision, $1::text, $1::text, m.id
FROM m JOIN k ON k.digest = m.digest ORDER BY m.ord
ON CONFLICT DO NOTHING
RETURNING id

-- name: endpoint_paused_backlog
-- Per paused endpoint, its deliveries waiting for the resume (the metrics' gauge).
SELECT e.id, count(o.id) AS waiting FROM relaybox_endpoints e
LEFT JOIN relaybox_outbox o ON o.endpoint_id = e.id AND o.status = 'pending'
WHERE e.paused_at IS NOT NULL
GROUP BY e.id

-- name: delivery_lock_endpoint
-- An endpoint disabled or deleted, first step: lock its waiting rows, except those a
-- dispatcher holds (leasing or recording them: SKIP LOCKED, no lock-order deadlock).
-- A lease does not change the outbox row (it holds its lock until it commits), so the
-- next statement, with a snapshot taken after these locks, sees every lease of them.
SELECT id FROM relaybox_outbox
WHERE endpoint_id = $1 AND status = 'pending'
FOR NO KEY UPDATE SKIP LOCKED

-- part: delivery_kill
-- The locked rows $4 of endpoint $1 go to dead letters (recoverable, reason $2, at
-- $3), except those under a live lease, left to their dispatcher: killed, their ids.
WITH killed AS (
    UPDATE relaybox_outbox SET status = 'dead', dead_reason = $2, updated_at = $3
    WHERE id = ANY ($4::bigint[]) AND endpoint_id = $1 AND status = 'pending'
      AND NOT EXISTS (SELECT 1 FROM relaybox_outbox_leases l
                      WHERE l.outbox_id = relaybox_outbox.id AND l.until > $3)
    RETURNING id
)

-- name: delivery_kill_endpoint
-- Second step: the rows locked ($4) go to dead letters (delivery_kill); an expired
-- lease of a killed row goes.
-- include: delivery_kill
DELETE FROM relaybox_outbox_leases WHERE outbox_id IN (SELECT id FROM killed)

-- name: delivery_strays
-- Waiting rows of disabled endpoints ($2 at most) that no live lease holds: the rows
-- disabling could not kill (in flight then, their attempt since retried or their
-- dispatcher dead; published by a transaction that committed after it). Found per
-- disabled endpoint through its lane's partial index of pending rows (the lane is the
-- endpoint), so the cost follows the strays, not the history. The endpoints are locked
-- FOR SHARE: switching one back on waits for this transaction.
SELECT o.id, e.id
FROM relaybox_endpoints e
CROSS JOIN LATERAL (
    SELECT o.id FROM relaybox_outbox o
    WHERE coalesce(o.lane, o.channel) = e.id AND o.status = 'pending' AND o.endpoint_id = e.id
      AND NOT EXISTS (SELECT 1 FROM relaybox_outbox_leases l
                      WHERE l.outbox_id = o.id AND l.until > $1)
    LIMIT $2
) o
WHERE e.status = 'disabled'
LIMIT $2
FOR SHARE OF e

-- name: delivery_lock_ids
-- Those rows, locked (SKIP LOCKED: a dispatcher leasing or recording one keeps it).
SELECT id FROM relaybox_outbox
WHERE id = ANY ($1::bigint[]) AND status = 'pending'
FOR NO KEY UPDATE SKIP LOCKED

-- name: delivery_kill_strays
-- delivery_kill_endpoint for the strays of endpoint $1 ($4: their locked ids), with
-- the ids it killed.
-- include: delivery_kill
, gone AS (
    DELETE FROM relaybox_outbox_leases WHERE outbox_id IN (SELECT id FROM killed)
)
SELECT id FROM killed

-- name: delivery_attempts
SELECT a.outbox_id, o.endpoint_id, a.attempt, a.started_at, a.duration, a.outcome,
       a.status_code, a.error, a.response, a.headers
FROM relaybox_outbox_attempts a JOIN relaybox_outbox o ON o.id = a.outbox_id
WHERE o.message_id = $1 AND ($2::text IS NULL OR o.tenant = $2)
ORDER BY a.id

-- name: event_type_upsert
INSERT INTO relaybox_event_types (name, description, schema, created_at, updated_at, subject)
VALUES ($1, $2, $3, $4, $4, $5)
ON CONFLICT (name) DO UPDATE
SET description = excluded.description, schema = excluded.schema, updated_at = excluded.updated_at,
    subject = excluded.subject

-- name: event_type_list
SELECT name, description, schema, subject FROM relaybox_event_types ORDER BY name

-- name: api_key_insert
INSERT INTO relaybox_api_keys (id, tenant, name, key_hash, created_at) VALUES ($1, $2, $3, $4, $5)

-- name: api_key_lookup
SELECT id, tenant FROM relaybox_api_keys WHERE key_hash = $1 AND revoked_at IS NULL

-- name: api_key_list
SELECT id, tenant, name, created_at, revoked_at FROM relaybox_api_keys
WHERE ($1::text IS NULL OR tenant = $1) ORDER BY created_at, id

-- name: api_key_revoke
UPDATE relaybox_api_keys SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL RETURNING id

-- name: outbox_lease
-- The whole lease in ONE autocommit statement (one round trip, no BEGIN/COMMIT); SQLite
-- runs the same steps one by one (sqlite_outbound.sql: outbox_lease_lanes, allocate()
-- in store/dispatch_rows.py, outbox_lease_rows, lane_mark, then delivery_messages,
-- endpoint_secrets_active, delivery_endpoints). $1 now, $2 free slots, $3 the
-- dispatcher's channels, $4 owner, $5 lease end ($2 = 0: only record); $6..$14 the
-- plain successes to record first (id, lease token, attempt, endpoint, started,
-- duration, status code, error, response; empty arrays when none): a finished
-- attempt's slot goes into the lease that records it, no round trip in between; $15
-- the channels that may lease ahead (see locked), $16 how many times its cap; $17 the
-- dispatcher's concurrency, which bounds every lane's cap (a cap stored above it is
-- clamped); $18 rows one tenant's lanes may take in this lease, unless $19 (tenants)
-- / $20 (rows each) say otherwise: what the dispatcher already holds of them counted
-- (tenant fairness, Dispatcher.run). A tenant with no rows left is not locked at all.
-- $21: the successes' recorded headers (JSON text, element i of $6..$14).
-- A lease is a row of relaybox_outbox_leases (migration 0011 says why), not a change
-- of the outbox row; the outbox row is written once, by the record.
-- freed: the successes' leases, fenced per row (only the holder of the lease token);
--   done: their outbox rows marked sent, with the attempt and token their lease had
--   (element i of $6..$14 by array_position: no join, whose generic plan had been a
--   nested loop over every pair of rows); logged: the attempt log, 'fenced' where the
--   token no longer matched, in array order; healthy: the answering endpoints' failure
--   streaks cleared. One statement has one snapshot, in which the leases freed deletes
--   are still there: busy does not count them, picked does not take their rows.
-- locked: lanes with due rows and room, least recently served first, locked SKIP
--   LOCKED (two leases never take one lane at once); lanes: minus those another
--   lease served since this statement's snapshot (no cap overshoot); room = free
--   in-flight slots (live leases), and with a rate limit at most the whole tokens in the
--   bucket refilled to now (it holds at most 1 s of the rate, at least 1 token):
--   Lane.room(). Leasing ahead ($15: the channels whose uncertain policy is resend):
--   a lane without a rate limit, in which no other dispatcher holds a live lease, may
--   have twice its cap leased, so that the dispatcher starts the next row the moment
--   an attempt ends; it still runs at most cap minus the others' leases at once
--   (allowed, returned with each row: Dispatcher.run).
-- plan: allocate() in SQL: the free slots shared round robin within each lane's
--   room and each tenant's rows: a tenant's turns count its lanes' rounds (one per
--   lane per round, lane order), and turns go tenant by tenant, so that one tenant's
--   lanes never fill the lease while another's wait (a channel's lane is a tenant of
--   its own, without a tenant bound); picked: that many due rows per lane
--   without a live lease, oldest first, locked SKIP LOCKED (delivery_lock_endpoint
--   waits for nothing of ours), each with its expired lease if it has one (uncertain:
--   its dispatcher died before recording; that attempt was counted).
-- leased: the leases (owner, fencing token + 1, lease end, attempt + 1) replacing the
--   expired ones. marked: served lanes to the back of the round robin, buckets debited
--   by the rows taken.
-- The rows come back with their message body and endpoint (its active secrets newest
-- first: the order in which they sign; one lookup per endpoint), by id.
WITH u AS (
    SELECT * FROM unnest($6::bigint[], $7::bigint[], $8::int[], $9::text[],
                         $10::double precision[], $11::double precision[], $12::int[],
                         $13::text[], $14::text[], $21::text[])
        WITH ORDINALITY AS u(id, token, attempt, endpoint, started, duration, code, error,
                             response, headers, ord)
), freed AS (
    -- By primary key (bounded like done below): a lease row lives for one attempt, so
    -- between two vacuums the table holds many dead ones, which a scan would read.
    DELETE FROM relaybox_outbox_leases l
    WHERE l.outbox_id = ANY ($6::bigint[])
      AND l.outbox_id BETWEEN (SELECT min(id) FROM u) AND (SELECT max(id) FROM u)
      AND l.token = ($7::bigint[])[array_position($6::bigint[], l.outbox_id)]
    RETURNING l.outbox_id
), done AS (
    -- Primary-key probes whatever the statistics said when the generic plan was made
    -- (tests/test_plans.py). "Not sent, dead or held" is "pending" (the status CHECK)
    -- but matches no pending-only partial index, so the ids decide the path.
    UPDATE relaybox_outbox o
    SET status = 'sent', dead_reason = NULL,
        attempts = ($8::int[])[array_position($6::bigint[], o.id)],
        lease_token = ($7::bigint[])[array_position($6::bigint[], o.id)],
        last_error = ($13::text[])[array_position($6::bigint[], o.id)],
        last_status = ($12::int[])[array_position($6::bigint[], o.id)],
        updated_at = $1, sent_at = $1
    WHERE o.id = ANY (ARRAY(SELECT outbox_id FROM freed))
      AND o.id BETWEEN (SELECT min(outbox_id) FROM freed) AND (SELECT max(outbox_id) FROM freed)
      AND o.status NOT IN ('sent', 'dead', 'held')
    RETURNING o.id, o.lease_token
), logged AS (
    INSERT INTO relaybox_outbox_attempts
        (outbox_id, attempt, lease_token, dispatcher, started_at, duration, outcome,
         status_code, error, response, headers)
    -- A fenced success's answer (and error text) is not kept for a delivery erased
    -- meanwhile.
    SELECT u.id, u.attempt, u.token, $4, u.started, u.duration,
           CASE WHEN d.id IS NULL THEN 'fenced' ELSE 'sent' END, u.code,
           CASE WHEN u.error IS NULL OR d.id IS NOT NULL
                     OR (SELECT x.erased_at FROM relaybox_outbox x WHERE x.id = u.id) IS NULL
               THEN u.error ELSE '(erased)' END,
           CASE WHEN d.id IS NOT NULL
                     OR (SELECT x.erased_at FROM relaybox_outbox x WHERE x.id = u.id) IS NULL
               THEN u.response END,
           CASE WHEN d.id IS NOT NULL
                     OR (SELECT x.erased_at FROM relaybox_outbox x WHERE x.id = u.id) IS NULL
               THEN u.headers END
    FROM u LEFT JOIN done d ON d.id = u.id AND d.lease_token = u.token
    ORDER BY u.ord
), healthy AS (
    -- Also the last success (silence detection), written when the one noted is a
    -- minute old; the rows to write are locked in id order (no deadlock between two
    -- leases recording successes of the same endpoints).
    UPDATE relaybox_endpoints e SET failing_since = NULL, failures = 0, last_success_at = $1
    WHERE e.id IN (
        SELECT x.id FROM relaybox_endpoints x
        WHERE x.id IN (SELECT u.endpoint FROM u JOIN done d
                       ON d.id = u.id AND d.lease_token = u.token
                       WHERE u.endpoint IS NOT NULL)
          AND (x.failing_since IS NOT NULL OR x.last_success_at IS NULL
               OR x.last_success_at < $1 - 60)
        ORDER BY x.id FOR UPDATE
    )
), locked AS (
    SELECT l.lane, l.xmin AS version, l.leased_at, b.tokens, e.tenant,
           cap.n - busy.others AS allowed,
           CASE WHEN l.rate_limit IS NULL THEN lim.n - busy.n
                ELSE least(cap.n - busy.n, floor(b.tokens)::int) END AS room
    FROM relaybox_lanes l
    LEFT JOIN relaybox_endpoints e ON e.id = l.lane
    CROSS JOIN LATERAL (SELECT least(l.max_in_flight, $17::int) AS n) cap
    CROSS JOIN LATERAL (
        SELECT CASE WHEN l.rate_limit IS NULL
                         AND CASE WHEN e.id IS NULL THEN l.lane ELSE 'webhook' END
                             = ANY ($15::text[])
                    THEN $16::int * cap.n ELSE cap.n END AS n) ahead
    -- Live leases of the lane, and how many are other dispatchers', counted up to what
    -- it may have (the LIMIT makes it an index scan, which marks the dead entries it
    -- meets, where a bitmap scan would read them again every time until the next
    -- vacuum; a lane that reaches the limit takes nothing, so a lane served has exact
    -- counts).
    CROSS JOIN LATERAL (
        SELECT count(*)::int AS n, count(*) FILTER (WHERE f.owner <> $4)::int AS others FROM (
            SELECT f.owner FROM relaybox_outbox_leases f
            WHERE f.lane = l.lane AND f.until > $1
              AND (f.outbox_id, f.token) NOT IN (SELECT u.id, u.token FROM u)
            ORDER BY f.lane, f.outbox_id
            LIMIT ahead.n) f) busy
    CROSS JOIN LATERAL (
        SELECT CASE WHEN busy.others = 0 THEN ahead.n ELSE cap.n END AS n) lim
    -- A due row in the lane: a probe per lane (LIMIT 1 keeps it one; as EXISTS, a plan
    -- made before any ANALYZE joined every due row of the outbox to the lanes).
    CROSS JOIN LATERAL (
        SELECT 1 FROM relaybox_outbox o
        WHERE COALESCE(o.lane, o.channel) = l.lane AND o.status = 'pending'
          AND o.next_attempt_at <= $1
          AND NOT EXISTS (SELECT 1 FROM relaybox_outbox_leases x
                          WHERE x.outbox_id = o.id AND x.until > $1)
          AND (o.ordering_key IS NULL OR NOT EXISTS (
              SELECT 1 FROM relaybox_outbox h
              WHERE h.endpoint_id = o.endpoint_id AND h.ordering_key = o.ordering_key
                AND h.sequence < o.sequence AND h.status IN ('pending', 'dead')
                AND (h.status = 'pending' OR e.on_dead = 'hold')))
        LIMIT 1) due
    CROSS JOIN LATERAL (
        SELECT CASE WHEN l.rate_limit IS NULL THEN 1.0::double precision
                    ELSE least(greatest(1.0, l.rate_limit),
                               l.tokens + ($1 - l.refilled_at) * l.rate_limit) END AS tokens) b
    WHERE ((e.id IS NULL AND l.lane = ANY($3::text[]))
           OR (e.status = 'enabled' AND e.paused_at IS NULL AND 'webhook' = ANY($3::text[])
               AND e.tenant <> ALL (ARRAY(SELECT q.t FROM unnest($19::text[], $20::int[])
                                          AS q(t, r) WHERE q.r <= 0))))
      AND busy.n < lim.n
      AND (l.rate_limit IS NULL OR l.tokens + ($1 - l.refilled_at) * l.rate_limit >= 1)
    ORDER BY l.leased_at, l.lane
    LIMIT $2
    FOR UPDATE OF l SKIP LOCKED
), lanes AS (
    -- A lane leased by a lease that committed after this statement's snapshot was
    -- locked in its new version (READ COMMITTED), but its in-flight count above is
    -- the snapshot's, without that lease's rows: skip it (its row version changed).
    SELECT k.* FROM locked k JOIN relaybox_lanes s ON s.lane = k.lane AND s.xmin = k.version
), plan AS (
    -- allocate(): one slot per lane per round, in lane order; a tenant's turns
    -- numbered over its lanes' rounds, at most its rows ($18, or $20 for a tenant in
    -- $19); turn by turn across tenants until $2 are shared.
    SELECT s.lane, s.allowed, count(*)::int AS n
    FROM (SELECT t.lane, t.allowed
          FROM (SELECT l.lane, l.allowed, l.tenant, l.leased_at, k.round,
                       row_number() OVER (
                           PARTITION BY l.tenant, CASE WHEN l.tenant IS NULL THEN l.lane END
                           ORDER BY k.round, l.leased_at, l.lane) AS turn
                FROM lanes l CROSS JOIN LATERAL generate_series(1, l.room) AS k(round)) t
          LEFT JOIN unnest($19::text[], $20::int[]) AS q(t, r) ON q.t = t.tenant
          WHERE t.tenant IS NULL OR t.turn <= COALESCE(q.r, $18::int)
          ORDER BY t.turn, t.round, t.leased_at, t.lane
          LIMIT $2) s
    GROUP BY s.lane, s.allowed
), picked AS (
    SELECT r.*, p.lane, p.allowed,
           COALESCE(x.token, r.lease_token, 0) + 1 AS new_token,
           COALESCE(x.attempt, r.attempts) + 1 AS new_attempt,
           x.token IS NOT NULL AS uncertain
    FROM plan p
    CROSS JOIN LATERAL (
        SELECT f.id, f.channel, f.key, f.payload, f.tenant, f.endpoint_id, f.message_id,
               f.attempts, f.lease_token
        FROM relaybox_outbox f
        WHERE COALESCE(f.lane, f.channel) = p.lane AND f.status = 'pending'
          AND f.next_attempt_at <= $1 AND f.id <> ALL ($6::bigint[])
          AND NOT EXISTS (SELECT 1 FROM relaybox_outbox_leases y
                          WHERE y.outbox_id = f.id AND y.until > $1)
          -- include: ordered_turn
        ORDER BY f.next_attempt_at, f.id
        LIMIT p.n
        FOR NO KEY UPDATE SKIP LOCKED) r
    LEFT JOIN LATERAL (
        SELECT y.token, y.attempt FROM relaybox_outbox_leases y
        WHERE y.outbox_id = r.id OFFSET 0) x ON true
), leased AS (
    INSERT INTO relaybox_outbox_leases (outbox_id, lane, owner, token, until, attempt)
    SELECT id, lane, $4, new_token, $5, new_attempt FROM picked
    ON CONFLICT (outbox_id) DO UPDATE
    SET lane = excluded.lane, owner = excluded.owner, token = excluded.token,
        until = excluded.until, attempt = excluded.attempt
), marked AS (
    UPDATE relaybox_lanes m SET leased_at = $1, refilled_at = $1, tokens = l.tokens - t.n
    FROM (SELECT lane, count(*) AS n FROM picked GROUP BY lane) t
    JOIN lanes l ON l.lane = t.lane
    WHERE m.lane = t.lane
), targets AS (
    -- Each endpoint once, however many of its rows were leased: looked up once, and
    -- sent with its first row only (the dispatcher keeps it for the others).
    SELECT p.first_id, x.* FROM (
        SELECT endpoint_id, min(id) AS first_id FROM picked
        WHERE endpoint_id IS NOT NULL GROUP BY endpoint_id) p
    CROSS JOIN LATERAL (
        SELECT x.id, x.tenant, x.url, x.signature, x.timeout, x.schedule, x.headers,
               x.credentials, x.failing_level, x.trace_context,
               (SELECT array_agg(s.secret ORDER BY s.id DESC) FROM relaybox_endpoint_secrets s
                WHERE s.endpoint_id = x.id AND (s.expires_at IS NULL OR s.expires_at > $1))
                   AS secrets
        FROM relaybox_endpoints x WHERE x.id = p.endpoint_id OFFSET 0) x
)
-- (OFFSET 0 keeps each message lookup a primary-key probe per leased row: a CTE's row
-- count is unknown to the planner, which would otherwise hash the whole table.)
-- recorded / tokens: the (id, lease_token) pairs done wrote, on the first row only (a
-- row of NULLs when nothing was leased); the others were fenced.
SELECT CASE WHEN x.id IS NULL OR x.id = (SELECT min(id) FROM picked) THEN k.recorded END
           AS recorded,
       CASE WHEN x.id IS NULL OR x.id = (SELECT min(id) FROM picked) THEN k.tokens END
           AS tokens,
       x.*
FROM (SELECT array_agg(id) AS recorded, array_agg(lease_token) AS tokens FROM done) k
LEFT JOIN (
    SELECT r.id, r.channel, r.key, r.payload, r.tenant, r.endpoint_id, r.message_id,
           r.new_attempt AS attempts, r.new_token AS lease_token, r.uncertain, r.lane,
           r.allowed, m.event_type, m.body, m.sequence, m.traceparent,
           e.tenant AS endpoint_tenant, e.url,
           e.signature, e.timeout, e.schedule, e.secrets, e.headers, e.credentials,
           e.failing_level, e.trace_context
    FROM picked r
    LEFT JOIN LATERAL (
        SELECT event_type, body, sequence, traceparent FROM relaybox_messages
        WHERE id = r.message_id OFFSET 0) m ON true
    LEFT JOIN targets e ON e.id = r.endpoint_id AND e.first_id = r.id
) x ON true
ORDER BY x.id

-- name: outbox_release
-- Leases taken ahead and never started (a dispatcher stopping, or a row it could not
-- start before its lease ran short): fenced per row like outbox_record, the rows are
-- due again at once, as if never leased. An uncertain row keeps its lease, expired:
-- its previous attempt's outcome is still unknown (and that lease's attempt counted).
WITH r AS (
    SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::boolean[]) AS r(id, token, uncertain)
), gone AS (
    DELETE FROM relaybox_outbox_leases l USING r
    WHERE l.outbox_id = r.id AND l.token = r.token AND NOT r.uncertain
)
UPDATE relaybox_outbox_leases l SET until = 0 FROM r
WHERE l.outbox_id = r.id AND l.token = r.token AND r.uncertain

-- name: outbox_record
-- Group commit of outcomes: element i of the arrays is one finished attempt. Fenced per
-- row like outbox_lease's done: only the holder of the lease (its token) writes, only a
-- pending row; its lease goes, and the row keeps the lease's attempt count and token.
-- $4[i] is the new status ('pending' = retry at $5[i]). Returns the (id, lease_token)
-- pairs written; the others were fenced.
WITH u AS (
    SELECT * FROM unnest($2::bigint[], $3::bigint[], $4::text[], $5::double precision[],
                         $6::text[], $7::text[], $8::int[])
        AS u(id, token, status, next_at, reason, error, code)
), freed AS (
    -- By primary key (outbox_lease's freed says why).
    DELETE FROM relaybox_outbox_leases l
    WHERE l.outbox_id = ANY ($2::bigint[])
      AND l.outbox_id BETWEEN (SELECT min(id) FROM u) AND (SELECT max(id) FROM u)
      AND l.token = ($3::bigint[])[array_position($2::bigint[], l.outbox_id)]
    RETURNING l.outbox_id, l.token, l.attempt
)
UPDATE relaybox_outbox o
SET status = u.status,
    dead_reason = CASE WHEN u.status = 'pending' THEN o.dead_reason ELSE u.reason END,
    next_attempt_at = CASE WHEN u.status = 'pending' THEN u.next_at ELSE o.next_attempt_at END,
    last_error = u.error, last_status = u.code, updated_at = $1,
    sent_at = CASE WHEN u.status = 'sent' THEN $1 ELSE o.sent_at END,
    attempts = f.attempt, lease_token = f.token
FROM u JOIN freed f ON f.outbox_id = u.id
-- By primary key whatever the statistics (outbox_lease's done says why).
WHERE o.id = ANY ($2::bigint[])
  AND o.id BETWEEN (SELECT min(i) FROM unnest($2::bigint[]) i)
               AND (SELECT max(i) FROM unnest($2::bigint[]) i)
  AND o.id = u.id AND o.status NOT IN ('sent', 'dead', 'held')
RETURNING o.id, o.lease_token

-- name: outbox_attempts_insert
-- The attempt log of a recorded batch, one multi-row insert (array order = id order).
-- What the receiver answered, and the error text, is not kept for a delivery erased
-- meanwhile (an attempt recorded late, fenced, after an erasure emptied its row:
-- relaybox.erasure).
INSERT INTO relaybox_outbox_attempts
    (outbox_id, attempt, lease_token, dispatcher, started_at, duration, outcome, status_code,
     error, response, headers)
-- The erased_at of each row is read by its primary key (a scalar subquery: a join was
-- planned as a scan of the outbox on a table without statistics; tests/test_plans.py).
SELECT a.id, a.attempt, a.token, a.dispatcher, a.started, a.duration, a.outcome, a.code,
       CASE WHEN a.error IS NULL OR a.erased IS NULL THEN a.error ELSE '(erased)' END,
       CASE WHEN a.response IS NULL OR a.erased IS NULL THEN a.response END,
       CASE WHEN a.headers IS NULL OR a.erased IS NULL THEN a.headers END
FROM (SELECT u.*, (SELECT o.erased_at FROM relaybox_outbox o WHERE o.id = u.id) AS erased
      FROM unnest($1::bigint[], $2::int[], $3::bigint[], $4::text[], $5::double precision[],
                  $6::double precision[], $7::text[], $8::int[], $9::text[], $10::text[],
                  $11::text[])
           WITH ORDINALITY AS u(id, attempt, token, dispatcher, started, duration, outcome,
                                code, error, response, headers, ord)) a
ORDER BY a.ord

-- name: endpoints_succeeded
-- Clears the failure streak of every endpoint in $1 (a recorded batch's successes)
-- and notes its last success ($2, silence detection) when the one noted is a minute
-- old: an endpoint's row is written at most once a minute while it succeeds. Rows
-- are locked in id order, so two batches naming the same endpoints never deadlock.
UPDATE relaybox_endpoints SET failing_since = NULL, failures = 0,
    last_success_at = COALESCE($2::double precision, last_success_at)
WHERE id IN (
    SELECT id FROM relaybox_endpoints
    WHERE id = ANY($1::text[])
      AND (failing_since IS NOT NULL
           OR ($2::double precision IS NOT NULL
               AND (last_success_at IS NULL OR last_success_at < $2::double precision - 60)))
    ORDER BY id FOR UPDATE
)

-- name: ops_attempt_minutes
-- Delivery attempts started since $1, counted per minute and outcome (the dashboard's
-- deliveries-per-minute chart). An operator's read: it scans the recent attempts.
SELECT floor(started_at / 60) * 60 AS minute, outcome, count(*) AS n
FROM relaybox_outbox_attempts
WHERE started_at >= $1
GROUP BY 1, 2
ORDER BY 1, 2
-- name: ordering_blocked_keys
-- Keys that dead deliveries hold on ordered endpoints with on_dead = 'hold' (of
-- endpoint $1, or every endpoint), with the first dead sequence and how many rows
-- of the key wait behind it.
SELECT o.endpoint_id, e.tenant, o.ordering_key, min(o.sequence) AS sequence,
       count(*)::int AS dead,
       (SELECT count(*)::int FROM relaybox_outbox w
        WHERE w.endpoint_id = o.endpoint_id AND w.ordering_key = o.ordering_key
          AND w.status = 'pending') AS waiting
FROM relaybox_outbox o JOIN relaybox_endpoints e ON e.id = o.endpoint_id
WHERE o.ordering_key IS NOT NULL AND o.status = 'dead' AND e.on_dead = 'hold'
  AND ($1::text IS NULL OR o.endpoint_id = $1) AND ($2::text IS NULL OR e.tenant = $2)
GROUP BY o.endpoint_id, e.tenant, o.ordering_key
ORDER BY o.endpoint_id, o.ordering_key
LIMIT $3

-- name: ordering_key_release
-- An operator releases a key: its dead deliveries to the endpoint stay dead letters
-- (recoverable) but no longer hold the key back.
UPDATE relaybox_outbox SET ordering_key = NULL, updated_at = $3
WHERE endpoint_id = $1 AND ordering_key = $2 AND status = 'dead'
RETURNING id

-- name: ordering_blocked_count
-- How many (endpoint, key) pairs dead deliveries hold (the blocked-keys gauge).
SELECT count(*)::int AS n FROM (
    SELECT DISTINCT o.endpoint_id, o.ordering_key
    FROM relaybox_outbox o JOIN relaybox_endpoints e ON e.id = o.endpoint_id
    WHERE o.ordering_key IS NOT NULL AND o.status = 'dead' AND e.on_dead = 'hold') k

-- name: ordering_clear
-- An endpoint no longer ordered: its waiting and dead deliveries drop their keys, so
-- nothing holds them back any more.
UPDATE relaybox_outbox SET ordering_key = NULL
WHERE endpoint_id = $1 AND ordering_key IS NOT NULL AND status IN ('pending', 'dead')

-- name: replay_job_active
-- The endpoint's queued or running replay-missing job (at most one: a UNIQUE index).
SELECT id FROM relaybox_replay_jobs
WHERE endpoint_id = $1 AND status IN ('queued', 'running')

-- name: replay_job_recent
-- How many replay-missing jobs the tenant started after $2, and the first of them.
SELECT count(*), min(created_at) FROM relaybox_replay_jobs
WHERE tenant = $1 AND created_at > $2

-- name: replay_job_insert
-- A new job, queued; nothing when the endpoint has one queued or running already
-- (relaybox_replay_jobs_active: of two at once, the later one inserts nothing).
INSERT INTO relaybox_replay_jobs
    (id, tenant, endpoint_id, since, until_at, max_queued, status, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, 'queued', $7, $7)
ON CONFLICT DO NOTHING
RETURNING id, tenant, endpoint_id, since, until_at, max_queued, status, scanned, queued, cursor_at,
       cursor_id, resume_since, error, created_at, started_at, finished_at

-- name: replay_job_get
-- A job, by id; $2 NULL: of any tenant.
SELECT id, tenant, endpoint_id, since, until_at, max_queued, status, scanned, queued, cursor_at,
       cursor_id, resume_since, error, created_at, started_at, finished_at
FROM relaybox_replay_jobs WHERE id = $1 AND ($2::text IS NULL OR tenant = $2)

-- name: replay_job_claim
-- The oldest job waiting ($4 NULL) or job $4, queued or running under no live lease (a
-- dispatcher that died or stopped), leased to $1 until $2 + $3. Two claims at once
-- never get the same job (FOR UPDATE SKIP LOCKED; the lease is checked again).
UPDATE relaybox_replay_jobs
SET status = 'running', lease_owner = $1, lease_until = $2::double precision + $3::double precision,
    started_at = coalesce(started_at, $2), updated_at = $2
WHERE id = (
    SELECT id FROM relaybox_replay_jobs
    WHERE status IN ('queued', 'running') AND (lease_until IS NULL OR lease_until <= $2)
      AND ($4::text IS NULL OR id = $4)
    ORDER BY created_at, id LIMIT 1
    FOR UPDATE SKIP LOCKED
)
  AND status IN ('queued', 'running') AND (lease_until IS NULL OR lease_until <= $2)
RETURNING id, tenant, endpoint_id, since, until_at, max_queued, status, scanned, queued, cursor_at,
       cursor_id, resume_since, error, created_at, started_at, finished_at

-- name: replay_job_advance
-- One batch's progress, and the lease renewed, only while $2 still holds it: first in
-- the batch's transaction (the row stays locked until the COMMIT, so a claim waits for
-- it); no row back means the lease was lost and the batch rolls back.
UPDATE relaybox_replay_jobs
SET scanned = scanned + $3, queued = queued + $4, cursor_at = $5, cursor_id = $6,
    lease_until = $7::double precision + $8::double precision, updated_at = $7
WHERE id = $1 AND lease_owner = $2 AND status = 'running'
RETURNING scanned, queued

-- name: replay_job_finish
-- The job done or failed ($3), while $2 holds its lease.
UPDATE relaybox_replay_jobs
SET status = $3, error = $4, resume_since = $5, finished_at = $6, updated_at = $6,
    lease_owner = NULL, lease_until = NULL
WHERE id = $1 AND lease_owner = $2 AND status = 'running'
RETURNING id

-- name: replay_job_release
-- A stopping dispatcher gives its job back: the next claim takes it on at once.
UPDATE relaybox_replay_jobs SET lease_owner = NULL, lease_until = NULL, updated_at = $3
WHERE id = $1 AND lease_owner = $2 AND status = 'running'

-- name: replay_job_latest
-- The endpoint's newest replay-missing job (the dashboard's endpoint page).
SELECT id, tenant, endpoint_id, since, until_at, max_queued, status, scanned, queued, cursor_at,
       cursor_id, resume_since, error, created_at, started_at, finished_at
FROM relaybox_replay_jobs WHERE endpoint_id = $1 ORDER BY created_at DESC, id DESC LIMIT 1

-- name: replay_jobs_purge
-- Maintenance: up to $2 replay jobs that ended before $1 (kept as long as a message's
-- body, retention.outbox_payload_max_age).
DELETE FROM relaybox_replay_jobs
WHERE id IN (SELECT id FROM relaybox_replay_jobs
             WHERE status IN ('done', 'failed') AND finished_at < $1 LIMIT $2)
RETURNING id
