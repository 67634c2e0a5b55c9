//! Sync operations: starting syncs, resets and replays of rejected rows,
//! cancelling jobs.
//!
//! A sync command may carry the schedule version it was issued against
//! (`schedule_version` in the body, or `If-Match: "<version>"`); a proposal
//! records the version current when it was made. If the pipeline's schedule
//! changed since, the command is refused with 409 `EXECUTION_CONFLICT`, like
//! a sync that meets an active job, and no job is created.

use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;

use super::act::{Act, Category, Ctx, Executed, Via};
use crate::access::WorkspaceAccess;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::store::jobs::{Job, NotQueued};
use crate::store::kinds::{JobKind, Trigger};
use crate::store::pipelines::Pipeline;

/// A sync or reset command.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub(crate) struct RunPipeline {
    pub pipeline_id: String,
    /// The schedule version the command was issued against.
    pub schedule_version: Option<i64>,
}

async fn pipeline(state: &AppState, access: &WorkspaceAccess, id: &str) -> ApiResult<Pipeline> {
    state.store.pipeline(&access.workspace_id, id).await?.ok_or_else(|| ApiError::not_found("pipeline"))
}

/// The spec's 409 for syncs and resets (and replays).
pub(super) fn conflict(message: &str, active: Option<Job>, schedule: Option<(i64, i64)>) -> ApiError {
    let mut details = json!({ "active_job": active });
    if let Some((given, current)) = schedule {
        details = json!({ "reason": "schedule_changed", "given_schedule_version": given, "current_schedule_version": current });
    }
    ApiError::conflict("EXECUTION_CONFLICT", message).with_details(details)
}

/// Starts a sync or reset job, unless one is active or the schedule moved.
pub(crate) async fn run(ctx: &Ctx<'_>, req: RunPipeline, kind: JobKind, trigger: Trigger) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    note.target("pipeline", &req.pipeline_id);
    let p = pipeline(state, access, &req.pipeline_id).await?;
    if let Some(v) = req.schedule_version
        && v != p.schedule_version
    {
        return Err(conflict(
            "the pipeline's schedule changed since this command was issued; refresh the pipeline before retrying",
            None,
            Some((v, p.schedule_version)),
        ));
    }
    let source =
        state.store.source(&access.workspace_id, &p.source_id).await?.ok_or_else(|| ApiError::not_found("source"))?;
    state.plugins.available(&source.connector_id).await?;
    match state.store.create_job(&access.workspace_id, &p.pipeline_id, kind, trigger).await? {
        Ok(job) => {
            state.jobs_queued.notify_one();
            note.target("job", &job.job_id);
            Executed::created(job)
        }
        Err(NotQueued::Gone) => Err(ApiError::not_found("pipeline")),
        Err(NotQueued::Active(active)) => Err(conflict(
            "a sync or reset is already active for this pipeline; refresh its status before retrying",
            active.map(|job| *job),
            None,
        )),
    }
}

pub(crate) async fn cancel_job(ctx: &Ctx<'_>, job_id: &str) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    note.target("job", job_id);
    let job = state.store.job(&access.workspace_id, job_id).await?.ok_or_else(|| ApiError::not_found("job"))?;
    if !state.store.cancel_job(&access.workspace_id, job_id).await? {
        return Err(ApiError::conflict("JOB_NOT_ACTIVE", format!("the job is already {}", job.status)));
    }
    let job = state.store.job(&access.workspace_id, job_id).await?.ok_or_else(|| ApiError::not_found("job"))?;
    Executed::ok(job)
}

/// Starts a replay of the rows the pipeline's contracts kept aside, only
/// when some stream has rows to replay. Conflicts like a sync.
async fn replay(ctx: &Ctx<'_>, req: RunPipeline, trigger: Trigger) -> ApiResult<Executed> {
    let (state, access) = (ctx.state, ctx.access);
    let p = pipeline(state, access, &req.pipeline_id).await?;
    let dest_id = p.destination_id.as_deref().ok_or_else(|| ApiError::not_found("destination"))?;
    let dest = state
        .store
        .destination(&access.workspace_id, dest_id)
        .await?
        .ok_or_else(|| ApiError::not_found("destination"))?;
    let tables: Vec<String> = p.streams.iter().map(|s| crate::warehouse::contract::rejected_stream(&s.name)).collect();
    let any = state
        .warehouses
        .any_rows(&dest, &p.pipeline_id, &tables)
        .await
        .map_err(|e| e.refusal("cannot read the rejected rows"))?;
    if !any {
        return Err(ApiError::conflict("NOTHING_TO_REPLAY", "no stream of the pipeline has rejected rows to replay"));
    }
    run(ctx, req, JobKind::Replay, trigger).await
}

/// Sync operations.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "operation", rename_all = "snake_case")]
pub(crate) enum SyncOp {
    /// Start a sync job.
    SyncPipeline(RunPipeline),
    /// Start a replay of the rows the pipeline's contracts kept aside.
    ReplayRejected(RunPipeline),
    /// Start a reset job (clear destination data and state, sync again).
    ResetPipeline(RunPipeline),
    CancelJob {
        job_id: String,
    },
}

impl Act for SyncOp {
    fn action(&self) -> &'static str {
        match self {
            SyncOp::SyncPipeline(_) => "pipelines.sync",
            SyncOp::ResetPipeline(_) => "pipelines.reset",
            SyncOp::ReplayRejected(_) => "pipelines.replay_rejected",
            SyncOp::CancelJob { .. } => "jobs.cancel",
        }
    }

    fn category(&self) -> Category {
        Category::Syncs
    }

    fn summary(&self) -> String {
        match self {
            SyncOp::SyncPipeline(r) => {
                format!("Sync pipeline {} (schedule version {:?})", r.pipeline_id, r.schedule_version)
            }
            SyncOp::ResetPipeline(r) => format!(
                "Reset pipeline {}: clear its destination data and state, then sync from scratch",
                r.pipeline_id
            ),
            SyncOp::ReplayRejected(r) => format!(
                "Replay the rows pipeline {}'s contracts kept aside: load those that fit now, keep the rest",
                r.pipeline_id
            ),
            SyncOp::CancelJob { job_id } => format!("Cancel job {job_id}"),
        }
    }
}

impl SyncOp {
    pub(super) async fn run(self, ctx: &Ctx<'_>) -> ApiResult<Executed> {
        // A run started by approving a proposal says so, whatever it runs.
        let trigger = match ctx.via {
            Via::Approval => Trigger::Approval,
            Via::Request => Trigger::Manual,
        };
        match self {
            SyncOp::SyncPipeline(r) => run(ctx, r, JobKind::Sync, trigger).await,
            SyncOp::ResetPipeline(r) => run(ctx, r, JobKind::Reset, trigger).await,
            SyncOp::ReplayRejected(r) => replay(ctx, r, trigger).await,
            SyncOp::CancelJob { job_id } => cancel_job(ctx, &job_id).await,
        }
    }
}
