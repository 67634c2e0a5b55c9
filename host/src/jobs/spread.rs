//! A sync spread over servers by stream (`SERVICE_JOB_SPREAD_STREAMS`).
//!
//! The runner that claimed the job coordinates it ([`coordinate`]): it
//! makes a row per stream ([`crate::store::job_streams`]), reads streams
//! itself while any is left to claim, and meanwhile merges what every
//! stream shows into the job's progress. The job ends when every stream
//! ended: succeeded with the streams' ledgers merged, or failed when one
//! failed for good.
//!
//! Any runner of any server with no job to claim takes a waiting stream
//! ([`take`]): it holds the stream's lease with heartbeats, reads it from
//! its saved state into the destination (a lakehouse commits only while
//! that lease holds), and ends its row with the stream's ledger. A
//! transient failure puts the stream back with a backoff, to be read again
//! alone; a runner that died leaves it to be taken over when its lease
//! expires, resuming from its last checkpoint.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::lease::{MAX_ATTEMPTS, lease_ms};
use super::spool::SpoolBudget;
use super::sync::Prepared;
use super::{CancellationToken, Failure};
use crate::plugin::usage::{Usage, metered};
use crate::state::AppState;
use crate::store::job_streams::{StreamClaim, StreamEnd, StreamRun};
use crate::store::jobs::{Job, JobLease};
use crate::store::kinds::{JobKind, StreamRunStatus};
use crate::store::now_ms;
use crate::store::pipelines::Pipeline;
use crate::store::progress::{JobProgress, StreamStatus, SyncLedger, SyncProgress};

/// How often the coordinator looks for streams left and merges progress.
const MERGE_EVERY: Duration = Duration::from_millis(250);

/// Runs a sync or reset job: spread by stream when [`spreads`] says so,
/// else stream after stream on this runner ([`super::sync::execute`]).
pub(super) async fn execute(
    state: &AppState,
    spool: &Arc<SpoolBudget>,
    job: &Job,
    owner: &str,
    cancel: &CancellationToken,
) -> Result<(), Failure> {
    let lease = JobLease { job_id: job.job_id.clone(), owner: owner.to_owned(), stream: None };
    let prepared = super::sync::prepare(state, job, lease).await?;
    if !spreads(state, job, &prepared).await? {
        return super::sync::execute(state, spool, job, cancel, prepared).await;
    }
    let pipeline = prepared.pipeline.clone();
    prepared.close().await;
    coordinate(state, spool, job, owner, cancel, &pipeline).await
}

/// Whether a sync is spread by stream: it already was (a job taken over
/// keeps what its streams did, whatever this server's setting), or this
/// server spreads syncs and the pipeline has several streams.
async fn spreads(state: &AppState, job: &Job, prepared: &Prepared) -> Result<bool, Failure> {
    if job.kind != JobKind::Sync {
        return Ok(false);
    }
    if !state.store.stream_runs(&job.job_id).await?.is_empty() {
        return Ok(true);
    }
    Ok(state.config.limits.job_spread_streams && prepared.pipeline.streams.len() > 1)
}

/// Runs a spread sync to its end as its coordinator, `owner` holding the
/// job.
async fn coordinate(
    state: &AppState,
    spool: &Arc<SpoolBudget>,
    job: &Job,
    owner: &str,
    cancel: &CancellationToken,
    pipeline: &Pipeline,
) -> Result<(), Failure> {
    let names: Vec<String> = pipeline.streams.iter().map(|s| s.name.clone()).collect();
    state.store.spread_streams(&job.job_id, &names).await?;
    // This server's idle runners take streams at once; other servers'
    // find them at their next poll.
    state.jobs_queued.notify_waiters();
    let attempt = u32::try_from(job.attempts).unwrap_or(u32::MAX);
    let earlier = SyncProgress::ledgers_before(&job.progress, attempt);
    // Merges what the streams show until told to stop, never in the
    // middle of a write: the job's last progress is written after it.
    let stop_showing = CancellationToken::new();
    let shows = {
        let (state, job_id, earlier, stop) = (state.clone(), job.job_id.clone(), earlier.clone(), stop_showing.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(MERGE_EVERY) => {}
                }
                if let Ok(runs) = state.store.stream_runs(&job_id).await {
                    let progress = JobProgress::Sync(merged(&runs, earlier.clone()));
                    let _ = state.store.job_progress(&job_id, &progress).await;
                }
            }
        })
    };
    // The control database not answering for a moment stops nothing: the
    // job's lease (kept by the runner) says whether it is still this
    // runner's to end.
    let ended = async {
        loop {
            if cancel.is_cancelled() {
                return Err(Failure::Transient("the job was stopped".into()));
            }
            match state.store.claim_stream(owner, lease_ms(state), Some(&job.job_id), 0).await {
                Ok(Some(claim)) => {
                    run_claimed(state, spool, claim, owner, cancel.child_token()).await;
                    continue;
                }
                Ok(None) => match state.store.stream_runs(&job.job_id).await {
                    Ok(runs) if runs.iter().all(|r| r.status.is_final()) => return Ok(runs),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(job = %job.job_id, error = %e, "could not read the job's streams"),
                },
                Err(e) => tracing::warn!(job = %job.job_id, error = %e, "could not claim a stream of the job"),
            }
            tokio::select! {
                _ = cancel.cancelled() => {}
                _ = tokio::time::sleep(MERGE_EVERY) => {}
            }
        }
    }
    .await;
    stop_showing.cancel();
    let _ = shows.await;
    let runs = ended?;
    let ledgers = runs.iter().filter_map(|r| Some((r.stream.clone(), r.ledger.clone()?))).collect();
    let ledger = SyncLedger::new(attempt, ledgers);
    // A stream read again alone: its earlier attempts' ledgers, one
    // stream each, numbered by the stream's attempt.
    let mut earlier = earlier;
    for run in &runs {
        for (i, l) in run.earlier_ledgers.iter().enumerate() {
            let number = u32::try_from(i + 1).unwrap_or(u32::MAX);
            earlier.push(SyncLedger::new(number, BTreeMap::from([(run.stream.clone(), l.clone())])));
        }
    }
    let mut progress = merged(&runs, earlier);
    progress.ledger = Some(ledger.clone());
    state.store.job_progress(&job.job_id, &JobProgress::Sync(progress)).await?;
    if let Some(failed) = runs.iter().find(|r| r.status == StreamRunStatus::Failed) {
        let why = failed.error.as_deref().unwrap_or("it failed");
        return Err(Failure::Permanent(format!("stream {}: {why}", failed.stream)));
    }
    match ledger.imbalance() {
        Some(imbalance) => Err(Failure::Permanent(imbalance)),
        None => Ok(()),
    }
}

/// Reads a stream this server's runner `owner` claimed for another
/// runner's job, charging what its plugin spends to the job.
pub(super) async fn take(state: &AppState, spool: &Arc<SpoolBudget>, claim: StreamClaim, owner: &str) {
    let job_id = claim.job.job_id.clone();
    let meter = Arc::new(std::sync::Mutex::new(Usage::default()));
    metered(meter.clone(), run_claimed(state, spool, claim, owner, CancellationToken::new())).await;
    let spent = *meter.lock().unwrap_or_else(|p| p.into_inner());
    if let Err(e) = state.store.add_job_usage(&job_id, &spent).await {
        tracing::warn!(job = %job_id, error = %e, "could not record what a stream's plugin cost");
    }
}

/// Reads one claimed stream to the end of its attempt, keeping its lease;
/// stops when `cancel` fires, the job is cancelled or the stream's lease
/// went to another runner.
async fn run_claimed(
    state: &AppState,
    spool: &Arc<SpoolBudget>,
    claim: StreamClaim,
    owner: &str,
    cancel: CancellationToken,
) {
    let StreamClaim { job, stream, attempt } = claim;
    tracing::info!(job = %job.job_id, stream, attempt, "stream started");
    let lease = JobLease { job_id: job.job_id.clone(), owner: owner.to_owned(), stream: Some(stream.clone()) };
    let watch = super::lease::keep(state, lease.clone(), cancel.clone());
    let (outcome, ledger) = crate::telemetry::job_id::within(
        job.job_id.clone(),
        super::sync::read_spread_stream(state, spool, &job, lease, &cancel),
    )
    .await;
    watch.abort();
    let (end, said) = match outcome {
        Ok(()) => (StreamEnd::Succeeded, "succeeded"),
        // Stopped: free at once for whichever runner goes on, if the job
        // still runs and the stream is still this runner's.
        Err(_) if cancel.is_cancelled() => (StreamEnd::Stopped, "stopped"),
        Err(Failure::Transient(msg)) if attempt < MAX_ATTEMPTS => {
            let backoff = 2_000 * (1i64 << attempt.clamp(0, 6));
            (StreamEnd::Retry { not_before: now_ms() + backoff, error: msg }, "will retry")
        }
        Err(Failure::Transient(msg) | Failure::Permanent(msg)) => (StreamEnd::Failed(msg), "failed"),
    };
    tracing::info!(job = %job.job_id, stream, attempt, outcome = said, "stream attempt ended");
    match state.store.end_stream_run(&job.job_id, &stream, owner, &end, ledger.as_ref()).await {
        Ok(true) => {}
        Ok(false) => tracing::info!(job = %job.job_id, stream, "the stream went to another runner meanwhile"),
        Err(e) => tracing::warn!(job = %job.job_id, stream, error = %e, "could not record how a stream ended"),
    }
}

/// The job's progress from its streams' rows: each stream as its runner
/// last showed it (running while it waits for another attempt), and the
/// totals.
fn merged(runs: &[StreamRun], earlier_ledgers: Vec<SyncLedger>) -> SyncProgress {
    let streams: BTreeMap<_, _> = runs
        .iter()
        .filter_map(|r| {
            let mut shown = r.progress.clone()?;
            if !r.status.is_final() {
                shown.status = StreamStatus::Running;
            }
            Some((r.stream.clone(), shown))
        })
        .collect();
    let (records, bytes) = streams.values().fold((0, 0), |(r, b), s| (r + s.records, b + s.bytes));
    SyncProgress { records, bytes, streams, ledger: None, earlier_ledgers }
}
