-- Leases of outbox rows move to a table of their own (PostgreSQL only; SQLite keeps the
-- lease columns of relaybox_outbox).
--
-- A lease had been an UPDATE of the outbox row: lease_until is in the predicate of the
-- relaybox_outbox_leased index, so it could never be a HOT update, and every lease wrote
-- a new version of the row and an entry in each of its nine indexes, then the record
-- wrote another. Index insertions were 38 % of PostgreSQL's instructions per delivery
-- (callgrind of the lease statement in a loop). A lease is now one narrow row here (two
-- index entries), deleted when its outcome is recorded; the outbox row is written once,
-- at the record, with the attempt count and token the lease carried. bench/README.md
-- has the figures.
--
-- A row exists while its outbox row is leased: live while until > now, expired when its
-- dispatcher died before recording (the next lease of the row finds it: the outcome is
-- uncertain, and the lease's attempt was counted). relaybox_outbox.lease_token keeps the
-- token of the last recorded lease, so tokens keep increasing across leases.
CREATE TABLE relaybox_outbox_leases (
    outbox_id BIGINT PRIMARY KEY,
    lane      TEXT NOT NULL,
    owner     TEXT NOT NULL,
    token     BIGINT NOT NULL,
    until     DOUBLE PRECISION NOT NULL,
    attempt   INTEGER NOT NULL
);
-- The lease counts a lane's rows in flight through it (in id order, up to the lane's
-- cap: an index scan, which marks the dead entries it passes).
CREATE INDEX relaybox_outbox_leases_lane ON relaybox_outbox_leases (lane, outbox_id);

-- Leases in flight during the upgrade move over: their attempt was counted already.
INSERT INTO relaybox_outbox_leases (outbox_id, lane, owner, token, until, attempt)
SELECT id, COALESCE(lane, channel), COALESCE(lease_owner, ''), COALESCE(lease_token, 1),
       lease_until, attempts
FROM relaybox_outbox
WHERE status = 'pending' AND lease_until IS NOT NULL;

-- The outbox row no longer carries the lease, nor the flag its lease set.
DROP INDEX relaybox_outbox_leased;
ALTER TABLE relaybox_outbox DROP COLUMN lease_owner, DROP COLUMN lease_until,
    DROP COLUMN uncertain;

-- Published deliveries have no inbox row: they need no entry in its index (one index
-- insertion fewer when a delivery is recorded).
DROP INDEX relaybox_outbox_inbox;
CREATE INDEX relaybox_outbox_inbox ON relaybox_outbox (inbox_id) WHERE inbox_id IS NOT NULL;
