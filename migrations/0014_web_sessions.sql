-- Web sign-in sessions are a kind of their own: browser pages accept only
-- them from their cookie, and the API refuses them, so no other kind of
-- token (an assistant's, say) can act as a person signed in on the web.
-- SQLite cannot change a CHECK constraint in place, so the table is
-- rebuilt (the same statements work on PostgreSQL).

CREATE TABLE sessions_rebuilt (
    id             TEXT PRIMARY KEY,
    user_id        TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    token_hash     TEXT NOT NULL UNIQUE,
    kind           TEXT NOT NULL CHECK (kind IN ('session', 'api_token', 'web')),
    label          TEXT,
    client_source  TEXT NOT NULL,
    user_agent     TEXT,
    address        TEXT,
    created_at     BIGINT NOT NULL,
    last_used_at   BIGINT,
    expires_at     BIGINT,
    revoked_at     BIGINT
);
INSERT INTO sessions_rebuilt (id, user_id, token_hash, kind, label, client_source, user_agent, address, created_at, last_used_at, expires_at, revoked_at)
SELECT id, user_id, token_hash, kind, label, client_source, user_agent, address, created_at, last_used_at, expires_at, revoked_at FROM sessions;
DROP TABLE sessions;
ALTER TABLE sessions_rebuilt RENAME TO sessions;
CREATE INDEX sessions_user ON sessions (user_id, created_at);

-- A CLI session never outlives the web session that authorised it.
ALTER TABLE cli_login_codes ADD COLUMN session_expires_at BIGINT;

-- Sign-ins, sign-outs and CLI logins are audited with the client's address.
ALTER TABLE audit_logs ADD COLUMN address TEXT;
