//! Jobs: one sync or reset run of a pipeline (spec section 4, "Jobs").

use axum::Extension;
use axum::extract::{Path, State};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::Workspace;
use super::{Envelope, ok};
use crate::audit::AuditNote;
use crate::error::{ApiError, ApiResult};
use crate::ops::{self, Executed};
use crate::state::AppState;
use crate::store::pipelines::Job;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_job)).routes(routes!(cancel_job))
}

/// A job: status, type, timestamps, attempts, progress and totals, and a
/// sanitised error.
#[utoipa::path(get, path = "/jobs/{job_id}", tag = "jobs", params(("job_id" = String, Path)),
    responses((status = 200, body = Envelope<Job>), (status = 404, body = crate::error::ErrorBody)))]
async fn get_job(State(state): State<AppState>, ws: Workspace, Path(id): Path<String>) -> ApiResult<Envelope<Job>> {
    Ok(ok(state.store.job(&ws.workspace_id, &id).await?.ok_or_else(|| ApiError::not_found("job"))?))
}

/// Cancel a queued or running job.
#[utoipa::path(post, path = "/jobs/{job_id}/cancel", tag = "jobs", params(("job_id" = String, Path)),
    responses((status = 200, body = Envelope<Job>), (status = 409, body = crate::error::ErrorBody)))]
async fn cancel_job(State(state): State<AppState>, ws: Workspace, Extension(note): Extension<AuditNote>, Path(id): Path<String>) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, crate::ops::syncs::SyncOp::CancelJob { job_id: id }).await
}
