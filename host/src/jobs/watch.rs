//! Following a job as it runs: the Server-Sent Events the API
//! (`GET /v1/jobs/{job_id}/events`) and the job's page send.
//!
//! The job is read from the control database four times a second, so the
//! stream follows it whichever server runs it: `attempt_started` when an
//! attempt starts, `progress` when its counters change, and `finished`
//! with the job's record when it ends, after which the stream closes.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::Event;
use futures_util::Stream;
use serde_json::{Value, json};

use crate::state::AppState;
use crate::store::jobs::Job;
use crate::store::kinds::JobStatus;

/// How often the stream looks at the job.
const POLL: Duration = Duration::from_millis(250);

/// What the stream has told its client so far.
struct Told {
    attempts: i64,
    progress: Value,
    /// Events waiting to be sent, oldest first.
    queue: VecDeque<Event>,
    ended: bool,
}

fn event(name: &str, data: &Value) -> Event {
    Event::default().event(name).data(data.to_string())
}

impl Told {
    /// Queues what changed since the last look.
    fn look(&mut self, job: &Job) {
        if job.attempts > self.attempts && job.status == JobStatus::Running {
            self.attempts = job.attempts;
            let data = json!({ "job_id": job.job_id, "attempt": job.attempts, "started_at": job.started_at });
            self.queue.push_back(event("attempt_started", &data));
        }
        if job.progress != self.progress {
            self.progress = job.progress.clone();
            let data = json!({ "job_id": job.job_id, "status": job.status, "progress": job.progress });
            self.queue.push_back(event("progress", &data));
        }
        if job.status.is_final() {
            self.ended = true;
            self.queue.push_back(event("finished", &serde_json::to_value(job).unwrap_or_default()));
        }
    }
}

/// The events of `first` (a job of `workspace_id`, as just read) from now
/// on: what it already shows, then each change, to its end.
pub fn events(
    state: AppState,
    workspace_id: String,
    first: Job,
) -> impl Stream<Item = Result<Event, Infallible>> + Send + 'static {
    let mut told = Told { attempts: 0, progress: Value::Null, queue: VecDeque::new(), ended: false };
    told.look(&first);
    let id = first.job_id;
    futures_util::stream::unfold((told, state, workspace_id, id), |(mut told, state, ws, id)| async move {
        loop {
            if let Some(e) = told.queue.pop_front() {
                return Some((Ok(e), (told, state, ws, id)));
            }
            if told.ended {
                return None;
            }
            tokio::time::sleep(POLL).await;
            match state.store.job(&ws, &id).await {
                Ok(Some(job)) => told.look(&job),
                // Deleted with its pipeline.
                Ok(None) => return None,
                Err(e) => tracing::warn!(error = %e, "could not read a job for its event stream"),
            }
        }
    })
}
