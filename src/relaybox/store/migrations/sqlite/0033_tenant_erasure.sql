-- Erasing a tenant (relaybox erase --tenant) also empties the events received for it
-- (their verified account mapped to it) and its quarantine entries, found by these
-- indexes rather than by a scan of the history. An inbox row leaves the index once it
-- is erased; a tenant's name repeats, so B-tree deduplication keeps the inbox's index
-- at a few bytes a row. Building them locks writes on the two tables for the build.
CREATE INDEX relaybox_inbox_tenant_unerased ON relaybox_inbox (tenant)
    WHERE erased_at IS NULL AND tenant IS NOT NULL;
CREATE INDEX relaybox_quarantine_tenant ON relaybox_quarantine (tenant)
    WHERE erased_at IS NULL AND tenant IS NOT NULL;
