-- The outbox's key apart from its history (as 0027 did for events and messages), so
-- that the sending side's tables can be partitioned by time (relaybox.store.partitions):
-- the UNIQUE (channel, key) that decides an outbox row's ON CONFLICT cannot hold across
-- partitions. Each (channel, key) once, as a 16-byte digest stored as a uuid (16 bytes,
-- no length header as bytea has) with the day it was first seen, written in the same
-- statement as the outbox row: its PRIMARY KEY decides which of two writers is first,
-- whether or not the first row still exists. The old UNIQUE stays until the conversion:
-- until the backfill (relaybox_keys_backfill, kind 'outbox') has copied every existing
-- row's key, it still catches a duplicate of an old row.

-- The digest of (channel, key): the first 16 bytes of SHA-256 of the channel's length,
-- ':', the channel and the key (the length keeps ('ab', 'c') apart from ('a', 'bc')).
CREATE FUNCTION relaybox_outbox_digest(channel text, key text) RETURNS uuid
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT encode(substr(sha256(convert_to(length(channel)::text || ':' || channel || key,
                                           'UTF8')), 1, 16), 'hex')::uuid
$$;

CREATE TABLE relaybox_outbox_keys (
    digest     UUID NOT NULL,
    first_seen INTEGER NOT NULL,
    CONSTRAINT relaybox_outbox_keys_pkey PRIMARY KEY (digest)
);

-- A day-encoded id (0032's relaybox_day_id) whose day is at most $2 - 1: the ids a
-- table draws while its conversion to partitions is under way stay below the bound
-- CHECK that conversion added (relaybox.store.partitions), however late it finishes,
-- so no insert is refused meanwhile. Still unique: the low 32 bits are the sequence's.
CREATE FUNCTION relaybox_day_id_below(seq regclass, bound integer) RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT (least(floor(extract(epoch FROM statement_timestamp()) / 86400)::bigint,
                  bound - 1) << 32)
           | (nextval(seq) & 4294967295)
$$;

-- A database without sent history has nothing to backfill.
INSERT INTO relaybox_keys_backfill (kind, finished_at)
SELECT 'outbox', extract(epoch FROM now()) WHERE NOT EXISTS (SELECT 1 FROM relaybox_outbox);
