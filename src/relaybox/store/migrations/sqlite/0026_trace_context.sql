-- Tracing (relaybox.tracing, docs/tracing.md): the W3C trace context of the request
-- that received an event (the traceparent its sender sent, else relaybox's receive
-- span) is kept with its inbox row, and the context a message was published in with
-- the message, so that the handler's span and every delivery attempt's span join the
-- trace however long after and in whichever process they run. NULL when tracing is
-- off. A version-00 traceparent only (55 characters, lower-case hex).
ALTER TABLE relaybox_inbox ADD COLUMN traceparent TEXT CHECK (
    length(traceparent) = 55
    AND traceparent GLOB '00-[0-9a-f]*-[0-9a-f]*-[0-9a-f][0-9a-f]'
    AND substr(traceparent, 36, 1) = '-'
    AND NOT substr(traceparent, 4, 32) GLOB '*[^0-9a-f]*'
    AND NOT substr(traceparent, 37, 16) GLOB '*[^0-9a-f]*');
ALTER TABLE relaybox_messages ADD COLUMN traceparent TEXT CHECK (
    length(traceparent) = 55
    AND traceparent GLOB '00-[0-9a-f]*-[0-9a-f]*-[0-9a-f][0-9a-f]'
    AND substr(traceparent, 36, 1) = '-'
    AND NOT substr(traceparent, 4, 32) GLOB '*[^0-9a-f]*'
    AND NOT substr(traceparent, 37, 16) GLOB '*[^0-9a-f]*');

-- An endpoint's requests carry the attempt's traceparent (tracing on) unless its
-- receiver must not see it: trace_context false (EndpointSpec.trace_context).
ALTER TABLE relaybox_endpoints ADD COLUMN trace_context INTEGER NOT NULL DEFAULT 1;
