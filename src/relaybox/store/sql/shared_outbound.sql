-- The sending side's SQL both backends run as written (sql/<backend>_outbound.sql has
-- the rest).

-- part: endpoint_row
-- An endpoint as endpoint_get and endpoint_list read it: with its lane's settings.
SELECT e.id, e.tenant, e.url, e.description, e.event_types, e.status, e.disabled_reason,
       e.signature, e.timeout, e.schedule, e.failing_since, e.created_at, e.updated_at,
       l.max_in_flight, l.rate_limit, e.payload_filter, e.paused_at, e.headers, e.credentials_type, e.ordered, e.on_dead,
       e.trace_context
FROM relaybox_endpoints e JOIN relaybox_lanes l ON l.lane = e.id

-- part: ordered_turn
-- Ordered delivery: the outbox row f (a candidate of a lease) is not due while an
-- earlier row of its key to its endpoint is pending, or dead and the endpoint holds
-- the key for a dead one (on_dead).
AND (f.ordering_key IS NULL OR NOT EXISTS (
    SELECT 1 FROM relaybox_outbox h
    WHERE h.endpoint_id = f.endpoint_id AND h.ordering_key = f.ordering_key
      AND h.sequence < f.sequence AND h.status IN ('pending', 'dead')
      AND (h.status = 'pending'
           OR EXISTS (SELECT 1 FROM relaybox_endpoints d
                      WHERE d.id = f.endpoint_id AND d.on_dead = 'hold'))))
