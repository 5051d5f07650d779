-- Retention's SQL both backends run as written (sql/<backend>_retention.sql has the
-- rest).

-- part: retention_policy_upsert
-- retention_policy_put's new values replace a tenant's policy, returned as
-- retention_policy_get reads it.
ON CONFLICT (tenant) DO UPDATE SET
    payload_max_age = excluded.payload_max_age,
    outbox_payload_max_age = excluded.outbox_payload_max_age,
    keys_max_age = excluded.keys_max_age,
    updated_at = excluded.updated_at,
    updated_by = excluded.updated_by
RETURNING tenant, payload_max_age, outbox_payload_max_age, updated_at, updated_by, keys_max_age

-- part: inbox_purgeable
-- The inbox row i, its payload there and not pending (the terms of the purgeable
-- indexes, which each statement states with its cutoff), may lose its payload: it is
-- finished (done, ignored, or dead and discarded; an undiscarded dead letter keeps it)
-- and no open quarantine entry needs the original for comparison.
AND (i.status IN ('done', 'ignored') OR i.discarded_at IS NOT NULL)
AND NOT EXISTS (SELECT 1 FROM relaybox_quarantine q
                WHERE q.inbox_id = i.id AND q.resolved_at IS NULL)
