-- Operating relaybox: operator decisions and retention, recorded on the rows they
-- concern, plus the indexes the admin filters and the metrics scrape read.

-- A discarded dead letter stays (status dead, its error and attempts kept for the
-- record) but leaves the queue: who discarded it, when, and why.
ALTER TABLE relaybox_inbox ADD COLUMN discarded_at REAL;
ALTER TABLE relaybox_inbox ADD COLUMN discarded_by TEXT;
ALTER TABLE relaybox_inbox ADD COLUMN discard_reason TEXT;
-- When retention dropped the payload and headers (NULL: still there). The key, the
-- fingerprint and the outcome stay, so a resend is still recognised as a duplicate.
ALTER TABLE relaybox_inbox ADD COLUMN purged_at REAL;

-- Who resolved a quarantined delivery and why (resolved_at and resolution exist).
ALTER TABLE relaybox_quarantine ADD COLUMN resolved_by TEXT;
ALTER TABLE relaybox_quarantine ADD COLUMN resolution_reason TEXT;
ALTER TABLE relaybox_quarantine ADD COLUMN purged_at REAL;

-- Counts by status and source (metrics, stats, overview) read this index only.
CREATE INDEX relaybox_inbox_status_source ON relaybox_inbox (status, source);
-- The admin list filtered by source, newest first, keyset-paginated on id.
CREATE INDEX relaybox_inbox_source_id ON relaybox_inbox (source, id);
-- Rows whose payload retention may drop, in the order it drops them.
CREATE INDEX relaybox_inbox_purgeable ON relaybox_inbox (updated_at)
    WHERE payload IS NOT NULL AND status <> 'pending';
-- Open quarantine entries: their original must keep its payload for comparison.
CREATE INDEX relaybox_quarantine_open ON relaybox_quarantine (inbox_id)
    WHERE resolved_at IS NULL;
-- An event's detail page lists its business keys and outbox rows.
CREATE INDEX relaybox_operations_inbox ON relaybox_operations (inbox_id);
CREATE INDEX relaybox_outbox_inbox ON relaybox_outbox (inbox_id);
