-- The counts of finished rows by status and source (metrics, stats, overview: the
-- only reader of relaybox_inbox_status_source, in ops_stats_inbox) come from a
-- partial index holding only done and ignored rows. Pending rows are counted from the
-- partial "due" index and dead ones from the "dead" index, so an accepted row no
-- longer enters this one when it is inserted, only once it is done: one index fewer
-- to write for every accepted row (bench/README.md, "Levers").
DROP INDEX relaybox_inbox_status_source;
CREATE INDEX relaybox_inbox_finished ON relaybox_inbox (source, status)
    WHERE status IN ('done', 'ignored');
