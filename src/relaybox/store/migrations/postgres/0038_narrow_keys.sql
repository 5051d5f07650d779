-- The keys kept for good, narrower (docs/scaling.md, "Bytes on disk per event"). A
-- heap row costs 24 bytes of header, its data rounded up to 8 bytes, and 4 bytes of
-- line pointer: each table is made again with narrower columns, in an order that
-- leaves no padding.
--
-- * An event key keeps 8 bytes of its delivery's fingerprint digest (a bigint: the
--   first 8 of the 16 it kept, read as a signed big-endian integer; the accept
--   computes the same from the fingerprint, relaybox.store.keys.fingerprint_digest):
--   a changed payload under an event id already seen is still told from a repeat
--   unless the two collide (2^-64 a pair). 40 bytes of data, 68 a row (84 before).
-- * A scope (the source of an event key or a business key, the tenant of an
--   idempotency key) is a 32-bit integer: the top half of the 64-bit number it was
--   (scope >> 32, as relaybox.store.keys.scope_of now computes it), so the rows of
--   before and after agree. It serves only the expiry by a source's or a tenant's
--   keys window (relaybox.retention.policy.keys_plan: names sharing a number get the
--   longest of their windows).
-- * An idempotency key names its message by 16 bytes (uuid) when relaybox made the id
--   ('msg_' + 27 hex digits: the uuid of '00000' and those digits; the statements give
--   the text back), by its text otherwise (an id written by hand, or by a version that
--   made others), in a column NULL in every other row. 40 bytes of data, 68 a row
--   (93 before).
-- * A business key: 32 bytes of data, 60 a row (68 before).
--
-- Each table is copied into its new form, the old one dropped and the new one renamed,
-- with its PRIMARY KEY and its index by day under the same names. The migration runs
-- in one transaction holding the three tables under an exclusive lock from its start
-- until COMMIT: accepts (event keys), publishes with an idempotency key (message keys) and
-- once() (business keys) wait for the whole migration: about 4 s per million keys of
-- the three tables together (1,000,000 keys in each took 11.2 and 13.5 s on a 2-core
-- machine shared with other work; docs/operating.md, "Keys apart from the history").

-- An id relaybox made as the 16 bytes an idempotency key keeps of it; NULL for any
-- other id (kept as text). Python does the same (relaybox.store.keys.message_ref).
CREATE FUNCTION relaybox_message_uuid(id text) RETURNS uuid
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT CASE WHEN id ~ '^msg_[0-9a-f]{27}$' THEN ('00000' || substr(id, 5))::uuid END
$$;

-- Locked first, all three, before any is read: a key that a process still running the
-- previous version commits while a table is copied would otherwise stay in the table
-- that is dropped (and its event be accepted again as new). Its accept waits for the
-- migration instead (or committed before it, and is copied).
LOCK TABLE relaybox_event_keys, relaybox_message_keys, relaybox_business_keys
    IN ACCESS EXCLUSIVE MODE;

CREATE TABLE relaybox_event_keys_0038 (
    inbox_id    BIGINT NOT NULL,
    fingerprint BIGINT NOT NULL,
    scope       INTEGER NOT NULL,
    first_seen  INTEGER NOT NULL,
    digest      UUID NOT NULL
);
INSERT INTO relaybox_event_keys_0038 (inbox_id, fingerprint, scope, first_seen, digest)
SELECT inbox_id, ('x' || substr(encode(uuid_send(fingerprint), 'hex'), 1, 16))::bit(64)::bigint,
       (scope >> 32)::integer, first_seen, digest
FROM relaybox_event_keys;
DROP TABLE relaybox_event_keys;
ALTER TABLE relaybox_event_keys_0038 RENAME TO relaybox_event_keys;
ALTER TABLE relaybox_event_keys ADD CONSTRAINT relaybox_event_keys_pkey PRIMARY KEY (digest);
CREATE INDEX relaybox_event_keys_age ON relaybox_event_keys (first_seen);

CREATE TABLE relaybox_message_keys_0038 (
    scope        INTEGER NOT NULL,
    first_seen   INTEGER NOT NULL,
    digest       UUID NOT NULL,
    message_uuid UUID,
    message_text TEXT,
    CONSTRAINT relaybox_message_keys_message_check
        CHECK ((message_uuid IS NULL) <> (message_text IS NULL))
);
INSERT INTO relaybox_message_keys_0038 (scope, first_seen, digest, message_uuid, message_text)
SELECT (scope >> 32)::integer, first_seen, digest, relaybox_message_uuid(message_id),
       CASE WHEN relaybox_message_uuid(message_id) IS NULL THEN message_id END
FROM relaybox_message_keys;
DROP TABLE relaybox_message_keys;
ALTER TABLE relaybox_message_keys_0038 RENAME TO relaybox_message_keys;
ALTER TABLE relaybox_message_keys ADD CONSTRAINT relaybox_message_keys_pkey PRIMARY KEY (digest);
CREATE INDEX relaybox_message_keys_age ON relaybox_message_keys (first_seen);

CREATE TABLE relaybox_business_keys_0038 (
    fingerprint BIGINT NOT NULL,
    scope       INTEGER NOT NULL,
    first_seen  INTEGER NOT NULL,
    digest      UUID NOT NULL
);
INSERT INTO relaybox_business_keys_0038 (fingerprint, scope, first_seen, digest)
SELECT fingerprint, (scope >> 32)::integer, first_seen, digest FROM relaybox_business_keys;
DROP TABLE relaybox_business_keys;
ALTER TABLE relaybox_business_keys_0038 RENAME TO relaybox_business_keys;
ALTER TABLE relaybox_business_keys ADD CONSTRAINT relaybox_business_keys_pkey PRIMARY KEY (digest);
CREATE INDEX relaybox_business_keys_age ON relaybox_business_keys (first_seen);
