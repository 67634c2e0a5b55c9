-- What a source's connector said its streams are, kept from the last
-- discover (a pipeline's prepare, or a pipeline's creation when its source
-- was never prepared), so that neither creating a pipeline nor syncing it
-- asks the provider again: a connector that infers a stream's schema from
-- the first page would otherwise read that page once more, without the
-- incremental filter, on every sync. Kept for the plugin digest that said
-- it and the configuration it was said for: another version of the
-- plugin, or a changed configuration, discovers again.
CREATE TABLE source_catalogs (
    source_id      TEXT PRIMARY KEY REFERENCES sources(id) ON DELETE CASCADE,
    plugin_digest  TEXT NOT NULL,
    configuration  TEXT NOT NULL,
    catalog        TEXT NOT NULL,
    discovered_at  BIGINT NOT NULL
);
