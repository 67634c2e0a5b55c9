-- Destinations, pipelines (runtime records: connections), their per-stream
-- state, and jobs. At most one sync or reset is active per pipeline: the
-- partial unique index makes the database enforce it across replicas.

CREATE TABLE destinations (
    id             TEXT PRIMARY KEY,
    workspace_id   TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    kind           TEXT NOT NULL CHECK (kind IN ('sqlite', 'postgres', 'jsonl')),
    name           TEXT NOT NULL,
    configuration  TEXT NOT NULL,
    created_by     TEXT NOT NULL REFERENCES users(id),
    created_at     BIGINT NOT NULL,
    updated_at     BIGINT NOT NULL
);
CREATE INDEX destinations_workspace ON destinations (workspace_id, id);

ALTER TABLE pipelines ADD COLUMN destination_id TEXT REFERENCES destinations(id);
ALTER TABLE pipelines ADD COLUMN streams TEXT NOT NULL DEFAULT '[]';
ALTER TABLE pipelines ADD COLUMN schedule TEXT NOT NULL DEFAULT '{"kind":"manual"}';
ALTER TABLE pipelines ADD COLUMN schedule_version BIGINT NOT NULL DEFAULT 1;
ALTER TABLE pipelines ADD COLUMN status TEXT NOT NULL DEFAULT 'active';
ALTER TABLE pipelines ADD COLUMN updated_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE pipelines ADD COLUMN next_run_at BIGINT;
CREATE INDEX pipelines_workspace ON pipelines (workspace_id, id);

CREATE TABLE pipeline_state (
    pipeline_id  TEXT NOT NULL REFERENCES pipelines(id) ON DELETE CASCADE,
    stream       TEXT NOT NULL,
    state        TEXT NOT NULL,
    updated_at   BIGINT NOT NULL,
    PRIMARY KEY (pipeline_id, stream)
);

CREATE TABLE jobs (
    id                TEXT PRIMARY KEY,
    workspace_id      TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    pipeline_id       TEXT NOT NULL REFERENCES pipelines(id) ON DELETE CASCADE,
    kind              TEXT NOT NULL CHECK (kind IN ('sync', 'reset')),
    status            TEXT NOT NULL CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
    trigger_source    TEXT NOT NULL,
    attempts          BIGINT NOT NULL DEFAULT 0,
    not_before        BIGINT NOT NULL,
    lease_owner       TEXT,
    lease_expires_at  BIGINT,
    progress          TEXT NOT NULL DEFAULT '{}',
    error             TEXT,
    created_at        BIGINT NOT NULL,
    started_at        BIGINT,
    finished_at       BIGINT
);
CREATE UNIQUE INDEX jobs_one_active_per_pipeline ON jobs (pipeline_id) WHERE status IN ('queued', 'running');
CREATE INDEX jobs_claimable ON jobs (status, not_before);
