-- The keys tables' indexes by day (relaybox.store.keys_index): each exists only while a
-- keys window applies to its table. Run on a DDL connection of their own, outside any
-- transaction ({table} and {index}: names of relaybox.store.keys_index.DAY_INDEXES).

-- name: keys_day_index_state
-- Each of the tables $1 that exists, and whether its index by day ($2, the same order)
-- exists and is valid (a CREATE INDEX CONCURRENTLY killed halfway leaves it invalid).
SELECT t.name AS table_name, i.indisvalid AS valid
FROM unnest($1::text[], $2::text[]) AS t(name, index_name)
LEFT JOIN pg_index i ON i.indexrelid = to_regclass(t.index_name)
WHERE to_regclass(t.name) IS NOT NULL

-- name: keys_day_index_lock
-- One builder or dropper of these indexes at a time, whatever runs the expiry (the
-- maintenance loop, `relaybox purge`): a session lock on the DDL connection, released
-- when it closes (a killed process's too).
SELECT pg_try_advisory_lock(7232, 2) AS got

-- name: keys_day_index_unlock
SELECT pg_advisory_unlock(7232, 2)

-- name: keys_day_index_create
CREATE INDEX CONCURRENTLY IF NOT EXISTS {index} ON {table} (first_seen)

-- name: keys_day_index_drop
DROP INDEX CONCURRENTLY IF EXISTS {index}
