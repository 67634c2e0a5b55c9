//! Following a job as it runs: the Server-Sent Events the API
//! (`GET /v1/jobs/{job_id}/events`) and the job's page send.
//!
//! The job and its attempts are read from the control database four
//! times a second, so the stream follows it whichever server runs it:
//! `attempt_started` and `attempt_ended` for every attempt, however short
//! (read from the job's attempt log, not sampled from the job),
//! `progress` when its counters change, and `finished` with the job's
//! record when it ends, after which the stream closes.
//!
//! A stream is bounded: it counts against its user's open streams (the
//! [`StreamSlot`] it holds), it closes after its lifetime (a client
//! reconnects and is checked again), and every little while it asks the
//! control database whether its session is still live and its user still
//! a member of the workspace, closing when either is no longer so (both
//! in [`StreamLimits`]).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::Event;
use futures_util::Stream;
use serde_json::{Value, json};

use crate::access::WorkspaceAccess;
use crate::access::throttle::StreamSlot;
use crate::config::limits::StreamLimits;
use crate::state::AppState;
use crate::store::jobs::{Job, JobAttempt};
use crate::store::progress::JobProgress;

/// How often the stream looks at the job.
const POLL: Duration = Duration::from_millis(250);

/// What the stream has told its client so far.
struct Told {
    /// Attempts whose start, and whose end, were told.
    started: i64,
    ended_attempts: i64,
    /// The progress last told (none before the first look).
    progress: Option<JobProgress>,
    /// Events waiting to be sent, oldest first.
    queue: VecDeque<Event>,
    ended: bool,
}

fn event(name: &str, data: &Value) -> Event {
    Event::default().event(name).data(data.to_string())
}

impl Told {
    /// Queues what changed since the last look.
    fn look(&mut self, job: &Job, attempts: &[JobAttempt]) {
        for a in attempts {
            if a.attempt > self.started {
                self.started = a.attempt;
                let data = json!({ "job_id": job.job_id, "attempt": a.attempt, "started_at": a.started_at });
                self.queue.push_back(event("attempt_started", &data));
            }
            if a.attempt > self.ended_attempts
                && let Some(finished_at) = a.finished_at
            {
                self.ended_attempts = a.attempt;
                let data = json!({ "job_id": job.job_id, "attempt": a.attempt, "finished_at": finished_at,
                    "outcome": a.outcome, "error": a.error });
                self.queue.push_back(event("attempt_ended", &data));
            }
        }
        if self.progress.as_ref() != Some(&job.progress) {
            self.progress = Some(job.progress.clone());
            let data = json!({ "job_id": job.job_id, "status": job.status, "progress": job.progress });
            self.queue.push_back(event("progress", &data));
        }
        if job.status.is_final() {
            self.ended = true;
            self.queue.push_back(event("finished", &serde_json::to_value(job).unwrap_or_default()));
        }
    }
}

/// Whether `access` still stands: its session live, its user a member of
/// the workspace.
async fn still_allowed(state: &AppState, access: &WorkspaceAccess) -> bool {
    let now = chrono::Utc::now();
    let session = match state.store.session(&access.principal.session_id).await {
        Ok(Some(s)) => s,
        Ok(None) => return false,
        // The database is unreachable: the stream cannot read the job
        // either; it goes on and checks again.
        Err(_) => return true,
    };
    if session.revoked_at.is_some() || session.expires_at.is_some_and(|t| t <= now) {
        return false;
    }
    !matches!(state.store.role_in(&access.principal.user_id, &access.workspace_id).await, Ok(None))
}

/// The events of `first` (a job of the workspace of `access`, as just
/// read) from now on: what it already shows, then each change, to its
/// end, for as long as `slot` holds the place of the stream.
pub(crate) fn events(
    state: AppState,
    access: WorkspaceAccess,
    first: Job,
    slot: StreamSlot,
) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static {
    let told = Told { started: 0, ended_attempts: 0, progress: None, queue: VecDeque::new(), ended: false };
    let id = first.job_id.clone();
    let mut first = Some(first);
    let opened = tokio::time::Instant::now();
    let limits = state.config.limits.streams.clone();
    let watch = Watch { state, access, id, limits, opened, checked: opened, _slot: slot };
    futures_util::stream::unfold((told, watch), move |(mut told, mut w)| {
        let first = first.take();
        async move {
            if let Some(job) = first {
                let attempts = w.state.store.job_attempts(&job.job_id).await.unwrap_or_default();
                // A job that already ended answers its progress and its end.
                if job.status.is_final() {
                    let last = attempts.last().map_or(0, |a| a.attempt);
                    (told.started, told.ended_attempts) = (last, last);
                }
                told.look(&job, &attempts);
            }
            loop {
                if let Some(e) = told.queue.pop_front() {
                    return Some((Ok(e), (told, w)));
                }
                if told.ended || w.opened.elapsed() >= w.limits.lifetime {
                    return None;
                }
                tokio::time::sleep(POLL).await;
                if w.checked.elapsed() >= w.limits.recheck {
                    if !still_allowed(&w.state, &w.access).await {
                        return None;
                    }
                    w.checked = tokio::time::Instant::now();
                }
                match w.state.store.job(&w.access.workspace_id, &w.id).await {
                    Ok(Some(job)) => {
                        // Read after the job: an attempt the job's record shows
                        // is in the log too.
                        let attempts = w.state.store.job_attempts(&job.job_id).await.unwrap_or_default();
                        told.look(&job, &attempts);
                    }
                    // Deleted with its pipeline.
                    Ok(None) => return None,
                    Err(e) => tracing::warn!(error = %e, "could not read a job for its event stream"),
                }
            }
        }
    })
}

/// What a stream follows, and for whom.
struct Watch {
    state: AppState,
    access: WorkspaceAccess,
    id: String,
    limits: StreamLimits,
    opened: tokio::time::Instant,
    checked: tokio::time::Instant,
    /// Held while the stream is open.
    _slot: StreamSlot,
}
