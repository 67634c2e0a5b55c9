-- Credentials: secrets sealed with the master key (XChaCha20-Poly1305),
-- bound to their credential and workspace as associated data.

CREATE TABLE credentials (
    id                 TEXT PRIMARY KEY,
    workspace_id       TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    handle             TEXT NOT NULL UNIQUE,
    kind               TEXT NOT NULL,
    connector_id       TEXT,
    label              TEXT,
    hosts              TEXT NOT NULL,
    metadata           TEXT NOT NULL,
    status             TEXT NOT NULL CHECK (status IN ('pending_approval', 'active', 'revoked', 'needs_reauthorization')),
    created_by         TEXT NOT NULL REFERENCES users(id),
    created_at         BIGINT NOT NULL,
    last_used_at       BIGINT,
    access_expires_at  BIGINT,
    key_id             TEXT NOT NULL,
    nonce              TEXT NOT NULL,
    ciphertext         TEXT NOT NULL
);
CREATE INDEX credentials_workspace ON credentials (workspace_id, id);
