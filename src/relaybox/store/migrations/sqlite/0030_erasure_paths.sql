-- Erasing one subject, continued (relaybox.erasure).
--
-- An event type of the catalog may say where its messages name their subject: a
-- dotted JSON path into the envelope (data.customer.id), read by every publish of the
-- type that does not pass subject= itself, so its message is indexed in
-- relaybox_subjects as if it had. NULL: the type names none.
ALTER TABLE relaybox_event_types ADD COLUMN subject TEXT;

-- An erasure also redacts the error text of the subject's rows (an exception quoting
-- the payload): last_error of inbox and outbox rows and the error of each attempt.
-- The handler attempts it redacted are counted apart from the delivery attempts.
ALTER TABLE relaybox_erasures ADD COLUMN inbox_attempts INTEGER NOT NULL DEFAULT 0;

-- An operational event about a row of a subject (relaybox.inbox.dead with the
-- handler's error, relaybox.message.attempt.exhausted with the last error) may quote
-- the subject's data: its message is indexed under the digests of that row, found
-- by the row's reference.
CREATE INDEX relaybox_subjects_ref ON relaybox_subjects (ref);
