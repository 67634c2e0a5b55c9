-- A sync spread over servers: each stream of the job is leased on its
-- own, so any runner of any server with a free slot reads the next one.
-- The job's runner made the rows; it merges their progress and ledgers
-- and ends the job once every stream ended. A stream whose runner died
-- is taken over when its lease expires; one that failed is retried alone.
CREATE TABLE job_streams (
    job_id            TEXT NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    stream            TEXT NOT NULL,
    position          BIGINT NOT NULL,
    status            TEXT NOT NULL CHECK (status IN ('queued', 'running', 'succeeded', 'failed')),
    attempts          BIGINT NOT NULL DEFAULT 0,
    not_before        BIGINT NOT NULL,
    lease_owner       TEXT,
    lease_expires_at  BIGINT,
    -- The runner of its last attempt, kept after it ended.
    runner            TEXT,
    -- Its progress as the job shows it (a stream's entry), the ledger of
    -- its last attempt that ended, and those of the attempts before it
    -- (a JSON list, oldest first).
    progress          TEXT,
    ledger            TEXT,
    earlier_ledgers   TEXT NOT NULL DEFAULT '[]',
    error             TEXT,
    PRIMARY KEY (job_id, stream)
);
CREATE INDEX job_streams_claimable ON job_streams (status, not_before);
