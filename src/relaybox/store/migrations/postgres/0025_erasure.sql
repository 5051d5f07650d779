-- Erasing one subject (relaybox.erasure): a data-protection request removes every
-- payload, header, attempt body and response excerpt that belongs to a subject and
-- keeps keys, fingerprints, statuses and outcomes.
--
-- relaybox_subjects indexes rows by subject, written in the transaction of the accept
-- (a source with a subject path) or the publish (a subject given by the caller), so
-- that an erasure reads the subject's rows without scanning history. digest is the
-- SHA-256 of the subject (relaybox.erasure.subject_digest): the index does not hold
-- the subject in clear. kind: 'inbox' (ref: the inbox row's id) or 'message' (ref:
-- the message id; its deliveries are found by message_id).
CREATE TABLE relaybox_subjects (
    digest BYTEA NOT NULL,
    kind   TEXT NOT NULL CHECK (kind IN ('inbox', 'message')),
    ref    TEXT NOT NULL,
    PRIMARY KEY (digest, kind, ref)
);

-- One row per erasure: who asked, when, what (the subject's digest, or a tenant), and
-- how many rows of each kind it emptied. finished_at stays NULL while rows of the
-- subject are still pending (waiting: how many): the maintenance job (or the same
-- erasure asked again) empties them once they finish.
CREATE TABLE relaybox_erasures (
    id          BIGSERIAL PRIMARY KEY,
    actor       TEXT NOT NULL,
    reason      TEXT NOT NULL DEFAULT '',
    scope       TEXT NOT NULL CHECK (scope IN ('subject', 'tenant')),
    digest      BYTEA,
    tenant      TEXT,
    created_at  DOUBLE PRECISION NOT NULL,
    updated_at  DOUBLE PRECISION NOT NULL,
    finished_at DOUBLE PRECISION,
    waiting     BIGINT NOT NULL DEFAULT 0,
    inbox       BIGINT NOT NULL DEFAULT 0,
    quarantine  BIGINT NOT NULL DEFAULT 0,
    outbox      BIGINT NOT NULL DEFAULT 0,
    attempts    BIGINT NOT NULL DEFAULT 0,
    messages    BIGINT NOT NULL DEFAULT 0,
    CHECK ((scope = 'subject') = (digest IS NOT NULL)),
    CHECK ((scope = 'tenant') = (tenant IS NOT NULL))
);
CREATE INDEX relaybox_erasures_open ON relaybox_erasures (id) WHERE finished_at IS NULL;

-- When an erasure emptied the row (purged_at is set with it: every reader that knows
-- a purged row knows an erased one).
ALTER TABLE relaybox_inbox ADD COLUMN erased_at DOUBLE PRECISION;
ALTER TABLE relaybox_quarantine ADD COLUMN erased_at DOUBLE PRECISION;
ALTER TABLE relaybox_outbox ADD COLUMN erased_at DOUBLE PRECISION;
ALTER TABLE relaybox_messages ADD COLUMN erased_at DOUBLE PRECISION;
