-- Tracing (relaybox.tracing, docs/tracing.md): the W3C trace context of the request
-- that received an event (the traceparent its sender sent, else relaybox's receive
-- span) is kept with its inbox row, and the context a message was published in with
-- the message, so that the handler's span and every delivery attempt's span join the
-- trace however long after and in whichever process they run. NULL when tracing is
-- off. A version-00 traceparent only (55 characters); the constraints are NOT VALID:
-- the rows already stored are all NULL, no need to read them under the lock.
ALTER TABLE relaybox_inbox ADD COLUMN traceparent text;
ALTER TABLE relaybox_inbox ADD CONSTRAINT relaybox_inbox_traceparent CHECK (
    traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$') NOT VALID;
ALTER TABLE relaybox_messages ADD COLUMN traceparent text;
ALTER TABLE relaybox_messages ADD CONSTRAINT relaybox_messages_traceparent CHECK (
    traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$') NOT VALID;

-- An endpoint's requests carry the attempt's traceparent (tracing on) unless its
-- receiver must not see it: trace_context false (EndpointSpec.trace_context).
ALTER TABLE relaybox_endpoints ADD COLUMN trace_context boolean NOT NULL DEFAULT true;
