-- Reverse ETL: models (one read-only query over a warehouse destination),
-- reverse-ETL destinations (a connector's writable object, or a webhook),
-- activations (a model sent to a destination through a field mapping),
-- each activation's diff state, and runs, which are jobs of their own
-- kinds so they share the runners' leases, heartbeats, retries and
-- cancellation. The jobs table is rebuilt because SQLite cannot relax a
-- NOT NULL or a CHECK in place; its rows and attempts are copied over.

CREATE TABLE retl_models (
    id            TEXT PRIMARY KEY,
    workspace_id  TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    name          TEXT NOT NULL,
    warehouse_id  TEXT NOT NULL REFERENCES destinations(id),
    query         TEXT NOT NULL,
    primary_key   TEXT NOT NULL,
    created_by    TEXT NOT NULL REFERENCES users(id),
    created_at    BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL
);
CREATE INDEX retl_models_workspace ON retl_models (workspace_id, id);

CREATE TABLE retl_destinations (
    id             TEXT PRIMARY KEY,
    workspace_id   TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    name           TEXT NOT NULL,
    kind           TEXT NOT NULL CHECK (kind IN ('connector', 'webhook')),
    configuration  TEXT NOT NULL,
    created_by     TEXT NOT NULL REFERENCES users(id),
    created_at     BIGINT NOT NULL,
    updated_at     BIGINT NOT NULL
);
CREATE INDEX retl_destinations_workspace ON retl_destinations (workspace_id, id);

CREATE TABLE retl_activations (
    id              TEXT PRIMARY KEY,
    workspace_id    TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    name            TEXT NOT NULL,
    model_id        TEXT NOT NULL REFERENCES retl_models(id),
    destination_id  TEXT NOT NULL REFERENCES retl_destinations(id),
    mappings        TEXT NOT NULL,
    mode            TEXT NOT NULL CHECK (mode IN ('upsert', 'update_only', 'insert_only', 'mirror')),
    schedule        TEXT NOT NULL,
    paused          BIGINT NOT NULL DEFAULT 0,
    next_run_at     BIGINT,
    created_by      TEXT NOT NULL REFERENCES users(id),
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL
);
CREATE INDEX retl_activations_workspace ON retl_activations (workspace_id, id);

-- Per activation and model key: the fingerprint of the mapped fields last
-- accepted by the destination (NULL: never accepted), the destination's
-- matching value it was sent with (for removals), the run whose send was
-- accepted (so a resumed full resync skips what it already sent), and why
-- the last send failed (NULL: it did not).
CREATE TABLE retl_state (
    activation_id    TEXT NOT NULL REFERENCES retl_activations(id) ON DELETE CASCADE,
    record_key       TEXT NOT NULL,
    fingerprint      BIGINT,
    destination_key  TEXT,
    sent_by          TEXT,
    failure          TEXT,
    PRIMARY KEY (activation_id, record_key)
);

CREATE TABLE jobs_next (
    id                TEXT PRIMARY KEY,
    workspace_id      TEXT NOT NULL REFERENCES workspaces(id) ON DELETE CASCADE,
    pipeline_id       TEXT REFERENCES pipelines(id) ON DELETE CASCADE,
    activation_id     TEXT REFERENCES retl_activations(id) ON DELETE CASCADE,
    kind              TEXT NOT NULL CHECK (kind IN ('sync', 'reset', 'activation_run', 'activation_resync')),
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
    CHECK ((pipeline_id IS NULL AND activation_id IS NOT NULL) OR (pipeline_id IS NOT NULL AND activation_id IS NULL))
);
INSERT INTO jobs_next (id, workspace_id, pipeline_id, kind, status, trigger_source, attempts, not_before, lease_owner, lease_expires_at, progress, error, created_at, started_at, finished_at)
    SELECT id, workspace_id, pipeline_id, kind, status, trigger_source, attempts, not_before, lease_owner, lease_expires_at, progress, error, created_at, started_at, finished_at FROM jobs;

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
-- Fair job claims count each workspace's running jobs (as in 0009).
CREATE INDEX jobs_running_by_workspace ON jobs (workspace_id) WHERE status = 'running';
