-- The job runners of every server are shared between workspaces by
-- weight: a claim goes to the waiting job of the workspace whose running
-- jobs are the smallest share of its weight (the oldest job first among
-- equals). An operator sets a workspace's weight with
-- `service admin set-claim-weight`; every workspace starts at 1.
ALTER TABLE workspaces ADD COLUMN claim_weight BIGINT NOT NULL DEFAULT 1;
