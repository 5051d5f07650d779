-- Every replay is recorded: who, when, why, and what the row was before.
CREATE TABLE relaybox_replays (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    inbox_id        INTEGER NOT NULL,
    actor           TEXT NOT NULL,
    reason          TEXT NOT NULL,
    previous_status TEXT NOT NULL,
    previous_reason TEXT,
    replayed_at     REAL NOT NULL
);
CREATE INDEX relaybox_replays_inbox ON relaybox_replays (inbox_id);
