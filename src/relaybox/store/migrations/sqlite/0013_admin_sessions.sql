-- Dashboard sessions ended by a logout. A session cookie is signed (its HMAC key is
-- derived from admin_token), so every process can check one without state; a logout
-- must still end it everywhere, and this table is what every process checks against.
-- session_id is the SHA-256 of the session's random nonce (the cookie itself is not
-- stored); a row can go once its session would have expired anyway (expires_at).
CREATE TABLE relaybox_admin_revoked_sessions (
    session_id TEXT PRIMARY KEY,
    expires_at REAL NOT NULL
);
CREATE INDEX relaybox_admin_revoked_sessions_expiry
    ON relaybox_admin_revoked_sessions (expires_at);
