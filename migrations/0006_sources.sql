-- Sources: a connector plus its configuration (non-secret settings and
-- credential handles only). Pipelines (runtime records: connections) join a
-- source to a destination; a source cannot be deleted while one uses it.

CREATE TABLE sources (
    id             TEXT PRIMARY KEY,
    workspace_id   TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    connector_id   TEXT NOT NULL,
    name           TEXT NOT NULL,
    configuration  TEXT NOT NULL,
    created_by     TEXT NOT NULL REFERENCES users(id),
    created_at     BIGINT NOT NULL,
    updated_at     BIGINT NOT NULL
);
CREATE INDEX sources_workspace ON sources (workspace_id, id);

CREATE TABLE pipelines (
    id             TEXT PRIMARY KEY,
    workspace_id   TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    source_id      TEXT NOT NULL REFERENCES sources(id),
    name           TEXT NOT NULL,
    created_at     BIGINT NOT NULL
);
CREATE INDEX pipelines_source ON pipelines (source_id);
