-- Trust boundaries.
--
-- A proposal whose proposing session is revoked is voided: it can no
-- longer be approved. SQLite cannot change a CHECK constraint in place, so
-- the table is rebuilt (the same statements work on PostgreSQL).

CREATE TABLE approvals_rebuilt (
    id                TEXT PRIMARY KEY,
    workspace_id      TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    category          TEXT NOT NULL,
    action            TEXT NOT NULL,
    summary           TEXT NOT NULL,
    operation         TEXT NOT NULL,
    status            TEXT NOT NULL CHECK (status IN ('pending', 'executing', 'executed', 'failed', 'rejected', 'voided')),
    proposed_by       TEXT NOT NULL REFERENCES users(id),
    proposed_session  TEXT,
    client_source     TEXT NOT NULL,
    request_id        TEXT NOT NULL,
    created_at        BIGINT NOT NULL,
    expires_at        BIGINT NOT NULL,
    decided_by        TEXT REFERENCES users(id),
    decided_at        BIGINT,
    result_status     BIGINT,
    result_body       TEXT
);
INSERT INTO approvals_rebuilt (id, workspace_id, category, action, summary, operation, status, proposed_by, proposed_session,
    client_source, request_id, created_at, expires_at, decided_by, decided_at, result_status, result_body)
SELECT id, workspace_id, category, action, summary, operation, status, proposed_by, proposed_session,
    client_source, request_id, created_at, expires_at, decided_by, decided_at, result_status, result_body FROM approvals;
DROP TABLE approvals;
ALTER TABLE approvals_rebuilt RENAME TO approvals;
CREATE INDEX approvals_workspace ON approvals (workspace_id, id);
CREATE INDEX approvals_pending_by_session ON approvals (proposed_session) WHERE status = 'pending';

-- An OAuth flow remembers the session and client that started it: the
-- browser landing completes it as that session would have, so a flow an
-- assistant started still ends in a proposal.
ALTER TABLE oauth_states ADD COLUMN session_id TEXT;
ALTER TABLE oauth_states ADD COLUMN client_source TEXT NOT NULL DEFAULT 'api';

-- Sweeping expired idempotency records by age.
CREATE INDEX idempotency_keys_age ON idempotency_keys (created_at);

-- Fair job claims count each workspace's running jobs.
CREATE INDEX jobs_running_by_workspace ON jobs (workspace_id) WHERE status = 'running';
