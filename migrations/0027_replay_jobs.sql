-- A third kind of pipeline job: `replay` loads the records a stream's
-- contract kept aside that fit the contract now. The kind is checked by
-- the jobs table, which SQLite can change only by building the table
-- again: jobs and their attempts are copied whole, with every index.
CREATE TABLE jobs_next (
    id                TEXT PRIMARY KEY,
    workspace_id      TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    pipeline_id       TEXT REFERENCES pipelines(id) ON DELETE CASCADE,
    activation_id     TEXT REFERENCES retl_activations(id) ON DELETE CASCADE,
    kind              TEXT NOT NULL CHECK (kind IN ('sync', 'reset', 'replay', 'activation_run', 'activation_resync')),
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
    finished_at       BIGINT,
    plugin_version    TEXT,
    plugin_digest     TEXT,
    usage             TEXT,
    CHECK ((pipeline_id IS NULL AND activation_id IS NOT NULL) OR (pipeline_id IS NOT NULL AND activation_id IS NULL))
);
INSERT INTO jobs_next (id, workspace_id, pipeline_id, activation_id, kind, status, trigger_source, attempts, not_before, lease_owner, lease_expires_at, progress, error, created_at, started_at, finished_at, plugin_version, plugin_digest, usage)
    SELECT id, workspace_id, pipeline_id, activation_id, kind, status, trigger_source, attempts, not_before, lease_owner, lease_expires_at, progress, error, created_at, started_at, finished_at, plugin_version, plugin_digest, usage FROM jobs;

CREATE TABLE job_attempts_next (
    job_id       TEXT NOT NULL REFERENCES jobs_next(id) ON DELETE CASCADE,
    attempt      BIGINT NOT NULL,
    runner       TEXT NOT NULL,
    started_at   BIGINT NOT NULL,
    finished_at  BIGINT,
    outcome      TEXT CHECK (outcome IN ('succeeded', 'failed', 'retrying', 'cancelled', 'abandoned')),
    error        TEXT,
    PRIMARY KEY (job_id, attempt)
);
INSERT INTO job_attempts_next (job_id, attempt, runner, started_at, finished_at, outcome, error)
    SELECT job_id, attempt, runner, started_at, finished_at, outcome, error FROM job_attempts;

DROP TABLE job_attempts;
DROP TABLE jobs;
ALTER TABLE jobs_next RENAME TO jobs;
ALTER TABLE job_attempts_next RENAME TO job_attempts;

CREATE UNIQUE INDEX jobs_one_active_per_pipeline ON jobs (pipeline_id) WHERE status IN ('queued', 'running');
CREATE UNIQUE INDEX jobs_one_active_per_activation ON jobs (activation_id) WHERE status IN ('queued', 'running');
CREATE INDEX jobs_claimable ON jobs (status, not_before);
CREATE INDEX jobs_workspace_created ON jobs (workspace_id, created_at);
CREATE INDEX jobs_running_by_workspace ON jobs (workspace_id) WHERE status = 'running';
CREATE INDEX jobs_pipeline_created ON jobs (pipeline_id, created_at);
CREATE INDEX jobs_activation_created ON jobs (activation_id, created_at);
