-- The event keys' and the idempotency keys' 16-byte digests (0027) as uuid, as the
-- business keys keep theirs (0031): 16 bytes with no length header, where a bytea
-- took 17 in the heap and 25 in each PRIMARY KEY entry (32 with its alignment, 24 as
-- a uuid). The same 16 bytes (relaybox.store.keys): the statements pass them as
-- bytea and convert them (encode(d, 'hex')::uuid in, uuid_send(d) out), on both
-- stores alike. An event key's row keeps its width (the heap's 8-byte alignment:
-- 76 bytes of row for 78, 80 either way); each PRIMARY KEY entry loses 8 bytes, an
-- idempotency key's too. Each ALTER TABLE rewrites its table and rebuilds its
-- indexes under an exclusive lock: accepts and publishes wait for it, for a time that
-- grows with the keys kept. SQLite keeps its 16-byte blobs.
ALTER TABLE relaybox_event_keys
    ALTER COLUMN digest TYPE UUID USING encode(digest, 'hex')::uuid,
    ALTER COLUMN fingerprint TYPE UUID USING encode(fingerprint, 'hex')::uuid;
ALTER TABLE relaybox_message_keys
    ALTER COLUMN digest TYPE UUID USING encode(digest, 'hex')::uuid;
