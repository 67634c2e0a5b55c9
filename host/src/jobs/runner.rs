//! The runners: each claims a job with a lease (one conditional update,
//! see [`crate::store::Store::claim_job`]), keeps it alive with heartbeats,
//! runs it, and retries transient failures with backoff; permanent ones
//! fail the job with a sanitised reason. A job whose runner died is
//! claimed again when its lease expires. A job cancelled (on any server)
//! is stopped within 400 ms ([`super::lease::keep`]), whatever it is
//! waiting for.

use std::sync::Arc;
use std::time::Duration;

use super::lease::{MAX_ATTEMPTS, lease_ms};
use super::spool::SpoolBudget;
use super::{CancellationToken, Failure};
use crate::plugin::usage::{Usage, metered};
use crate::state::AppState;
use crate::store::jobs::{Job, JobLease};
use crate::store::kinds::JobStatus;
use crate::store::now_ms;

/// The spool of this server's activation runs: the configured directory,
/// or `<data-dir>/spool`, owner-only, emptied of what a crash left.
fn spool(state: &AppState) -> Arc<SpoolBudget> {
    let limits = &state.config.limits.reverse_etl;
    let dir = limits.spool_dir.clone().unwrap_or_else(|| state.config.data_dir.join("spool"));
    if let Err(e) = crate::config::ensure_data_dir(&dir) {
        tracing::warn!(error = %e, "the spool directory is unavailable; runs that spool will fail");
    }
    Arc::new(SpoolBudget::new(dir, limits.spool_bytes_per_workspace))
}

/// Runs jobs and schedules until the task is aborted: as many runners as
/// `SERVICE_JOB_CONCURRENCY`, each claiming the job of the workspace whose
/// busy runners (on every server) are the smallest share of its claim
/// weight, and none of a workspace that has
/// `SERVICE_JOB_CONCURRENCY_PER_WORKSPACE` busy when that is set; a runner
/// with no job to claim reads a waiting stream of a spread sync
/// ([`super::spread`]) when this server spreads syncs. The scheduler ticks
/// on its own, so due runs are noticed (and skipped) while jobs run.
pub fn spawn(state: AppState) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let spool = spool(&state);
        let runners = (0..state.config.limits.job_concurrency).map(|_| {
            let (state, spool) = (state.clone(), spool.clone());
            async move {
                let owner = format!("runner-{}", uuid::Uuid::new_v4().simple());
                loop {
                    match state
                        .store
                        .claim_job(&owner, lease_ms(&state), state.config.limits.job_concurrency_per_workspace)
                        .await
                    {
                        Ok(Some(job)) => run(&state, &spool, &owner, job).await,
                        // No job waits: a stream of a spread sync may.
                        Ok(None) => match helps(&state, &owner).await {
                            Ok(Some(claim)) => super::spread::take(&state, &spool, claim, &owner).await,
                            // Jobs queued by another replica are found by polling.
                            _ => {
                                let _ = tokio::time::timeout(Duration::from_millis(200), state.jobs_queued.notified())
                                    .await;
                            }
                        },
                        Err(e) => {
                            tracing::warn!(error = %e, "could not claim jobs");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                }
            }
        });
        let runners = futures_join_all(runners.collect());
        let scheduler = async {
            loop {
                super::scheduler::schedule_due(&state).await;
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        };
        tokio::join!(runners, scheduler);
    })
}

/// A stream of another runner's spread sync for `owner` to read, when
/// this server spreads syncs.
async fn helps(
    state: &AppState,
    owner: &str,
) -> crate::store::StoreResult<Option<crate::store::job_streams::StreamClaim>> {
    if !state.config.limits.job_spread_streams {
        return Ok(None);
    }
    state.store.claim_stream(owner, lease_ms(state), None, state.config.limits.job_concurrency_per_workspace).await
}

/// Runs futures to completion side by side.
async fn futures_join_all<F: Future<Output = ()> + Send + 'static>(futures: Vec<F>) {
    let mut set = tokio::task::JoinSet::new();
    for f in futures {
        set.spawn(f);
    }
    while set.join_next().await.is_some() {}
}

/// Runs one claimed job to its end.
async fn run(state: &AppState, spool: &Arc<SpoolBudget>, owner: &str, job: Job) {
    let cancel = CancellationToken::new();
    // Keeps the lease, and stops the job when it is cancelled or its lease
    // went to another runner.
    let lease = JobLease { job_id: job.job_id.clone(), owner: owner.to_owned(), stream: None };
    let watch = super::lease::keep(state, lease, cancel.clone());
    tracing::info!(
        job = %job.job_id, kind = %job.kind, pipeline = job.pipeline_id.as_deref().unwrap_or("-"),
        activation = job.activation_id.as_deref().unwrap_or("-"), attempt = job.attempts, "job started"
    );
    // Every plugin invocation of this attempt is charged to the job.
    let meter = Arc::new(std::sync::Mutex::new(Usage::default()));
    let outcome = metered(
        meter.clone(),
        crate::telemetry::job_id::within(job.job_id.clone(), async {
            if job.kind.is_activation_run() {
                super::activation::execute(state, spool, &job, &cancel).await
            } else if job.kind == crate::store::kinds::JobKind::Replay {
                super::replay::execute(state, &job, owner, &cancel).await
            } else {
                super::spread::execute(state, spool, &job, owner, &cancel).await
            }
        }),
    )
    .await;
    watch.abort();
    let spent = *meter.lock().unwrap_or_else(|p| p.into_inner());
    if let Err(e) = state.store.add_job_usage(&job.job_id, &spent).await {
        tracing::warn!(job = %job.job_id, error = %e, "could not record what the job's plugin cost");
    }
    let ended = |outcome: &str, reason: &str| {
        tracing::info!(
            job = %job.job_id, pipeline = job.pipeline_id.as_deref().unwrap_or("-"),
            activation = job.activation_id.as_deref().unwrap_or("-"), attempt = job.attempts, outcome, reason,
            "job attempt ended"
        );
    };
    match outcome {
        Ok(()) => {
            ended("succeeded", "");
            let _ = state.store.finish_job(&job.job_id, owner, JobStatus::Succeeded, None).await;
        }
        Err(_)
            if cancel.is_cancelled()
                || state.store.job_status(&job.job_id).await.ok().flatten() == Some(JobStatus::Cancelled) =>
        {
            // Cancelled, or the lease went to another runner: this attempt ends here.
            ended("cancelled", "");
            let _ = state.store.end_attempt(&job.job_id, owner, "cancelled", None).await;
        }
        Err(Failure::Transient(msg)) if job.attempts < MAX_ATTEMPTS => {
            ended("will retry", &msg);
            let backoff = 2_000 * (1i64 << job.attempts.clamp(0, 6));
            let _ = state.store.retry_job(&job.job_id, owner, now_ms() + backoff, &msg).await;
        }
        Err(Failure::Transient(msg) | Failure::Permanent(msg)) => {
            ended("failed", &msg);
            let _ = state.store.finish_job(&job.job_id, owner, JobStatus::Failed, Some(&msg)).await;
        }
    }
}
