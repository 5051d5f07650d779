-- Dashboard sessions (PostgreSQL; $n parameters, same names and order as
-- sqlite_admin.sql). A logout revokes its session for every process at once.

-- name: admin_session_revoke
-- Idempotent: a second logout of the same session changes nothing.
INSERT INTO relaybox_admin_revoked_sessions (session_id, expires_at) VALUES ($1, $2)
ON CONFLICT (session_id) DO NOTHING

-- name: admin_session_revoked
-- One primary-key lookup per dashboard request.
SELECT 1 AS revoked FROM relaybox_admin_revoked_sessions WHERE session_id = $1

-- name: admin_session_purge
-- Rows of sessions that have expired anyway limit nothing any more.
DELETE FROM relaybox_admin_revoked_sessions WHERE expires_at < $1
