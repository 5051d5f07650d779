-- The keys kept for good, narrower (the PostgreSQL migration 0038 explains them):
-- an event key keeps 8 bytes of its fingerprint digest as an INTEGER (the first 8 of
-- the 16 it kept, as a signed big-endian integer), a scope is the 32-bit top half of
-- the number it was (scope >> 32), and an idempotency key names its message by 16
-- bytes when relaybox made the id ('msg_' + 27 hex digits: the bytes of '00000' and
-- those digits), by its text otherwise. SQLite before 3.41 has no unhex(): the ids of
-- the keys stored before this migration stay as text (message_uuid NULL), which every
-- statement reads alike. Each table made again the SQLite way (copy, drop, rename),
-- its indexes under the same names, in the migration's one transaction.
CREATE TABLE relaybox_event_keys_0038 (
    digest      BLOB PRIMARY KEY,
    fingerprint INTEGER NOT NULL,
    first_seen  INTEGER NOT NULL,
    scope       INTEGER NOT NULL,
    inbox_id    INTEGER NOT NULL
) WITHOUT ROWID;
-- The fingerprint digest's first 8 bytes read from its hex, byte by byte (the first
-- one signed).
INSERT INTO relaybox_event_keys_0038 (digest, fingerprint, first_seen, scope, inbox_id)
SELECT digest, (((instr('0123456789ABCDEF', substr(x, 1, 1)) - 1) * 16 + instr('0123456789ABCDEF', substr(x, 2, 1)) - 1) - 256 * (((instr('0123456789ABCDEF', substr(x, 1, 1)) - 1) * 16 + instr('0123456789ABCDEF', substr(x, 2, 1)) - 1) >= 128)) * 72057594037927936
           + (((instr('0123456789ABCDEF', substr(x, 3, 1)) - 1) * 16 + instr('0123456789ABCDEF', substr(x, 4, 1)) - 1) << 48)
           + (((instr('0123456789ABCDEF', substr(x, 5, 1)) - 1) * 16 + instr('0123456789ABCDEF', substr(x, 6, 1)) - 1) << 40)
           + (((instr('0123456789ABCDEF', substr(x, 7, 1)) - 1) * 16 + instr('0123456789ABCDEF', substr(x, 8, 1)) - 1) << 32)
           + (((instr('0123456789ABCDEF', substr(x, 9, 1)) - 1) * 16 + instr('0123456789ABCDEF', substr(x, 10, 1)) - 1) << 24)
           + (((instr('0123456789ABCDEF', substr(x, 11, 1)) - 1) * 16 + instr('0123456789ABCDEF', substr(x, 12, 1)) - 1) << 16)
           + (((instr('0123456789ABCDEF', substr(x, 13, 1)) - 1) * 16 + instr('0123456789ABCDEF', substr(x, 14, 1)) - 1) << 8)
           + (((instr('0123456789ABCDEF', substr(x, 15, 1)) - 1) * 16 + instr('0123456789ABCDEF', substr(x, 16, 1)) - 1) << 0),
       first_seen, scope >> 32, inbox_id
FROM (SELECT hex(fingerprint) AS x, * FROM relaybox_event_keys);
DROP TABLE relaybox_event_keys;
ALTER TABLE relaybox_event_keys_0038 RENAME TO relaybox_event_keys;
CREATE INDEX relaybox_event_keys_age ON relaybox_event_keys (first_seen);
CREATE INDEX relaybox_event_keys_scope_age ON relaybox_event_keys (scope, first_seen);

CREATE TABLE relaybox_message_keys_0038 (
    digest       BLOB PRIMARY KEY,
    first_seen   INTEGER NOT NULL,
    scope        INTEGER NOT NULL,
    message_uuid BLOB,
    message_text TEXT,
    CHECK ((message_uuid IS NULL) <> (message_text IS NULL))
) WITHOUT ROWID;
INSERT INTO relaybox_message_keys_0038 (digest, first_seen, scope, message_uuid, message_text)
SELECT digest, first_seen, scope >> 32, NULL, message_id FROM relaybox_message_keys;
DROP TABLE relaybox_message_keys;
ALTER TABLE relaybox_message_keys_0038 RENAME TO relaybox_message_keys;
CREATE INDEX relaybox_message_keys_age ON relaybox_message_keys (first_seen);
CREATE INDEX relaybox_message_keys_scope_age ON relaybox_message_keys (scope, first_seen);

UPDATE relaybox_business_keys SET scope = scope >> 32;
