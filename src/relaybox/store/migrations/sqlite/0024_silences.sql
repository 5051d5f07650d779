-- Silence detection (relaybox.silence): per watched source (its last arrival) and per
-- webhook endpoint (its last success while deliveries wait), what the last check saw
-- and whether a silence is announced. silent_since is set by the one conditional
-- UPDATE that raises the silence (its event is published in the same transaction),
-- and cleared by the one that ends it: of several hosts checking at once, one raises
-- it and one ends it. learned/learned_at: the window learned from past arrival gaps
-- (expect_every = "learn"), recomputed at most every silence.learn_every.
CREATE TABLE relaybox_silences (
    kind         TEXT NOT NULL CHECK (kind IN ('source', 'endpoint')),
    name         TEXT NOT NULL,
    last_seen    REAL,
    expected     REAL,
    silent_since REAL,
    learned      REAL,
    learned_at   REAL,
    checked_at   REAL NOT NULL,
    PRIMARY KEY (kind, name)
);
-- The silent ones, longest first: what /metrics, the dashboard and doctor read, in a
-- time that does not grow with the endpoints that are not silent.
CREATE INDEX relaybox_silences_silent ON relaybox_silences (kind, last_seen)
    WHERE silent_since IS NOT NULL;
-- An endpoint's last successful delivery, written by the dispatcher's batch that
-- records it at most once a minute per endpoint (endpoints_succeeded). NULL: none
-- since this migration (a check then counts the wait of its deliveries alone).
ALTER TABLE relaybox_endpoints ADD COLUMN last_success_at REAL;
