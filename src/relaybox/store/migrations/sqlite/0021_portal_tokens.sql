-- Portal links and sessions that ended before their expiry. Both are signed tokens
-- (relaybox.outbound.portal_links), which any process checks without state; what ends
-- one early must still reach every process, so it lives here: a session its tenant
-- logged out of, and a single-use link once it was opened (the INSERT that records
-- the opening is what lets one opening through). token_id is the SHA-256 of the
-- token's kind and random nonce (the token itself is not stored); a row can go once
-- its token would have expired anyway (expires_at): whoever ends a token drops a few
-- such rows, and the maintenance job drops them all.
CREATE TABLE relaybox_portal_revoked_tokens (
    token_id   TEXT PRIMARY KEY,
    expires_at REAL NOT NULL
);
CREATE INDEX relaybox_portal_revoked_tokens_expiry
    ON relaybox_portal_revoked_tokens (expires_at);
