-- Sending flow per endpoint. payload_filter: the endpoint's payload filter (JSON text,
-- relaybox.outbound.filters), checked when saved and evaluated by publish and by replay
-- missing; NULL: every message of its event types. paused_at: when the endpoint was
-- paused (NULL: not paused); the lease skips a paused endpoint's lane, so its
-- deliveries wait, pending, until it is resumed.
ALTER TABLE relaybox_endpoints ADD COLUMN payload_filter TEXT;
ALTER TABLE relaybox_endpoints ADD COLUMN paused_at REAL;
