-- The event key's columns in the order (source, event_id, account). Lookups by
-- (source, event_id) (ordering, replay) use its prefix, so the separate
-- relaybox_inbox_source_event index goes: one index fewer to maintain on every
-- accepted row. With it gone, the accept statement's per-key probe plans onto the
-- event key even with no statistics (a young table): it had been planned onto
-- (source, id), filtering every row of the source (bench/README.md).
-- Rebuilding the unique index locks the inbox for the build's duration.
ALTER TABLE relaybox_inbox DROP CONSTRAINT relaybox_inbox_event_key;
ALTER TABLE relaybox_inbox ADD CONSTRAINT relaybox_inbox_event_key UNIQUE (source, event_id, account);
DROP INDEX IF EXISTS relaybox_inbox_source_event;
