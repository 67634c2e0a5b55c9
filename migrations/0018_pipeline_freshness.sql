-- How fresh a pipeline's data must be, and what the scheduler found:
-- a pipeline whose last successful sync (or, before its first, its
-- creation) is older than freshness_minutes is breached once, announced
-- once, and recovered when a sync succeeds again. The time of the last
-- successful sync is kept on the pipeline so neither check nor /metrics
-- reads the job history.
ALTER TABLE pipelines ADD COLUMN freshness_minutes BIGINT;
ALTER TABLE pipelines ADD COLUMN freshness_breached_at BIGINT;
ALTER TABLE pipelines ADD COLUMN last_succeeded_at BIGINT;
UPDATE pipelines SET last_succeeded_at =
    (SELECT MAX(j.finished_at) FROM jobs j WHERE j.pipeline_id = pipelines.id AND j.status = 'succeeded');
