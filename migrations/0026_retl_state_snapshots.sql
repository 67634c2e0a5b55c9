-- A reverse-ETL run loads its activation's whole diff state before it
-- diffs. Read key by key, a million keys take seconds; so a run that
-- ends keeps the state it leaves as a snapshot: every key's hash (the
-- first 16 bytes of its SHA-256), last accepted fingerprint and flags,
-- packed 25 bytes a key, 65,536 keys a chunk, base64 in a text. The next
-- run loads the chunks instead of the rows.
--
-- `state_version` moves with every write to an activation's diff state
-- (a batch of outcomes, a forgotten state). A snapshot holds the version
-- it was taken at and is used only while the activation is still at that
-- version; otherwise the rows are read, as before.
ALTER TABLE retl_activations ADD COLUMN state_version BIGINT NOT NULL DEFAULT 0;

CREATE TABLE retl_state_snapshots (
    activation_id  TEXT NOT NULL REFERENCES retl_activations(id) ON DELETE CASCADE,
    chunk          BIGINT NOT NULL,
    version        BIGINT NOT NULL,
    -- Keys in the whole snapshot (the same on every chunk).
    keys           BIGINT NOT NULL,
    entries        TEXT NOT NULL,
    PRIMARY KEY (activation_id, chunk)
);
