-- Ordered delivery per key (docs/sending.md, "Ordered delivery"): a message published
-- with an ordering key carries a sequence number per (tenant, key); an endpoint with
-- `ordered` receives a key's messages one at a time, in sequence order.
--
-- ordered: the lease holds a delivery back while an earlier one of its key to this
-- endpoint is pending (or dead, with on_dead = 'hold').
ALTER TABLE relaybox_endpoints ADD COLUMN ordered BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE relaybox_endpoints ADD COLUMN on_dead TEXT NOT NULL DEFAULT 'hold'
    CHECK (on_dead IN ('hold', 'skip'));

-- The last sequence number given per (tenant, key): a publish takes the next one with
-- an upsert, whose row lock it holds until its transaction ends, so a key's numbers
-- increase in commit order.
CREATE TABLE relaybox_outbound_sequences (
    tenant        TEXT NOT NULL,
    ordering_key  TEXT NOT NULL,
    last_sequence BIGINT NOT NULL,
    PRIMARY KEY (tenant, ordering_key)
);

ALTER TABLE relaybox_messages ADD COLUMN ordering_key TEXT;
ALTER TABLE relaybox_messages ADD COLUMN sequence BIGINT;
CREATE UNIQUE INDEX relaybox_messages_sequence ON relaybox_messages (tenant, ordering_key, sequence)
    WHERE ordering_key IS NOT NULL;

-- Set on the deliveries to ordered endpoints only (NULL elsewhere: the lease's check
-- stops at the NULL), and cleared when an operator releases a dead head.
ALTER TABLE relaybox_outbox ADD COLUMN ordering_key TEXT;
ALTER TABLE relaybox_outbox ADD COLUMN sequence BIGINT;
-- The lease's probe for an earlier delivery of the key still in the way: only the
-- keyed rows that are pending or dead are in it.
CREATE INDEX relaybox_outbox_ordering ON relaybox_outbox (endpoint_id, ordering_key, sequence)
    WHERE ordering_key IS NOT NULL AND status IN ('pending', 'dead');
