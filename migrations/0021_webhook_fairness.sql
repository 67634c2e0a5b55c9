-- One workspace's webhooks may not take every delivery slot, nor fill the
-- control database.
--
-- A subscription whose queue reached its bound stops taking events: it is
-- disabled with the reason, and the events it would have had are counted
-- as dropped until an administrator enables it again. Claims go to the
-- least recently served subscription of the workspaces using the fewest
-- slots.
ALTER TABLE webhooks ADD COLUMN disabled_reason TEXT;
ALTER TABLE webhooks ADD COLUMN dropped_events BIGINT NOT NULL DEFAULT 0;
ALTER TABLE webhooks ADD COLUMN last_served_at BIGINT;
CREATE INDEX webhook_deliveries_workspace_pending ON webhook_deliveries (workspace_id, status);
CREATE INDEX webhooks_workspace_lease ON webhooks (workspace_id, lease_expires_at);
