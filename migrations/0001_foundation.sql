-- Foundation: users, workspaces, memberships, sessions, invitations, audit,
-- idempotency keys and one-time login codes. Times are Unix milliseconds.
-- The SQL is kept portable so one migration set serves SQLite and PostgreSQL.

CREATE TABLE users (
    id          TEXT PRIMARY KEY,
    email       TEXT NOT NULL UNIQUE,
    name        TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);

CREATE TABLE workspaces (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);

CREATE TABLE memberships (
    id            TEXT PRIMARY KEY,
    workspace_id  TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    user_id       TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    role          TEXT NOT NULL CHECK (role IN ('administrator', 'editor', 'viewer')),
    created_at    BIGINT NOT NULL,
    UNIQUE (workspace_id, user_id)
);
CREATE INDEX memberships_user ON memberships (user_id, created_at);

CREATE TABLE sessions (
    id             TEXT PRIMARY KEY,
    user_id        TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    token_hash     TEXT NOT NULL UNIQUE,
    kind           TEXT NOT NULL CHECK (kind IN ('session', 'api_token')),
    label          TEXT,
    client_source  TEXT NOT NULL,
    user_agent     TEXT,
    address        TEXT,
    created_at     BIGINT NOT NULL,
    last_used_at   BIGINT,
    expires_at     BIGINT,
    revoked_at     BIGINT
);
CREATE INDEX sessions_user ON sessions (user_id, created_at);

CREATE TABLE invitations (
    id            TEXT PRIMARY KEY,
    workspace_id  TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    email         TEXT NOT NULL,
    role          TEXT NOT NULL,
    token_hash    TEXT NOT NULL UNIQUE,
    invited_by    TEXT NOT NULL REFERENCES users(id),
    created_at    BIGINT NOT NULL,
    expires_at    BIGINT NOT NULL,
    accepted_at   BIGINT,
    accepted_by   TEXT REFERENCES users(id)
);

CREATE TABLE login_codes (
    code_hash   TEXT PRIMARY KEY,
    user_id     TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    used_at     BIGINT
);

CREATE TABLE audit_logs (
    id                 TEXT PRIMARY KEY,
    workspace_id       TEXT,
    actor_user_id      TEXT,
    actor_session_id   TEXT,
    action             TEXT NOT NULL,
    target_type        TEXT,
    target_id          TEXT,
    client_source      TEXT NOT NULL,
    request_id         TEXT NOT NULL,
    outcome            TEXT NOT NULL,
    status_code        BIGINT NOT NULL,
    approval_id        TEXT,
    created_at         BIGINT NOT NULL
);
CREATE INDEX audit_logs_workspace_time ON audit_logs (workspace_id, created_at, id);

CREATE TABLE idempotency_keys (
    user_id        TEXT NOT NULL,
    idem_key       TEXT NOT NULL,
    request_hash   TEXT NOT NULL,
    status_code    BIGINT,
    response_body  TEXT,
    created_at     BIGINT NOT NULL,
    PRIMARY KEY (user_id, idem_key)
);
