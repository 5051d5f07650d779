-- Retention per tenant and per source (relaybox.store.retention): the SQLite side of
-- sql/postgres_retention.sql. Lists of tenants and ids are JSON arrays (json_each);
-- no SKIP LOCKED: BEGIN IMMEDIATE already makes each batch the only writer.

-- name: retention_custom_plans
-- PostgreSQL plans each purge statement for its values; SQLite plans every statement
-- for its values anyway.
SELECT 1

-- name: retention_policy_get
SELECT tenant, payload_max_age, outbox_payload_max_age, updated_at, updated_by, keys_max_age
FROM relaybox_retention_policies WHERE tenant = ?1

-- name: retention_policy_put
INSERT INTO relaybox_retention_policies
    (tenant, payload_max_age, outbox_payload_max_age, updated_at, updated_by, keys_max_age)
SELECT ?1, ?2, ?3, ?4, ?5, ?7
WHERE EXISTS (SELECT 1 FROM relaybox_retention_policies WHERE tenant = ?1)
   OR (SELECT count(*) FROM relaybox_retention_policies) < ?6
-- include: retention_policy_upsert

-- name: retention_policy_delete
DELETE FROM relaybox_retention_policies WHERE tenant = ?1 RETURNING tenant

-- name: retention_policy_page
SELECT tenant, payload_max_age, outbox_payload_max_age, updated_at, updated_by, keys_max_age
FROM relaybox_retention_policies WHERE tenant > ?1 ORDER BY tenant LIMIT ?2

-- name: ops_purge_inbox_tenants
UPDATE relaybox_inbox SET payload = NULL, headers = NULL, purged_at = ?2
WHERE id IN (SELECT i.id FROM relaybox_inbox i
             WHERE i.tenant IN (SELECT value FROM json_each(?4))
               AND i.payload IS NOT NULL AND i.status <> 'pending' AND i.updated_at < ?1
               -- include: inbox_purgeable
             LIMIT ?3)
  AND payload IS NOT NULL AND status <> 'pending'
RETURNING id

-- name: ops_purge_inbox_scan
SELECT i.id, i.updated_at, i.tenant, i.source FROM relaybox_inbox i
WHERE i.payload IS NOT NULL AND i.status <> 'pending' AND i.updated_at < ?1
  AND (i.updated_at, i.id) > (?2, ?3)
  -- include: inbox_purgeable
ORDER BY i.updated_at, i.id LIMIT ?4

-- name: ops_purge_inbox_scan_source
SELECT i.id, i.updated_at, i.tenant, i.source FROM relaybox_inbox i
WHERE i.source = ?5
  AND i.payload IS NOT NULL AND i.status <> 'pending' AND i.updated_at < ?1
  AND (i.updated_at, i.id) > (?2, ?3)
  -- include: inbox_purgeable
ORDER BY i.updated_at, i.id LIMIT ?4

-- name: ops_purge_inbox_ids
UPDATE relaybox_inbox SET payload = NULL, headers = NULL, purged_at = ?2
WHERE id IN (SELECT i.id FROM relaybox_inbox i
             WHERE i.id IN (SELECT value FROM json_each(?1))
               AND i.payload IS NOT NULL AND i.status <> 'pending' AND i.updated_at < ?3
               -- include: inbox_purgeable
             )
RETURNING id

-- name: ops_purge_inbox_groups
SELECT i.tenant, i.source, count(*) FROM relaybox_inbox i
WHERE i.payload IS NOT NULL AND i.status <> 'pending' AND i.updated_at < ?1
  -- include: inbox_purgeable
GROUP BY i.tenant, i.source

-- name: ops_purge_quarantine_tenants
UPDATE relaybox_quarantine SET payload = NULL, headers = NULL, purged_at = ?2
WHERE id IN (SELECT id FROM relaybox_quarantine
             WHERE tenant IN (SELECT value FROM json_each(?4))
               AND payload IS NOT NULL AND resolved_at IS NOT NULL AND resolved_at < ?1
             LIMIT ?3)
RETURNING id

-- name: ops_purge_quarantine_scan
SELECT id, resolved_at, tenant, source FROM relaybox_quarantine
WHERE payload IS NOT NULL AND resolved_at IS NOT NULL AND resolved_at < ?1
  AND (resolved_at, id) > (?2, ?3)
  AND (?5 IS NULL OR source = ?5)
ORDER BY resolved_at, id LIMIT ?4

-- name: ops_purge_quarantine_ids
UPDATE relaybox_quarantine SET payload = NULL, headers = NULL, purged_at = ?2
WHERE id IN (SELECT value FROM json_each(?1))
  AND payload IS NOT NULL AND resolved_at IS NOT NULL AND resolved_at < ?3
RETURNING id

-- name: ops_purge_quarantine_groups
SELECT tenant, source, count(*) FROM relaybox_quarantine
WHERE payload IS NOT NULL AND resolved_at IS NOT NULL AND resolved_at < ?1
GROUP BY tenant, source

-- name: ops_purge_outbox_tenants
UPDATE relaybox_outbox SET payload = 'null', purged_at = ?2
WHERE id IN (SELECT id FROM relaybox_outbox
             WHERE tenant IN (SELECT value FROM json_each(?4))
               AND purged_at IS NULL AND status IN ('sent', 'dead') AND updated_at < ?1
             LIMIT ?3)
  AND purged_at IS NULL AND status IN ('sent', 'dead')
RETURNING id

-- name: ops_purge_outbox_scan
SELECT id, updated_at, tenant, NULL FROM relaybox_outbox
WHERE purged_at IS NULL AND status IN ('sent', 'dead') AND updated_at < ?1
  AND (updated_at, id) > (?2, ?3)
ORDER BY updated_at, id LIMIT ?4

-- name: ops_purge_outbox_ids
UPDATE relaybox_outbox SET payload = 'null', purged_at = ?2
WHERE id IN (SELECT value FROM json_each(?1))
  AND purged_at IS NULL AND status IN ('sent', 'dead') AND updated_at < ?3
RETURNING id

-- name: ops_purge_outbox_groups
SELECT tenant, NULL, count(*) FROM relaybox_outbox
WHERE purged_at IS NULL AND status IN ('sent', 'dead') AND updated_at < ?1
GROUP BY tenant

-- name: ops_purge_messages_tenants
UPDATE relaybox_messages SET body = 'null', purged_at = ?2
WHERE id IN (SELECT m.id FROM relaybox_messages m
             WHERE m.tenant IN (SELECT value FROM json_each(?4))
               AND m.purged_at IS NULL AND m.created_at < ?1
               AND NOT EXISTS (SELECT 1 FROM relaybox_outbox o
                               WHERE o.message_id = m.id AND o.purged_at IS NULL)
             LIMIT ?3)
  AND purged_at IS NULL
RETURNING id

-- name: ops_purge_messages_scan
SELECT m.id, m.created_at, m.tenant, NULL FROM relaybox_messages m
WHERE m.purged_at IS NULL AND m.created_at < ?1
  AND (m.created_at, m.id) > (?2, ?3)
  AND NOT EXISTS (SELECT 1 FROM relaybox_outbox o
                  WHERE o.message_id = m.id AND o.purged_at IS NULL)
ORDER BY m.created_at, m.id LIMIT ?4

-- name: ops_purge_messages_ids
UPDATE relaybox_messages SET body = 'null', purged_at = ?2
WHERE id IN (SELECT m.id FROM relaybox_messages m
             WHERE m.id IN (SELECT value FROM json_each(?1))
               AND m.purged_at IS NULL AND m.created_at < ?3
               AND NOT EXISTS (SELECT 1 FROM relaybox_outbox o
                               WHERE o.message_id = m.id AND o.purged_at IS NULL))
RETURNING id

-- name: ops_purge_messages_groups
SELECT m.tenant, NULL, count(*) FROM relaybox_messages m
WHERE m.purged_at IS NULL AND m.created_at < ?1
  AND NOT EXISTS (SELECT 1 FROM relaybox_outbox o
                  WHERE o.message_id = m.id AND o.purged_at IS NULL
                    AND NOT (o.status IN ('sent', 'dead') AND o.updated_at < ?1))
GROUP BY m.tenant
