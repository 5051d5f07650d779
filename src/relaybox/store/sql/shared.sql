-- The core statements' SQL both backends run as written (sql/<backend>.sql has the
-- rest).

-- part: operation_upsert
-- A new business key's readable row (its key's row was inserted: the key is new) goes
-- over the row of an expired key, but not over one that the backfill of keys stored
-- before migration 0031 has not reached yet (no row back: that one decides, a repeat).
ON CONFLICT (business_key) DO UPDATE SET fingerprint = excluded.fingerprint,
    inbox_id = excluded.inbox_id, source = excluded.source, tenant = excluded.tenant,
    created_at = excluded.created_at
WHERE EXISTS (SELECT 1 FROM relaybox_keys_backfill
              WHERE kind = 'operation' AND finished_at IS NOT NULL)
RETURNING 1
