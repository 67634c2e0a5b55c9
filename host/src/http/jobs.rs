//! Jobs: one sync or reset run of a pipeline (spec section 4, "Jobs").

use axum::Extension;
use axum::extract::{Path, State};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{ApiQuery, PageQuery, Workspace};
use super::{Envelope, Page, ok};
use crate::audit::AuditNote;
use crate::error::{ApiError, ApiResult};
use crate::ops::{self, Executed};
use crate::state::AppState;
use crate::store::jobs::{Job, JobAttempt, JobFilter};
use crate::store::kinds::{JobKind, JobStatus};

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_jobs))
        .routes(routes!(get_job))
        .routes(routes!(cancel_job))
        .routes(routes!(job_attempts))
        .routes(routes!(job_events))
}

/// A job's life as Server-Sent Events: `attempt_started` and
/// `attempt_ended` (with its outcome and error) for every attempt, however
/// short, `progress` (per-stream counters) when they change, at most
/// four times a second, and `finished` with the job's record when it
/// ends, after which the stream closes. A job that already ended answers
/// its `progress` and `finished` at once. A stream closes after an hour
/// (reconnect to go on), or as soon as its token is revoked or its user
/// leaves the workspace; a user holds at most 16 open at once (429
/// `RATE_LIMITED` beyond).
#[utoipa::path(get, path = "/jobs/{job_id}/events", tag = "jobs", params(("job_id" = String, Path)),
    responses((status = 200, content_type = "text/event-stream", body = String,
        description = "events `attempt_started`, `attempt_ended`, `progress` and `finished`, each with a JSON object as its data"),
        (status = 404, body = crate::error::ErrorBody), (status = 429, body = crate::error::ErrorBody)))]
async fn job_events(
    State(state): State<AppState>,
    ws: Workspace,
    Path(id): Path<String>,
) -> ApiResult<axum::response::Response> {
    use axum::response::IntoResponse;
    use axum::response::sse::{KeepAlive, Sse};
    let first = state.store.job(&ws.workspace_id, &id).await?.ok_or_else(|| ApiError::not_found("job"))?;
    let slot = match state.throttle.open_stream(&ws.principal.user_id) {
        Ok(slot) => slot,
        Err(limited) => return Ok(limited.into_response()),
    };
    let events = crate::jobs::watch::events(state, ws.0, first, slot);
    Ok(Sse::new(events).keep_alive(KeepAlive::default()).into_response())
}

/// Filters of `GET /jobs`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct JobsQuery {
    /// Only jobs of this pipeline.
    pipeline_id: Option<String>,
    /// Only runs of this reverse-ETL activation.
    activation_id: Option<String>,
    /// Only jobs in this status: `queued`, `running`, `succeeded`, `failed`
    /// or `cancelled`.
    #[param(value_type = Option<JobStatus>)]
    status: Option<String>,
    /// Only jobs of this kind: `sync`, `reset`, `activation_run` or
    /// `activation_resync`.
    #[param(value_type = Option<JobKind>)]
    kind: Option<String>,
    /// Only jobs created at or after this time (RFC 3339).
    #[param(format = DateTime)]
    created_after: Option<String>,
    /// Only jobs created before this time (RFC 3339).
    #[param(format = DateTime)]
    created_before: Option<String>,
}

fn time(field: &str, raw: Option<&str>) -> ApiResult<Option<i64>> {
    raw.map(|t| {
        DateTime::parse_from_rfc3339(t).map(|t| t.with_timezone(&Utc).timestamp_millis()).map_err(|_| {
            ApiError::invalid_field(
                field,
                format!("{field} must be an RFC 3339 time, for example 2026-01-31T12:00:00Z"),
            )
        })
    })
    .transpose()
}

/// Jobs of the workspace, newest first, filtered by pipeline, status,
/// kind and creation time, paged with `limit` and `cursor`.
#[utoipa::path(get, path = "/jobs", tag = "jobs", params(PageQuery, JobsQuery),
    responses((status = 200, body = Envelope<Page<Job>>), (status = 400, body = crate::error::ErrorBody)))]
async fn list_jobs(
    State(state): State<AppState>,
    ws: Workspace,
    ApiQuery(q): ApiQuery<PageQuery>,
    ApiQuery(f): ApiQuery<JobsQuery>,
) -> ApiResult<Envelope<Page<Job>>> {
    let limit = q.limit()?;
    let filter = JobFilter {
        pipeline_id: f.pipeline_id,
        activation_id: f.activation_id,
        status: f
            .status
            .as_deref()
            .map(|s| {
                JobStatus::parse(s).ok_or_else(|| {
                    ApiError::invalid_field("status", "status must be queued, running, succeeded, failed or cancelled")
                })
            })
            .transpose()?,
        kind: f
            .kind
            .as_deref()
            .map(|k| {
                JobKind::parse(k)
                    .ok_or_else(|| ApiError::invalid_field("kind", format!("kind must be {}", JobKind::choices())))
            })
            .transpose()?,
        created_after: time("created_after", f.created_after.as_deref())?,
        created_before: time("created_before", f.created_before.as_deref())?,
    };
    let items = state.store.jobs(&ws.workspace_id, &filter, q.after()?.as_deref(), limit + 1).await?;
    Ok(ok(q.page(items, limit, |j| &j.job_id)))
}

/// A job's attempts.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct JobAttempts {
    pub job_id: String,
    /// Oldest first; each with its runner's times, how it ended and the
    /// sanitised error of one that failed.
    pub items: Vec<JobAttempt>,
}

/// Every attempt of a job, with how each ended and its error.
#[utoipa::path(get, path = "/jobs/{job_id}/attempts", tag = "jobs", params(("job_id" = String, Path)),
    responses((status = 200, body = Envelope<JobAttempts>), (status = 404, body = crate::error::ErrorBody)))]
async fn job_attempts(
    State(state): State<AppState>,
    ws: Workspace,
    Path(id): Path<String>,
) -> ApiResult<Envelope<JobAttempts>> {
    let job = state.store.job(&ws.workspace_id, &id).await?.ok_or_else(|| ApiError::not_found("job"))?;
    let items = state.store.job_attempts(&job.job_id).await?;
    Ok(ok(JobAttempts { job_id: job.job_id, items }))
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
async fn cancel_job(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(id): Path<String>,
) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, crate::ops::syncs::SyncOp::CancelJob { job_id: id }).await
}
