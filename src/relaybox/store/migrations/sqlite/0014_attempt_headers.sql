-- The request and response headers of a delivery attempt, for the tenant portal and
-- the dashboard: a JSON object {"request": [[name, value], ...], "response": [...]},
-- bounded by outbound.attempt_headers_bytes; NULL where nothing was recorded (older
-- attempts, channels that are not HTTP). Retention clears it with the response.
ALTER TABLE relaybox_outbox_attempts ADD COLUMN headers TEXT;
