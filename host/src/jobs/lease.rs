//! How long a runner's hold on a job (or on a stream of a spread sync)
//! lasts, how often it is renewed, how often a cancellation is looked for,
//! and how many attempts a transient failure gets.

use std::time::Duration;

use crate::state::AppState;

/// How long a claim lasts without a heartbeat (`SERVICE_JOB_LEASE_SECS`):
/// after a runner dies, its job (or stream) is taken over this long after
/// its last heartbeat.
pub(super) fn lease_ms(state: &AppState) -> i64 {
    state.config.limits.job_lease.as_millis() as i64
}

/// Heartbeat period: a third of the lease.
pub(super) fn heartbeat(state: &AppState) -> Duration {
    state.config.limits.job_lease / 3
}

/// Attempts before a transiently failing job (or stream) fails for good.
pub(super) const MAX_ATTEMPTS: i64 = 3;

/// How often a running job's status is read, so a cancellation made on
/// any server stops it soon.
pub(super) const CANCEL_POLL: Duration = Duration::from_millis(400);
