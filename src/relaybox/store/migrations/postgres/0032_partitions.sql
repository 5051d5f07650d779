-- Time partitions for the history (docs/scaling.md, "Time partitions"). This migration
-- only prepares them; `relaybox migrate` with retention.partitions = "day" or "week"
-- (or `relaybox migrate --partitions day`) turns the live tables into partitioned
-- ones (relaybox.store.partitions), without copying the history.
--
-- A day-encoded id: the day (days since 1970-01-01 UTC, by the database's clock) in
-- the high 32 bits, the sequence's next value in the low 32. Ids still grow with time
-- (a day's ids are above every earlier day's), so a RANGE on the id is a range on
-- time, and a lookup by id still finds its one partition.
CREATE FUNCTION relaybox_day_id(seq regclass) RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT (floor(extract(epoch FROM statement_timestamp()) / 86400)::bigint << 32)
           | (nextval(seq) & 4294967295)
$$;

-- The inbox ids the accept statements draw before they insert (their event keys name
-- them): the sequence as before; the partitioning replaces it with relaybox_day_id.
CREATE FUNCTION relaybox_inbox_id() RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT nextval('relaybox_inbox_id_seq')
$$
