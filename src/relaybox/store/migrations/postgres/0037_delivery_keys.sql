-- The keys kept for good, narrower (docs/scaling.md, "Bytes on disk per event").
--
-- A webhook delivery's key (channel 'webhook', message id ':' endpoint id) lives as
-- long as its message: no delivery is made for a message that is gone. Its keys have
-- their own table, each with the day of its MESSAGE, which the message id holds (`msg_`
-- + the publisher's clock in milliseconds, 11 hex digits: relaybox_message_day), so
-- that once the sending side is partitioned (relaybox.store.partitions) this table is
-- partitioned by the same days as relaybox_messages and each of its partitions is
-- dropped whole after the messages' partition of the same days: no row is deleted one
-- by one. Its PRIMARY KEY (day, digest) is unique across partitions (it holds the
-- partition key) and still one row per delivery key, since a key's day is a function
-- of its message id; every lookup knows the day, and expiry by age (a keys window)
-- reads the same index by its first column. The delivery keys written before this
-- migration stay in relaybox_outbox_keys (the replay of missing deliveries reads both
-- tables), until a keys window expires them. The handler's and the application's
-- outbox rows keep their keys in relaybox_outbox_keys.
-- An id relaybox did not make (none does; written by hand) has the last day: its keys
-- go to the DEFAULT partition, never dropped, and no keys window reaches them.
CREATE FUNCTION relaybox_message_day(id text) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE WHEN id ~ '^msg_[0-9a-f]{11}'
                THEN (('x' || substr(id, 5, 11))::bit(44)::bigint / 86400000)::integer
                ELSE 2147483647 END
$$;

CREATE TABLE relaybox_delivery_keys (
    day    INTEGER NOT NULL,
    digest UUID NOT NULL,
    CONSTRAINT relaybox_delivery_keys_pkey PRIMARY KEY (day, digest)
);

-- One index by day per keys table, not two. The expiry by age of every scope walks
-- the day index from the oldest day; the expiry of one scope (or of all but some)
-- goes day by day from the oldest, each batch reading the keys of one day only
-- (relaybox.store.keys_store), so the (scope, first_seen) indexes go (DROP INDEX: a
-- brief lock). Measured beside a BRIN on first_seen, which costs nothing a key but
-- cannot give the oldest day nor an order (each batch of a day would read the day
-- again), and widens its ranges as the pages of expired keys are filled again.
DROP INDEX relaybox_event_keys_scope_age;
DROP INDEX relaybox_message_keys_scope_age;
DROP INDEX relaybox_business_keys_scope_age;

-- The outbox's keys get a keys window too (retention.keys_max_age): their index by
-- day. Built here under a lock that holds the outbox's inserts while it reads the
-- keys table, and the DROP INDEX locks above are held until this transaction commits
-- (accepts and publishes wait as long): 0.28-0.36 s per million outbox keys measured
-- (4 million in 1.1-1.5 s on a 2-core machine; docs/operating.md). The migration runner
-- applies a migration in one transaction, where CONCURRENTLY cannot run.
CREATE INDEX relaybox_outbox_keys_age ON relaybox_outbox_keys (first_seen);
