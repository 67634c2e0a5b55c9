-- Revoking a credential destroys its sealed secret and records who revoked
-- it and when.

ALTER TABLE credentials ADD COLUMN revoked_at BIGINT;
ALTER TABLE credentials ADD COLUMN revoked_by TEXT;
