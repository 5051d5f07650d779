-- Named queries of endpoint headers and credentials, and of the failure thresholds
-- behind the operational events (PostgreSQL; sqlite_credentials.sql in the same order).

-- name: endpoint_headers_set
UPDATE relaybox_endpoints SET headers = $2 WHERE id = $1 RETURNING id

-- name: endpoint_credentials_set
-- $2 the kind (NULL: none), $3 the sealed JSON.
UPDATE relaybox_endpoints SET credentials_type = $2, credentials = $3 WHERE id = $1
RETURNING id

-- name: endpoint_failing_level
-- Raise the threshold announced (never lower it: two batches may cross at once).
UPDATE relaybox_endpoints SET failing_level = $2
WHERE id = $1 AND failing_level < $2
RETURNING id, tenant, url, failing_since

-- name: endpoints_recovered
-- A success of endpoints that were announced failing: the run ends and the announced
-- threshold goes back to 0; returns those that were failing (announced once).
UPDATE relaybox_endpoints SET failing_since = NULL, failures = 0, failing_level = 0
WHERE id = ANY($1::text[]) AND failing_level > 0
RETURNING id, tenant, url

-- name: endpoint_credentials_page
-- Stored credentials after endpoint id $1, in id order (the sealing pass).
SELECT id, credentials FROM relaybox_endpoints
WHERE credentials IS NOT NULL AND id > $1 ORDER BY id LIMIT $2

-- name: endpoint_credentials_swap
-- Compare-and-set, as endpoint_secret_swap.
UPDATE relaybox_endpoints SET credentials = $3 WHERE id = $1 AND credentials = $2
RETURNING id
