//! The scheduler: starts the syncs of pipelines whose interval or cron
//! schedule is due; a run that meets an active job is skipped and recorded
//! in the audit log, never queued twice.

use crate::state::AppState;
use crate::store::now_ms;
use crate::store::pipelines::Schedule;

/// Starts what is due now.
pub(super) async fn schedule_due(state: &AppState) {
    let Ok(due) = state.store.due_pipelines(now_ms()).await else { return };
    for p in due {
        let _ = state.store.set_next_run(&p.pipeline_id, p.schedule.next_after(now_ms()).ok().flatten()).await;
        if p.schedule == Schedule::Manual {
            continue;
        }
        match state.store.create_job(&p.workspace_id, &p.pipeline_id, "sync", "schedule").await {
            Ok(Ok(job)) => {
                state.jobs_queued.notify_one();
                tracing::info!(pipeline = %p.pipeline_id, job = %job.job_id, "scheduled sync started");
            }
            Ok(Err(active)) => {
                let record = crate::store::audit::NewAuditRecord {
                    workspace_id: Some(p.workspace_id.clone()),
                    action: "pipelines.schedule_skipped".into(),
                    target_type: Some("pipeline".into()),
                    target_id: Some(p.pipeline_id.clone()),
                    client_source: "api".into(),
                    request_id: crate::telemetry::request_id::current(),
                    outcome: "failed".into(),
                    status_code: 409,
                    ..Default::default()
                };
                let _ = state.store.append_audit(&record).await;
                tracing::info!(pipeline = %p.pipeline_id, active = ?active.0.map(|j| j.job_id), "scheduled sync skipped: a job is active");
            }
            Err(e) => tracing::warn!(error = %e, "could not start a scheduled sync"),
        }
    }
}
