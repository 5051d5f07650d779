-- Endpoint headers and credentials, and failure thresholds for operational events.
-- headers: the endpoint's custom request headers, a JSON object (NULL: none).
-- credentials: the endpoint's HTTP credentials (Basic, bearer token or OAuth2 client
-- credentials) as JSON sealed like the signing secrets (outbound.vault); NULL: none.
-- credentials_type says which kind is set, so that answers can say that one is set
-- without opening it.
-- failures: attempts failed in a row (a success ends the run); failing_level: the
-- highest failure threshold announced by relaybox.endpoint.failing since the endpoint
-- last recovered (0: not failing), so that each crossing is announced once and
-- relaybox.endpoint.recovered once after it.
ALTER TABLE relaybox_endpoints ADD COLUMN headers TEXT;
ALTER TABLE relaybox_endpoints ADD COLUMN credentials TEXT;
ALTER TABLE relaybox_endpoints ADD COLUMN credentials_type TEXT;
ALTER TABLE relaybox_endpoints ADD COLUMN failures INTEGER NOT NULL DEFAULT 0;
ALTER TABLE relaybox_endpoints ADD COLUMN failing_level INTEGER NOT NULL DEFAULT 0;
