-- Outbound webhooks: subscriptions, the durable outbox of events, and one
-- delivery per (subscription, event) with every attempt it took.
--
-- An event is written in the same transaction as what caused it (a job
-- ending, a proposal made), together with a delivery for each enabled
-- subscription of its workspace that asked for its type; so an event is
-- never announced for a change that rolled back, nor lost for one that
-- committed. Servers claim a subscription with a lease and deliver its
-- due deliveries oldest first, one at a time: each event reaches each
-- subscription once and in order, whichever replica sends it.
CREATE TABLE webhooks (
    id                TEXT PRIMARY KEY,
    workspace_id      TEXT NOT NULL,
    url               TEXT NOT NULL,
    description       TEXT NOT NULL,
    -- JSON array of event types, as the client listed them.
    event_types       TEXT NOT NULL,
    enabled           BIGINT NOT NULL,
    -- The signing secret, sealed with the master key (key:nonce:ciphertext).
    secret            TEXT NOT NULL,
    -- After a rotation the previous secret also signs, until this time.
    previous_secret   TEXT,
    previous_until    BIGINT,
    lease_owner       TEXT,
    lease_expires_at  BIGINT,
    -- The head of its queue failed: nothing is sent before this time.
    blocked_until     BIGINT,
    created_by        TEXT NOT NULL,
    created_at        BIGINT NOT NULL,
    updated_at        BIGINT NOT NULL
);
CREATE INDEX webhooks_workspace ON webhooks (workspace_id, id);

-- Which event types a subscription wants: the fan-out's lookup.
CREATE TABLE webhook_event_types (
    webhook_id    TEXT NOT NULL,
    workspace_id  TEXT NOT NULL,
    event_type    TEXT NOT NULL,
    PRIMARY KEY (webhook_id, event_type)
);
CREATE INDEX webhook_event_types_lookup ON webhook_event_types (workspace_id, event_type);

CREATE TABLE events (
    id            TEXT PRIMARY KEY,
    workspace_id  TEXT NOT NULL,
    event_type    TEXT NOT NULL,
    -- The Standard Webhooks payload: {type, timestamp, data}.
    payload       TEXT NOT NULL,
    created_at    BIGINT NOT NULL
);

-- The id is the message id receivers see in `webhook-id`: the same on
-- every retry and replay of the delivery.
CREATE TABLE webhook_deliveries (
    id               TEXT PRIMARY KEY,
    webhook_id       TEXT NOT NULL,
    workspace_id     TEXT NOT NULL,
    event_id         TEXT NOT NULL,
    event_type       TEXT NOT NULL,
    -- pending, delivered or failed (given up after the retry window).
    status           TEXT NOT NULL,
    attempts         BIGINT NOT NULL,
    next_attempt_at  BIGINT NOT NULL,
    last_status      BIGINT,
    last_error       TEXT,
    delivered_at     BIGINT,
    -- Retries go on until a retry window from here: the event's time, or
    -- the delivery's last replay.
    retry_from       BIGINT NOT NULL,
    created_at       BIGINT NOT NULL,
    UNIQUE (webhook_id, event_id)
);
CREATE INDEX webhook_deliveries_queue ON webhook_deliveries (webhook_id, status, created_at, id);

CREATE TABLE webhook_attempts (
    delivery_id   TEXT NOT NULL,
    attempt       BIGINT NOT NULL,
    attempted_at  BIGINT NOT NULL,
    -- The receiver's HTTP status, if it answered.
    status_code   BIGINT,
    duration_ms   BIGINT NOT NULL,
    error         TEXT,
    PRIMARY KEY (delivery_id, attempt)
);
