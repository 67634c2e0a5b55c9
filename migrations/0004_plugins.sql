-- Connector plugins: whether each is enabled, shared by every replica.
-- Installation operators (who may load and unload plugins) are users with
-- the operator flag; the first administrator gets it at bootstrap.

CREATE TABLE plugin_states (
    connector_id  TEXT PRIMARY KEY,
    enabled       BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL,
    updated_by    TEXT
);

ALTER TABLE users ADD COLUMN operator BIGINT NOT NULL DEFAULT 0;
