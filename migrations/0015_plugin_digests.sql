-- An enabled plugin is pinned to the digest (SHA-256 of its component) the
-- operator enabled: every replica runs exactly that, and another file for
-- the same connector id is a new version, disabled until an operator
-- enables it. NULL: not pinned (bundled plugins, covered by the build).
ALTER TABLE plugin_states ADD COLUMN digest TEXT;
