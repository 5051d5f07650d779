-- Retention per tenant and per source (relaybox.store.retention). The policies an
-- operator set through the admin API, and the purge's passes: one per group of
-- tenants sharing an age (tenant = ANY, through the partial (tenant, time) indexes),
-- and scans in (time, id) order from a cursor for one source or for everything else,
-- whose rows the caller filters before purging them by id. Every batch is its own
-- transaction and re-checks, once the rows are locked, what made them purgeable.

-- A purge batch's rows emptied: a statement choosing its batch (a MATERIALIZED CTE
-- `batch` of ids) includes its table's part ($2: now). Each re-checks, once the row is
-- locked, the terms of the table's purgeable index.

-- part: purge_inbox_batch
UPDATE relaybox_inbox t SET payload = NULL, headers = NULL, purged_at = $2
FROM batch
WHERE t.id = batch.id AND t.payload IS NOT NULL AND t.status <> 'pending'
RETURNING t.id

-- part: purge_outbox_batch
UPDATE relaybox_outbox t SET payload = 'null', purged_at = $2
FROM batch
WHERE t.id = batch.id AND t.purged_at IS NULL AND t.status IN ('sent', 'dead')
RETURNING t.id

-- part: purge_messages_batch
UPDATE relaybox_messages t SET body = 'null', purged_at = $2
FROM batch
WHERE t.id = batch.id AND t.purged_at IS NULL
RETURNING t.id

-- part: message_deliveries_purged
-- The message m has no delivery that keeps its payload: a subquery per message (an
-- index probe of relaybox_outbox_message), not NOT EXISTS (see ops_purge_messages).
AND (SELECT 1 FROM relaybox_outbox o
     WHERE o.message_id = m.id AND o.purged_at IS NULL LIMIT 1) IS NULL

-- name: retention_custom_plans
-- For the rest of the transaction, plan each statement for its values (the cutoff, the
-- cursor, the tenants, the source): a generic plan cannot tell a scan from the start
-- of the table from one of the last minutes, nor one rare source from all of them, and
-- picked the time index for both; the statistics pick the (tenant|source, time) one
-- when it reads fewer rows. Planning costs well under a millisecond a batch.
SELECT set_config('plan_cache_mode', 'force_custom_plan', true)

-- name: retention_policy_get
SELECT tenant, payload_max_age, outbox_payload_max_age, updated_at, updated_by, keys_max_age
FROM relaybox_retention_policies WHERE tenant = $1

-- name: retention_policy_put
-- Insert or replace a tenant's policy; a new tenant only while fewer than $6 have one
-- (no row returned: the table is full).
INSERT INTO relaybox_retention_policies AS p
    (tenant, payload_max_age, outbox_payload_max_age, updated_at, updated_by, keys_max_age)
SELECT $1, $2, $3, $4, $5, $7
WHERE EXISTS (SELECT 1 FROM relaybox_retention_policies WHERE tenant = $1)
   OR (SELECT count(*) FROM relaybox_retention_policies) < $6
-- include: retention_policy_upsert

-- name: retention_policy_delete
DELETE FROM relaybox_retention_policies WHERE tenant = $1 RETURNING tenant

-- name: retention_policy_page
-- The policies after tenant $1, in tenant order, $2 at most.
SELECT tenant, payload_max_age, outbox_payload_max_age, updated_at, updated_by, keys_max_age
FROM relaybox_retention_policies WHERE tenant > $1 ORDER BY tenant LIMIT $2

-- name: ops_purge_inbox_tenants
-- One batch of ops_purge_inbox for the tenants $4 (cutoff $1, now $2, limit $3), through
-- relaybox_inbox_purgeable_tenant (tenant IS NOT NULL: its predicate, which the planner
-- cannot prove from tenant = ANY of a parameter). No order: every candidate goes, and
-- without ORDER BY the index scan stops at the limit instead of reading every
-- candidate to sort them.
WITH batch AS MATERIALIZED (
    SELECT i.id FROM relaybox_inbox i
    WHERE i.tenant = ANY($4::text[]) AND i.tenant IS NOT NULL
      AND i.payload IS NOT NULL AND i.status <> 'pending' AND i.updated_at < $1
      -- include: inbox_purgeable
    LIMIT $3
    FOR NO KEY UPDATE SKIP LOCKED)
-- include: purge_inbox_batch

-- name: ops_purge_inbox_scan
-- Candidates finished before $1 after the cursor ($2, $3), $4 at most, in (time, id)
-- order, with what decides their age (tenant, source). Reads relaybox_inbox_purgeable.
SELECT i.id, i.updated_at, i.tenant, i.source FROM relaybox_inbox i
WHERE i.payload IS NOT NULL AND i.status <> 'pending' AND i.updated_at < $1
  AND (i.updated_at, i.id) > ($2, $3)
  -- include: inbox_purgeable
ORDER BY i.updated_at, i.id LIMIT $4

-- name: ops_purge_inbox_scan_source
-- ops_purge_inbox_scan for the source $5, through relaybox_inbox_purgeable_source.
SELECT i.id, i.updated_at, i.tenant, i.source FROM relaybox_inbox i
WHERE i.source = $5
  AND i.payload IS NOT NULL AND i.status <> 'pending' AND i.updated_at < $1
  AND (i.updated_at, i.id) > ($2, $3)
  -- include: inbox_purgeable
ORDER BY i.updated_at, i.id LIMIT $4

-- name: ops_purge_inbox_ids
-- Purge the rows $1 (a scan's, filtered) that are still candidates at cutoff $3 once
-- locked; now $2.
WITH batch AS MATERIALIZED (
    SELECT i.id FROM relaybox_inbox i
    WHERE i.id = ANY($1::bigint[])
      AND i.payload IS NOT NULL AND i.status <> 'pending' AND i.updated_at < $3
      -- include: inbox_purgeable
    FOR NO KEY UPDATE SKIP LOCKED)
-- include: purge_inbox_batch

-- name: ops_purge_inbox_groups
-- What ops_purge_count counts at cutoff $1, by (tenant, source).
SELECT i.tenant, i.source, count(*) FROM relaybox_inbox i
WHERE i.payload IS NOT NULL AND i.status <> 'pending' AND i.updated_at < $1
  -- include: inbox_purgeable
GROUP BY i.tenant, i.source

-- name: ops_purge_quarantine_tenants
WITH batch AS MATERIALIZED (
    SELECT id FROM relaybox_quarantine
    WHERE tenant = ANY($4::text[])
      AND payload IS NOT NULL AND resolved_at IS NOT NULL AND resolved_at < $1
    LIMIT $3
    FOR UPDATE SKIP LOCKED)
UPDATE relaybox_quarantine t SET payload = NULL, headers = NULL, purged_at = $2
FROM batch
WHERE t.id = batch.id
RETURNING t.id

-- name: ops_purge_quarantine_scan
-- Resolved entries before $1 after the cursor ($2, $3), $4 at most, of the source $5
-- (NULL: any). Quarantine entries are few: no index.
SELECT id, resolved_at, tenant, source FROM relaybox_quarantine
WHERE payload IS NOT NULL AND resolved_at IS NOT NULL AND resolved_at < $1
  AND (resolved_at, id) > ($2, $3)
  AND ($5::text IS NULL OR source = $5)
ORDER BY resolved_at, id LIMIT $4

-- name: ops_purge_quarantine_ids
WITH batch AS MATERIALIZED (
    SELECT id FROM relaybox_quarantine
    WHERE id = ANY($1::bigint[])
      AND payload IS NOT NULL AND resolved_at IS NOT NULL AND resolved_at < $3
    FOR UPDATE SKIP LOCKED)
UPDATE relaybox_quarantine t SET payload = NULL, headers = NULL, purged_at = $2
FROM batch
WHERE t.id = batch.id
RETURNING t.id

-- name: ops_purge_quarantine_groups
SELECT tenant, source, count(*) FROM relaybox_quarantine
WHERE payload IS NOT NULL AND resolved_at IS NOT NULL AND resolved_at < $1
GROUP BY tenant, source

-- name: ops_purge_outbox_tenants
-- One batch of ops_purge_outbox for the tenants $4, through
-- relaybox_outbox_purgeable_tenant (no order, as in ops_purge_inbox_tenants).
WITH batch AS MATERIALIZED (
    SELECT id FROM relaybox_outbox
    WHERE tenant = ANY($4::text[]) AND tenant IS NOT NULL
      AND purged_at IS NULL AND status IN ('sent', 'dead') AND updated_at < $1
    LIMIT $3
    FOR NO KEY UPDATE SKIP LOCKED)
-- include: purge_outbox_batch

-- name: ops_purge_outbox_scan
SELECT id, updated_at, tenant, NULL::text FROM relaybox_outbox
WHERE purged_at IS NULL AND status IN ('sent', 'dead') AND updated_at < $1
  AND (updated_at, id) > ($2, $3)
ORDER BY updated_at, id LIMIT $4

-- name: ops_purge_outbox_ids
WITH batch AS MATERIALIZED (
    SELECT id FROM relaybox_outbox
    WHERE id = ANY($1::bigint[])
      AND purged_at IS NULL AND status IN ('sent', 'dead') AND updated_at < $3
    FOR NO KEY UPDATE SKIP LOCKED)
-- include: purge_outbox_batch

-- name: ops_purge_outbox_groups
SELECT tenant, NULL::text, count(*) FROM relaybox_outbox
WHERE purged_at IS NULL AND status IN ('sent', 'dead') AND updated_at < $1
GROUP BY tenant

-- name: ops_purge_messages_tenants
-- One batch of ops_purge_messages for the tenants $4, through
-- relaybox_messages_purgeable_tenant; the delivery check as there.
WITH batch AS MATERIALIZED (
    SELECT m.id FROM relaybox_messages m
    WHERE m.tenant = ANY($4::text[])
      AND m.purged_at IS NULL AND m.created_at < $1
      -- include: message_deliveries_purged
    LIMIT $3
    FOR UPDATE SKIP LOCKED)
-- include: purge_messages_batch

-- name: ops_purge_messages_scan
SELECT m.id, m.created_at, m.tenant, NULL::text FROM relaybox_messages m
WHERE m.purged_at IS NULL AND m.created_at < $1
  AND (m.created_at, m.id) > ($2, $3)
  -- include: message_deliveries_purged
ORDER BY m.created_at, m.id LIMIT $4

-- name: ops_purge_messages_ids
WITH batch AS MATERIALIZED (
    SELECT m.id FROM relaybox_messages m
    WHERE m.id = ANY($1::text[])
      AND m.purged_at IS NULL AND m.created_at < $3
      -- include: message_deliveries_purged
    FOR UPDATE SKIP LOCKED)
-- include: purge_messages_batch

-- name: ops_purge_messages_groups
-- What ops_purge_messages_count counts at cutoff $1, by tenant.
SELECT m.tenant, NULL::text, count(*) FROM relaybox_messages m
WHERE m.purged_at IS NULL AND m.created_at < $1
  AND NOT EXISTS (SELECT 1 FROM relaybox_outbox o
                  WHERE o.message_id = m.id AND o.purged_at IS NULL
                    AND NOT (o.status IN ('sent', 'dead') AND o.updated_at < $1))
GROUP BY m.tenant
