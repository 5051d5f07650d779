-- Erasing one subject, continued (relaybox.erasure): how long the subject index lives,
-- and projections.
--
-- relaybox_subjects lives as long as the rows it points to hold anything an erasure
-- empties (RetentionStore.forget_subjects): the purge, an erasure and a dropped time
-- partition delete the index rows of the rows they emptied or dropped, once nothing
-- found through them holds data. An inbox reference is read as a number (a range of a
-- dropped partition's ids, an outbox row's inbox_id) and a message reference as text,
-- each through a partial index of its kind, in place of the index on ref (as many
-- index entries a row as before).
DROP INDEX relaybox_subjects_ref;
CREATE INDEX relaybox_subjects_inbox ON relaybox_subjects (CAST(ref AS INTEGER)) WHERE kind = 'inbox';
CREATE INDEX relaybox_subjects_message ON relaybox_subjects (ref) WHERE kind = 'message';

-- A versioned projection's state (ctx.project) holds the event's data: subject is the
-- digest of the subject of the event whose state it holds (NULL: that event named none,
-- or the state came from a reconciliation), written with the state, so that erasing
-- the subject empties it (state NULL, erased_at set, the version stays, so a stale
-- event is still refused).
ALTER TABLE relaybox_projections ADD COLUMN subject BLOB;
ALTER TABLE relaybox_projections ADD COLUMN erased_at REAL;
CREATE INDEX relaybox_projections_subject ON relaybox_projections (subject)
    WHERE subject IS NOT NULL;
-- A tenant's erasure finds the states its events wrote by the events it empties
-- (projections hold no tenant).
CREATE INDEX relaybox_projections_inbox ON relaybox_projections (inbox_id)
    WHERE inbox_id IS NOT NULL;
ALTER TABLE relaybox_erasures ADD COLUMN projections INTEGER NOT NULL DEFAULT 0;
