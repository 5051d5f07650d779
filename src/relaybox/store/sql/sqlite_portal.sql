-- Portal links and sessions (SQLite; numbered ?n parameters, same names and order as
-- postgres_portal.sql): what ends a signed token before its expiry, for every process.

-- name: portal_token_revoke
-- A logout, or the opening of a single-use link. The row comes back only to the call
-- that wrote it: of two openings of one link, one gets it, the other nothing.
INSERT INTO relaybox_portal_revoked_tokens (token_id, expires_at) VALUES (?1, ?2)
ON CONFLICT (token_id) DO NOTHING
RETURNING token_id

-- name: portal_token_trim
-- At most 16 rows of tokens that have expired anyway, dropped by whoever revokes a
-- token: the table keeps near its live rows even where maintenance does not run, and
-- the cost stays bounded per call.
DELETE FROM relaybox_portal_revoked_tokens WHERE token_id IN (
    SELECT token_id FROM relaybox_portal_revoked_tokens WHERE expires_at < ?1
    ORDER BY expires_at LIMIT 16
)

-- name: portal_session_live
-- Per portal request: the session was not logged out of, and the API key that asked
-- for its link (?2; NULL: the application made it) is not revoked. Two primary-key
-- lookups in one statement.
SELECT NOT EXISTS (SELECT 1 FROM relaybox_portal_revoked_tokens WHERE token_id = ?1)
   AND (?2 IS NULL
        OR EXISTS (SELECT 1 FROM relaybox_api_keys WHERE id = ?2 AND revoked_at IS NULL))
   AS live

-- name: portal_key_active
-- Opening a link: the API key that asked for it is still active.
SELECT 1 AS active FROM relaybox_api_keys WHERE id = ?1 AND revoked_at IS NULL

-- name: portal_tokens_purge
-- Maintenance: rows of tokens that have expired anyway limit nothing any more.
DELETE FROM relaybox_portal_revoked_tokens WHERE expires_at < ?1
RETURNING token_id
