-- Provider rate budgets shared by every server: a request that draws on
-- a budget (one named credential, or one provider host) leaves only at
-- its turn. The turn is a reservation on `next_at` (the generic cell
-- rate algorithm's theoretical arrival time, Unix microseconds), taken
-- by one UPDATE that every server's egress makes before the request
-- leaves; a `Retry-After` seen by one server moves `next_at` for all.
-- An operator sets budgets with `service admin set-rate-budget`.
CREATE TABLE rate_budgets (
    scope        TEXT NOT NULL CHECK (scope IN ('credential', 'host')),
    subject      TEXT NOT NULL,
    interval_us  BIGINT NOT NULL CHECK (interval_us > 0),
    burst        BIGINT NOT NULL CHECK (burst > 0),
    next_at      BIGINT NOT NULL DEFAULT 0,
    paused_until BIGINT NOT NULL DEFAULT 0,
    created_at   BIGINT NOT NULL,
    PRIMARY KEY (scope, subject)
);
