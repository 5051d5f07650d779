-- Set when an event's handler attempt starts, cleared when its outcome is recorded.
-- A claimed row that still has it was being processed when its worker died: it runs
-- alone next time (so a poison event only charges itself), and once its attempts are
-- used up it goes to dead letters.
ALTER TABLE relaybox_inbox ADD COLUMN started_at REAL;
