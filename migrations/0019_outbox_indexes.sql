-- What the outbox and the watching pages look things up by, and the
-- count a delivery's backoff grows with.
--
-- `failures` counts the failed attempts since the delivery's
-- retry window opened (its event or its last replay): the backoff grows
-- with it and a replay starts it again.
ALTER TABLE webhook_deliveries ADD COLUMN failures BIGINT NOT NULL DEFAULT 0;
-- A delivery already failing keeps its backoff: receivers that are down
-- get no burst of retries from an upgrade.
UPDATE webhook_deliveries SET failures = attempts WHERE status = 'pending';

-- The sweep removes ended deliveries by when they ended and events no
-- delivery refers to.
CREATE INDEX webhook_deliveries_ended ON webhook_deliveries (status, next_attempt_at);
CREATE INDEX webhook_deliveries_event ON webhook_deliveries (event_id);
CREATE INDEX events_created ON events (created_at);

-- The last run of each pipeline and activation on the list pages, and
-- their recent jobs, without reading the workspace's whole history.
CREATE INDEX jobs_pipeline_created ON jobs (pipeline_id, created_at);
CREATE INDEX jobs_activation_created ON jobs (activation_id, created_at);

-- The scheduler's freshness check reads only pipelines that have a
-- freshness setting.
CREATE INDEX pipelines_freshness ON pipelines (freshness_minutes) WHERE freshness_minutes IS NOT NULL;
