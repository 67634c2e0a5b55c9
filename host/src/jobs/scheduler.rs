//! The scheduler: starts the syncs of pipelines and the runs of
//! reverse-ETL activations whose interval or cron schedule is due; one
//! that meets an active job is skipped and recorded in the audit log,
//! never queued twice. Every server's scheduler looks, and each due run
//! goes to the one that moves its next run first (a conditional update),
//! so a run is queued once however many servers share the database. Each tick also looks for pipelines whose data went
//! stale (or fresh again) against their freshness setting.

use crate::state::AppState;
use crate::store::audit::NewAuditRecord;
use crate::store::jobs::NotQueued;
use crate::store::kinds::{AuditOutcome, JobKind, Trigger};
use crate::store::now_ms;
use crate::store::pipelines::Schedule;

/// Starts what is due now, and announces pipelines whose data went stale
/// or fresh again.
pub(super) async fn schedule_due(state: &AppState) {
    schedule_syncs(state).await;
    schedule_activations(state).await;
    if let Err(e) = state.store.freshness_changes(now_ms()).await {
        tracing::warn!(error = %e, "could not check the freshness of pipelines");
    }
}

async fn schedule_activations(state: &AppState) {
    let now = now_ms();
    let Ok(due) = state.store.due_activations(now).await else { return };
    for a in due {
        let next = a.schedule.next_after(now).ok().flatten();
        // Another server's scheduler may have taken this run meanwhile.
        if !state.store.take_due_activation_run(&a.activation_id, now, next).await.unwrap_or(false)
            || a.schedule == Schedule::Manual
        {
            continue;
        }
        match state.store.create_run(&a.workspace_id, &a.activation_id, JobKind::ActivationRun, Trigger::Schedule).await
        {
            Ok(Ok(run)) => {
                state.jobs_queued.notify_one();
                tracing::info!(activation = %a.activation_id, run = %run.job_id, "scheduled reverse-ETL run started");
            }
            Ok(Err(NotQueued::Gone)) => {}
            Ok(Err(active)) => {
                let record = NewAuditRecord::event(
                    &a.workspace_id,
                    "reverse_etl.schedule_skipped",
                    AuditOutcome::Failed,
                    409,
                    crate::telemetry::request_id::current(),
                )
                .on("activation", &a.activation_id);
                let _ = state.store.append_audit(&record).await;
                tracing::info!(activation = %a.activation_id, active = ?active_id(&active), "scheduled reverse-ETL run skipped: a run is active");
            }
            Err(e) => tracing::warn!(error = %e, "could not start a scheduled reverse-ETL run"),
        }
    }
}

async fn schedule_syncs(state: &AppState) {
    let now = now_ms();
    let Ok(due) = state.store.due_pipelines(now).await else { return };
    for p in due {
        let next = p.schedule.next_after(now).ok().flatten();
        // Another server's scheduler may have taken this run meanwhile.
        if !state.store.take_due_run(&p.pipeline_id, now, next).await.unwrap_or(false) || p.schedule == Schedule::Manual
        {
            continue;
        }
        match state.store.create_job(&p.workspace_id, &p.pipeline_id, JobKind::Sync, Trigger::Schedule).await {
            Ok(Ok(job)) => {
                state.jobs_queued.notify_one();
                tracing::info!(pipeline = %p.pipeline_id, job = %job.job_id, "scheduled sync started");
            }
            Ok(Err(NotQueued::Gone)) => {}
            Ok(Err(active)) => {
                let record = NewAuditRecord::event(
                    &p.workspace_id,
                    "pipelines.schedule_skipped",
                    AuditOutcome::Failed,
                    409,
                    crate::telemetry::request_id::current(),
                )
                .on("pipeline", &p.pipeline_id);
                let _ = state.store.append_audit(&record).await;
                tracing::info!(pipeline = %p.pipeline_id, active = ?active_id(&active), "scheduled sync skipped: a job is active");
            }
            Err(e) => tracing::warn!(error = %e, "could not start a scheduled sync"),
        }
    }
}

/// The job that kept a scheduled one from being queued, for the log.
fn active_id(refused: &NotQueued) -> Option<&str> {
    match refused {
        NotQueued::Active(job) => job.as_ref().map(|j| j.job_id.as_str()),
        NotQueued::Gone => None,
    }
}
