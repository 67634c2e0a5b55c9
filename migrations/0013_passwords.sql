-- Passwords for web sign-in: an Argon2id hash in PHC form (algorithm,
-- parameters, salt and hash in one text), NULL while the user has none.
ALTER TABLE users ADD COLUMN password_hash TEXT;

-- One-time codes of `service auth login` (RFC 8252 loopback redirect with
-- PKCE): issued when a signed-in user confirms access for a CLI, spent
-- once by the CLI with the verifier of `code_challenge` (S256).
CREATE TABLE cli_login_codes (
    code_hash       TEXT PRIMARY KEY,
    user_id         TEXT NOT NULL REFERENCES users(id) ON DELETE CASCADE,
    code_challenge  TEXT NOT NULL,
    redirect_uri    TEXT NOT NULL,
    host_label      TEXT NOT NULL,
    created_at      BIGINT NOT NULL,
    expires_at      BIGINT NOT NULL,
    used_at         BIGINT
);
