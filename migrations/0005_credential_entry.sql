-- Single-use, expiring links where a person types a secret into the
-- service's own page instead of handing it to a client.

CREATE TABLE credential_entry_links (
    id             TEXT PRIMARY KEY,
    workspace_id   TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    token_hash     TEXT NOT NULL UNIQUE,
    requested_by   TEXT NOT NULL REFERENCES users(id),
    spec           TEXT NOT NULL,
    created_at     BIGINT NOT NULL,
    expires_at     BIGINT NOT NULL,
    used_at        BIGINT,
    credential_id  TEXT
);
