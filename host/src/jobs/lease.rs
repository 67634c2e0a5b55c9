//! A runner's hold on a job (or on a stream of a spread sync): how long it
//! lasts, how it is kept ([`keep`]) and how a cancellation made on any
//! server reaches it, and how many attempts a transient failure gets.

use std::time::Duration;

use super::CancellationToken;
use crate::state::AppState;
use crate::store::jobs::JobLease;
use crate::store::kinds::JobStatus;

/// How long a claim lasts without a heartbeat (`SERVICE_JOB_LEASE_SECS`):
/// after a runner dies, its job (or stream) is taken over this long after
/// its last heartbeat.
pub(super) fn lease_ms(state: &AppState) -> i64 {
    state.config.limits.job_lease.as_millis() as i64
}

/// Heartbeat period: a third of the lease.
fn heartbeat(state: &AppState) -> Duration {
    state.config.limits.job_lease / 3
}

/// Attempts before a transiently failing job (or stream) fails for good.
pub(super) const MAX_ATTEMPTS: i64 = 3;

/// How often a running job's status is read, so a cancellation made on
/// any server stops it soon.
const CANCEL_POLL: Duration = Duration::from_millis(400);

/// Keeps `lease` until the task is aborted, and stops the attempt
/// (`cancel`) when its job is cancelled (on any server) or the lease went
/// to another runner.
pub(super) fn keep(state: &AppState, lease: JobLease, cancel: CancellationToken) -> tokio::task::JoinHandle<()> {
    let state = state.clone();
    tokio::spawn(async move {
        let mut next_beat = tokio::time::Instant::now() + heartbeat(&state);
        loop {
            tokio::time::sleep(CANCEL_POLL).await;
            if state.store.job_status(&lease.job_id).await.ok().flatten() == Some(JobStatus::Cancelled) {
                cancel.cancel();
                return;
            }
            if tokio::time::Instant::now() >= next_beat {
                next_beat += heartbeat(&state);
                let (job_id, owner, ms) = (&lease.job_id, &lease.owner, lease_ms(&state));
                let held = match &lease.stream {
                    None => state.store.heartbeat(job_id, owner, ms).await,
                    Some(stream) => state.store.stream_heartbeat(job_id, stream, owner, ms).await,
                };
                // A control database that does not answer keeps it for now.
                if !held.unwrap_or(true) {
                    cancel.cancel();
                    return;
                }
            }
        }
    })
}
