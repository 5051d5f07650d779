-- Retention per tenant (relaybox.retention.policy, docs/operating.md "Retention"):
-- the payload ages an operator set for one tenant through the admin API. NULL in a
-- column: that age comes from the configuration file ([retention.tenants.ID]) or the
-- global setting. A row sets at least one age; removing the tenant's policy deletes
-- the row.
CREATE TABLE relaybox_retention_policies (
    tenant                 TEXT PRIMARY KEY,
    payload_max_age        REAL CHECK (payload_max_age > 0),
    outbox_payload_max_age REAL CHECK (outbox_payload_max_age > 0),
    updated_at             REAL NOT NULL,
    updated_by             TEXT NOT NULL,
    CHECK (payload_max_age IS NOT NULL OR outbox_payload_max_age IS NOT NULL)
);
-- A purge pass for the tenants sharing one age (or for one source) reads only their
-- rows that may be purged: these partial indexes hold a row from when it finishes to
-- when it is purged, as the global ones (relaybox_*_purgeable) do. Building them locks
-- writes on the tables for the build's duration.
CREATE INDEX relaybox_inbox_purgeable_tenant ON relaybox_inbox (tenant, updated_at)
    WHERE payload IS NOT NULL AND status <> 'pending' AND tenant IS NOT NULL;
CREATE INDEX relaybox_inbox_purgeable_source ON relaybox_inbox (source, updated_at)
    WHERE payload IS NOT NULL AND status <> 'pending';
CREATE INDEX relaybox_outbox_purgeable_tenant ON relaybox_outbox (tenant, updated_at)
    WHERE purged_at IS NULL AND status IN ('sent', 'dead') AND tenant IS NOT NULL;
CREATE INDEX relaybox_messages_purgeable_tenant ON relaybox_messages (tenant, created_at)
    WHERE purged_at IS NULL;
