-- Every component an operator may run, kept in the control database so
-- every replica runs the very bytes that were verified, without another
-- copy of the file or another pull. Which one runs is the digest pinned
-- in plugin_states; a new file or pull adds a version here and changes
-- nothing until an operator makes it current. The signature is kept as it
-- was found and checked again whenever a replica loads the component, so
-- a publisher key the operator stops trusting stops its components too.
-- The component is base64 text: one column type on SQLite and PostgreSQL.
CREATE TABLE plugin_versions (
    connector_id  TEXT NOT NULL,
    digest        TEXT NOT NULL,
    version       TEXT NOT NULL,
    interface     TEXT NOT NULL,
    signer        TEXT,
    signature     TEXT,
    origin        TEXT NOT NULL,
    component     TEXT NOT NULL,
    added_at      BIGINT NOT NULL,
    PRIMARY KEY (connector_id, digest)
);

-- A job runs the plugin version it started with to its end, retries after
-- a lease takeover included; recorded when it first runs.
ALTER TABLE jobs ADD COLUMN plugin_version TEXT;
ALTER TABLE jobs ADD COLUMN plugin_digest TEXT;
-- What its plugin invocations cost (JSON: guest CPU, peak memory,
-- requests, bytes, host time), summed over its attempts.
ALTER TABLE jobs ADD COLUMN usage TEXT;

-- What an audit record adds to its target: for plugin loads, the digest,
-- version and signer of the component (identifiers only, never a payload).
ALTER TABLE audit_logs ADD COLUMN details TEXT;
