-- The keys tables' indexes by day (relaybox.store.keys_index): each exists only while a
-- keys window applies to its table ({table} and {index}: names of
-- relaybox.store.keys_index.DAY_INDEXES).

-- name: keys_day_index_state
-- Whether table {table} exists (a row) and has its index by day (valid: 1).
SELECT t.name AS table_name, (i.name IS NOT NULL) AS valid
FROM sqlite_master AS t
LEFT JOIN sqlite_master AS i ON i.type = 'index' AND i.name = '{index}'
WHERE t.type = 'table' AND t.name = '{table}'

-- name: keys_day_index_create
CREATE INDEX IF NOT EXISTS {index} ON {table} (first_seen)

-- name: keys_day_index_drop
DROP INDEX IF EXISTS {index}
