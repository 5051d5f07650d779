-- The outbox's keys table is PostgreSQL's (migrations/postgres/0034_outbox_keys.sql),
-- for its time partitions: SQLite keeps one outbox table and its UNIQUE (channel, key),
-- which decides alone. Its backfill has nothing to do here.
INSERT INTO relaybox_keys_backfill (kind, finished_at)
VALUES ('outbox', CAST(strftime('%s', 'now') AS REAL));
