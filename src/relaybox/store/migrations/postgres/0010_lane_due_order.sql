-- The lease takes each lane's due rows oldest first, ORDER BY next_attempt_at, id
-- (outbox_lease). On (lane, next_attempt_at) alone the id tie-break was a sort: every
-- due row of every lane served was read (and its heap tuple visited) to take a few,
-- ~500 rows a lane, 5.6 of the lease's 7.5 ms mid-way through `bench dispatch`. With
-- id in the key the index gives that order and the LIMIT stops after n rows.
-- (SQLite's index entries end with the rowid, the id, already.) Still one index.
-- Rebuilding it locks writes on the outbox for the build's duration.
DROP INDEX IF EXISTS relaybox_outbox_lane_due;
CREATE INDEX relaybox_outbox_lane_due ON relaybox_outbox (COALESCE(lane, channel), next_attempt_at, id)
    WHERE status = 'pending';
