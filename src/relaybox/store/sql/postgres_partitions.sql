-- Time partitions of the history (relaybox.store.partitions). The DDL blocks name
-- tables, so they are templates: {table}, {part}, {key}, {lo}, {hi}, ... are filled in
-- by relaybox.store.partitions with names and numbers it made itself (never input).

-- name: part_lock
-- One partition maintainer (or converter) at a time: a session lock on the DDL
-- connection, released when it closes (a killed process's too).
SELECT pg_try_advisory_lock(7232, 1) AS got

-- name: part_today
-- Today by the database's clock, which the day-encoded ids use (days since 1970-01-01).
SELECT floor(extract(epoch FROM statement_timestamp()) / 86400)::bigint AS day

-- name: part_is_partitioned
-- Whether table $1 is partitioned already.
SELECT EXISTS (
    SELECT 1 FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partrelid
    WHERE c.relname = $1 AND c.relnamespace = current_schema()::regnamespace) AS yes

-- name: part_list
-- The partitions of table $1: name and bound expression ("FOR VALUES FROM (..) TO
-- (..)" or "DEFAULT").
SELECT c.relname AS name, pg_get_expr(c.relpartbound, c.oid) AS bound
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
JOIN pg_class p ON p.oid = i.inhparent
WHERE p.relname = $1 AND p.relnamespace = current_schema()::regnamespace
ORDER BY c.relname

-- name: part_detached
-- Tables a maintenance run detached and marked for its DROP, which it did not reach
-- (the process was killed): the next run drops them.
SELECT c.relname AS name FROM pg_class c
WHERE c.relkind = 'r' AND c.relnamespace = current_schema()::regnamespace
  AND obj_description(c.oid, 'pg_class') = 'relaybox: detached, to drop'

-- name: part_bound_check
-- The bound CHECK a conversion added to live table $1 (name like $2), if any:
-- its name and whether it is validated.
SELECT conname AS name, convalidated AS valid FROM pg_constraint
WHERE conrelid = to_regclass($1) AND contype = 'c' AND conname LIKE $2

-- name: part_checks
-- The CHECK constraints of table $1 (but a conversion's bound), to copy on its parent.
SELECT conname AS name, pg_get_constraintdef(oid) AS def FROM pg_constraint
WHERE conrelid = to_regclass($1) AND contype = 'c' AND conname NOT LIKE '%\_bound\_%'

-- name: part_indexes
-- The indexes of table $1 that are not a constraint's, with their definitions.
SELECT c.relname AS name, pg_get_indexdef(c.oid) AS def
FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
WHERE x.indrelid = to_regclass($1)
  AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = x.indexrelid)
ORDER BY c.relname

-- name: part_constraint_indexes
-- The indexes behind constraints (primary key, UNIQUE) of table $1.
SELECT k.conname AS name, k.contype AS kind FROM pg_constraint k
WHERE k.conrelid = to_regclass($1) AND k.contype IN ('p', 'u')

-- name: part_has_constraint
SELECT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = to_regclass($1) AND conname = $2) AS yes

-- name: part_id_function_capped
-- The conversion's first step for a table whose inserts draw their ids through a
-- function (relaybox_inbox_id()): day-encoded ids, held below the first bound (day
-- {day}) until every table of its group is switched.
CREATE OR REPLACE FUNCTION {fn}() RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT relaybox_day_id_below('{seq}', {day})
$$

-- name: part_id_function
-- Every table of the group switched: the ids by day, unheld.
CREATE OR REPLACE FUNCTION {fn}() RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT relaybox_day_id('{seq}')
$$

-- name: part_id_function_held
-- Whether function $1 still holds its ids below a bound.
SELECT EXISTS (SELECT 1 FROM pg_proc WHERE proname = $1
               AND pronamespace = current_schema()::regnamespace
               AND prosrc LIKE '%relaybox_day_id_below%') AS yes

-- name: part_set_id_capped
-- The conversion's first step for a table: day-encoded ids, held below the first
-- bound (day {day}) until every table of its group is switched, so the bound CHECK
-- never refuses a row however late the switch comes.
ALTER TABLE {table} ALTER COLUMN id SET DEFAULT relaybox_day_id_below('{seq}', {day})

-- name: part_set_id_default
ALTER TABLE {table} ALTER COLUMN id SET DEFAULT relaybox_day_id('{seq}')

-- name: part_id_held
-- Whether table $1's id default still holds its ids below a bound.
SELECT EXISTS (SELECT 1 FROM pg_attrdef d
               JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
               WHERE d.adrelid = to_regclass($1) AND a.attname = 'id'
                 AND pg_get_expr(d.adbin, d.adrelid) LIKE '%relaybox_day_id_below%') AS yes

-- name: part_max_key
-- The highest key of table {table} (its index: one probe).
SELECT max({key}) AS newest FROM {table}

-- name: part_index_invalid
-- Whether index $1 exists and is invalid (a CREATE INDEX CONCURRENTLY killed halfway).
SELECT EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = to_regclass($1) AND NOT indisvalid)
    AS yes

-- name: part_drop_index_concurrently
DROP INDEX CONCURRENTLY IF EXISTS {name}

-- name: part_create_lookup
-- A plain index where a UNIQUE one that goes served lookups, built without blocking
-- writes; the switch copies it on the parent, where the attached table's serves.
CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {table} {columns}

-- name: part_drop_index
DROP INDEX IF EXISTS {name}

-- name: part_add_bound
-- NOT VALID: added at once; VALIDATE then reads the table without blocking writes.
ALTER TABLE {table} ADD CONSTRAINT {name} CHECK ({key} IS NOT NULL AND {key} < {hi}) NOT VALID

-- name: part_validate_bound
ALTER TABLE {table} VALIDATE CONSTRAINT {name}

-- name: part_drop_constraint
ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {name}

-- name: part_lock_table
LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE

-- name: part_rename_table
ALTER TABLE {table} RENAME TO {part}

-- name: part_rename_index
ALTER INDEX {name} RENAME TO {new}

-- name: part_rename_constraint
ALTER TABLE {table} RENAME CONSTRAINT {name} TO {new}

-- name: part_create_parent
CREATE TABLE {table} (LIKE {part} INCLUDING DEFAULTS) PARTITION BY RANGE ({key})

-- name: part_add_check
ALTER TABLE {table} ADD CONSTRAINT {name} {def}

-- name: part_add_pkey
ALTER TABLE {table} ADD CONSTRAINT {table}_pkey PRIMARY KEY ({columns})

-- name: part_attach_first
-- The live table becomes the first partition: its validated bound CHECK spares the scan,
-- its indexes are taken as the parent's (no index is built).
ALTER TABLE {table} ATTACH PARTITION {part} FOR VALUES FROM (MINVALUE) TO ({hi})

-- name: part_create_default
CREATE TABLE IF NOT EXISTS {table}_default PARTITION OF {table} DEFAULT

-- name: part_own_sequence
-- The sequence belongs to the parent: dropping the first partition keeps it.
ALTER SEQUENCE {seq} OWNED BY {table}.id

-- name: part_create
CREATE TABLE IF NOT EXISTS {part} PARTITION OF {table} FOR VALUES FROM ({lo}) TO ({hi})

-- name: part_default_has
-- Whether the DEFAULT partition holds rows of the range a new partition takes.
SELECT EXISTS (SELECT 1 FROM {table}_default WHERE {key} >= {lo} AND {key} < {hi}) AS yes

-- name: part_create_loose
-- A new partition whose rows wait in the DEFAULT partition: made apart, filled, attached.
CREATE TABLE {part} (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)

-- name: part_move_default
-- The rows of the new partition's range leave the DEFAULT partition for it.
WITH moved AS (
    DELETE FROM {table}_default WHERE {key} >= {lo} AND {key} < {hi} RETURNING *
)
INSERT INTO {part} SELECT * FROM moved

-- name: part_attach
ALTER TABLE {table} ATTACH PARTITION {part} FOR VALUES FROM ({lo}) TO ({hi})

-- name: part_detach
-- Not CONCURRENTLY: PostgreSQL refuses that while a DEFAULT partition exists. The lock
-- on the parent is short (lock_timeout bounds the wait; the next run tries again).
ALTER TABLE {table} DETACH PARTITION {part}

-- name: part_mark_detached
COMMENT ON TABLE {part} IS 'relaybox: detached, to drop'

-- name: part_operations_drop
-- The readable business keys (relaybox_operations) of the events of inbox partition
-- {part}, which is about to be dropped: they go with their events, as the purge drops
-- them with a payload; their digests (relaybox_business_keys) keep deciding. Only once
-- the backfill of business keys stored before migration 0031 has finished.
DELETE FROM relaybox_operations o USING {part} i
WHERE o.inbox_id = i.id
  AND EXISTS (SELECT 1 FROM relaybox_keys_backfill
              WHERE kind = 'operation' AND finished_at IS NOT NULL)

-- name: part_drop
DROP TABLE IF EXISTS {part}

-- name: part_inbox_holds
-- What keeps inbox partition {part} (ids {lo} to {hi}) from being dropped: a pending
-- (or processing) event, an undiscarded dead letter, the original of an open
-- quarantine entry.
SELECT EXISTS (SELECT 1 FROM {part} WHERE status = 'pending') AS pending,
       EXISTS (SELECT 1 FROM {part} WHERE status = 'dead' AND discarded_at IS NULL) AS dead,
       EXISTS (SELECT 1 FROM relaybox_quarantine q
               WHERE q.inbox_id >= {lo} AND q.inbox_id < {hi} AND q.resolved_at IS NULL)
           AS quarantined

-- name: part_inbox_ages
-- The newest change of inbox partition {part}'s rows, per tenant and source (each at
-- its own retention age).
SELECT tenant, source, max(updated_at) AS newest FROM {part} GROUP BY tenant, source

-- name: part_quarantine_holds
SELECT false AS pending, false AS dead,
       EXISTS (SELECT 1 FROM {part} WHERE resolved_at IS NULL) AS quarantined

-- name: part_quarantine_ages
SELECT tenant, source, max(greatest(received_at, resolved_at)) AS newest
FROM {part} GROUP BY tenant, source

-- name: part_outbox_holds
-- What keeps outbox partition {part} (ids {lo} to {hi}) from being dropped: a
-- delivery or handler row still to send (pending, which a paused endpoint's are, or
-- held), or one under a dispatcher's lease.
SELECT EXISTS (SELECT 1 FROM {part} WHERE status IN ('pending', 'held')) AS pending,
       EXISTS (SELECT 1 FROM relaybox_outbox_leases l
               WHERE l.outbox_id >= {lo} AND l.outbox_id < {hi}) AS leased

-- name: part_outbox_ages
-- The newest change of outbox partition {part}'s rows, per tenant (each at its
-- tenant's outbound age; a dead delivery's change is its death).
SELECT tenant, NULL::text AS source, max(updated_at) AS newest FROM {part} GROUP BY tenant

-- name: part_messages_holds
-- What keeps messages partition {part} (ids {lo} to {hi}) from being dropped: a
-- delivery of one of its messages still live (pending, held, or dead and not purged:
-- it may be redelivered, which reads the message).
SELECT EXISTS (SELECT 1 FROM relaybox_outbox o
               WHERE o.message_id >= {lo} AND o.message_id < {hi}
                 AND (o.status IN ('pending', 'held')
                      OR (o.status = 'dead' AND o.purged_at IS NULL))) AS live

-- name: part_messages_ages
SELECT tenant, NULL::text AS source, max(created_at) AS newest FROM {part} GROUP BY tenant
