-- OAuth authorization-code flows in progress: a single-use state bound to
-- its user, workspace and target (a connector id, or the task app), with
-- the PKCE verifier the host sends when it exchanges the code.

CREATE TABLE oauth_states (
    state_hash     TEXT PRIMARY KEY,
    workspace_id   TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    user_id        TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    target         TEXT NOT NULL,
    code_verifier  TEXT NOT NULL,
    redirect_uri   TEXT NOT NULL,
    created_at     BIGINT NOT NULL,
    expires_at     BIGINT NOT NULL,
    used_at        BIGINT
);
