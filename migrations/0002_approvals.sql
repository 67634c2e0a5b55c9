-- Approval proposals and per-category policies (the safety model).

CREATE TABLE approvals (
    id                TEXT PRIMARY KEY,
    workspace_id      TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    category          TEXT NOT NULL,
    action            TEXT NOT NULL,
    summary           TEXT NOT NULL,
    operation         TEXT NOT NULL,
    status            TEXT NOT NULL CHECK (status IN ('pending', 'executing', 'executed', 'failed', 'rejected')),
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
CREATE INDEX approvals_workspace ON approvals (workspace_id, id);

CREATE TABLE approval_policies (
    workspace_id       TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    category           TEXT NOT NULL,
    requires_approval  BIGINT NOT NULL,
    approver_role      TEXT NOT NULL CHECK (approver_role IN ('administrator', 'editor')),
    updated_by         TEXT REFERENCES users(id),
    updated_at         BIGINT NOT NULL,
    PRIMARY KEY (workspace_id, category)
);
