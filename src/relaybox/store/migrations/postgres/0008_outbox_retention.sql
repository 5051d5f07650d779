-- Retention on the sending side. purged_at: when the purge dropped a finished
-- delivery's payload (handler rows' payloads become JSON null, which webhook rows
-- carry already) and its attempts' response bytes, or a message's body (JSON null).
-- NULL: still there. Status, attempts, errors and keys stay. A purged row is never
-- sent again: redeliver and recover skip it, because the bytes it would sign are gone.
ALTER TABLE relaybox_outbox ADD COLUMN purged_at DOUBLE PRECISION;
ALTER TABLE relaybox_messages ADD COLUMN purged_at DOUBLE PRECISION;
-- Deliveries whose payload the purge may drop (sent or dead), in the order it drops
-- them; an entry is added when a delivery finishes and leaves when it is purged.
-- Building them locks writes on the two tables for the build's duration.
CREATE INDEX relaybox_outbox_purgeable ON relaybox_outbox (updated_at)
    WHERE purged_at IS NULL AND status IN ('sent', 'dead');
CREATE INDEX relaybox_messages_purgeable ON relaybox_messages (created_at)
    WHERE purged_at IS NULL;
