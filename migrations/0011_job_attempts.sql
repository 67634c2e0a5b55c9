-- Every attempt of a job: which runner held it, when, and how it ended
-- (with the sanitised error of a failed one).

CREATE TABLE job_attempts (
    job_id       TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    attempt      BIGINT NOT NULL,
    runner       TEXT NOT NULL,
    started_at   BIGINT NOT NULL,
    finished_at  BIGINT,
    outcome      TEXT CHECK (outcome IN ('succeeded', 'failed', 'retrying', 'cancelled', 'abandoned')),
    error        TEXT,
    PRIMARY KEY (job_id, attempt)
);
CREATE INDEX jobs_workspace_created ON jobs (workspace_id, created_at);
