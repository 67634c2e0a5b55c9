//! Pipelines: prepare, create, read, update, pause, resume, sync and
//! reset (spec section 4, "Pipelines"), and the rows their streams'
//! contracts kept aside: listed, and replayed.

use axum::Extension;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{ApiJson, ApiQuery, MaybeJson, PageQuery, Workspace};
use super::{Envelope, Page, ok};
use crate::audit::AuditNote;
use crate::error::{ApiError, ApiResult};
use crate::ops::pipelines::{CreatePipeline, UpdatePipeline};
use crate::ops::syncs::RunPipeline;
use crate::ops::{self, Executed};
use crate::state::AppState;
use crate::store::jobs::Job;
use crate::store::pipelines::Pipeline;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(prepare_pipeline))
        .routes(routes!(create_pipeline, list_pipelines))
        .routes(routes!(get_pipeline, update_pipeline))
        .routes(routes!(pause_pipeline))
        .routes(routes!(resume_pipeline))
        .routes(routes!(sync_pipeline))
        .routes(routes!(reset_pipeline))
        .routes(routes!(list_rejected))
        .routes(routes!(replay_rejected))
}

/// Body of `POST /pipelines/prepare`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PrepareBody {
    pub source_id: String,
}

/// Discover the source's streams: the catalog, a suggested selection,
/// warnings and, from connectors that offer one, a preview of the data
/// (`preview`, else null). Creates nothing; editors (it runs the connector with the
/// workspace's credentials).
#[utoipa::path(post, path = "/pipelines/prepare", tag = "pipelines", request_body = PrepareBody,
    responses((status = 200, body = Envelope<Value>), (status = 400, body = crate::error::ErrorBody)))]
async fn prepare_pipeline(
    State(state): State<AppState>,
    ws: Workspace,
    ApiJson(body): ApiJson<PrepareBody>,
) -> ApiResult<Envelope<Value>> {
    // It runs the connector with the workspace's credentials: like check
    // and preview, an editor's call.
    ws.require(crate::access::Role::Editor)?;
    Ok(ok(crate::ops::pipelines::plan(&state, &ws, &body.source_id).await?))
}

/// Create a pipeline from a source to a destination.
#[utoipa::path(post, path = "/pipelines", tag = "pipelines", request_body = CreatePipeline,
    responses((status = 201, body = Envelope<Pipeline>), (status = 400, body = crate::error::ErrorBody)))]
async fn create_pipeline(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    ApiJson(body): ApiJson<CreatePipeline>,
) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, crate::ops::pipelines::PipelineOp::CreatePipeline(body)).await
}

/// Pipelines of the workspace.
#[utoipa::path(get, path = "/pipelines", tag = "pipelines", params(PageQuery), responses((status = 200, body = Envelope<Page<Pipeline>>)))]
async fn list_pipelines(
    State(state): State<AppState>,
    ws: Workspace,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> ApiResult<Envelope<Page<Pipeline>>> {
    let limit = q.limit()?;
    let items = state.store.pipelines(&ws.workspace_id, q.after()?.as_deref(), limit + 1).await?;
    Ok(ok(q.page(items, limit, |p| &p.pipeline_id)))
}

/// One pipeline, with its active job if any.
#[utoipa::path(get, path = "/pipelines/{pipeline_id}", tag = "pipelines", params(("pipeline_id" = String, Path)),
    responses((status = 200, body = Envelope<Value>), (status = 404, body = crate::error::ErrorBody)))]
async fn get_pipeline(
    State(state): State<AppState>,
    ws: Workspace,
    Path(id): Path<String>,
) -> ApiResult<Envelope<Value>> {
    let p = state.store.pipeline(&ws.workspace_id, &id).await?.ok_or_else(|| ApiError::not_found("pipeline"))?;
    let active = state.store.active_job(&id).await?;
    let mut v = serde_json::to_value(p).map_err(ApiError::internal)?;
    v["active_job"] = serde_json::to_value(active).map_err(ApiError::internal)?;
    Ok(ok(v))
}

/// Change a pipeline's streams, schedule or name.
#[utoipa::path(patch, path = "/pipelines/{pipeline_id}", tag = "pipelines", params(("pipeline_id" = String, Path)), request_body = UpdatePipeline,
    responses((status = 200, body = Envelope<Pipeline>), (status = 400, body = crate::error::ErrorBody)))]
async fn update_pipeline(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(id): Path<String>,
    ApiJson(mut body): ApiJson<UpdatePipeline>,
) -> ApiResult<Executed> {
    body.pipeline_id = id;
    ops::submit(&state, &ws, &note, crate::ops::pipelines::PipelineOp::UpdatePipeline(body)).await
}

/// Pause: schedules stop starting syncs.
#[utoipa::path(post, path = "/pipelines/{pipeline_id}/pause", tag = "pipelines", params(("pipeline_id" = String, Path)),
    responses((status = 200, body = Envelope<Pipeline>)))]
async fn pause_pipeline(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(id): Path<String>,
) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, crate::ops::pipelines::PipelineOp::PausePipeline { pipeline_id: id }).await
}

/// Resume a paused pipeline.
#[utoipa::path(post, path = "/pipelines/{pipeline_id}/resume", tag = "pipelines", params(("pipeline_id" = String, Path)),
    responses((status = 200, body = Envelope<Pipeline>)))]
async fn resume_pipeline(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(id): Path<String>,
) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, crate::ops::pipelines::PipelineOp::ResumePipeline { pipeline_id: id }).await
}

/// Optional body of sync and reset.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunBody {
    /// The schedule version this command was issued against (also
    /// accepted as `If-Match: "<version>"`).
    pub schedule_version: Option<i64>,
}

/// The command's schedule version: given (body or If-Match), else the
/// current one, so a proposal pins the version it was made against.
async fn run_command(
    state: &AppState,
    ws: &Workspace,
    id: String,
    headers: &HeaderMap,
    body: Option<RunBody>,
) -> ApiResult<RunPipeline> {
    let from_header =
        headers
            .get(axum::http::header::IF_MATCH)
            .map(|v| {
                v.to_str().ok().map(|s| s.trim().trim_matches('"')).and_then(|s| s.parse::<i64>().ok()).ok_or_else(
                    || ApiError::invalid_field("If-Match", "If-Match must be the schedule version, e.g. \"3\""),
                )
            })
            .transpose()?;
    let given = body.and_then(|b| b.schedule_version).or(from_header);
    let version = match given {
        Some(v) => Some(v),
        None => state.store.pipeline(&ws.workspace_id, &id).await?.map(|p| p.schedule_version),
    };
    Ok(RunPipeline { pipeline_id: id, schedule_version: version })
}

/// Start a sync. 409 `EXECUTION_CONFLICT` (with the active job) when a sync
/// or reset is active, or when the schedule changed since the command was
/// issued; a 409 never creates a job.
#[utoipa::path(post, path = "/pipelines/{pipeline_id}/sync", tag = "pipelines", params(("pipeline_id" = String, Path)), request_body(content = RunBody, content_type = "application/json"),
    responses((status = 201, body = Envelope<Job>), (status = 409, body = crate::error::ErrorBody)))]
async fn sync_pipeline(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(id): Path<String>,
    headers: HeaderMap,
    MaybeJson(body): MaybeJson<RunBody>,
) -> ApiResult<Executed> {
    let cmd = run_command(&state, &ws, id, &headers, body).await?;
    ops::submit(&state, &ws, &note, crate::ops::syncs::SyncOp::SyncPipeline(cmd)).await
}

/// Start a reset: clear the destination data and state, then sync from
/// scratch. Conflicts like a sync.
#[utoipa::path(post, path = "/pipelines/{pipeline_id}/reset", tag = "pipelines", params(("pipeline_id" = String, Path)), request_body(content = RunBody, content_type = "application/json"),
    responses((status = 201, body = Envelope<Job>), (status = 409, body = crate::error::ErrorBody)))]
async fn reset_pipeline(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(id): Path<String>,
    headers: HeaderMap,
    MaybeJson(body): MaybeJson<RunBody>,
) -> ApiResult<Executed> {
    let cmd = run_command(&state, &ws, id, &headers, body).await?;
    ops::submit(&state, &ws, &note, crate::ops::syncs::SyncOp::ResetPipeline(cmd)).await
}

/// Replay the rows the pipeline's contracts kept aside: a job that judges
/// them again by the streams' contracts and schemas as they are now, loads
/// those that fit once, and keeps the rest with their new reason. SQLite and
/// PostgreSQL destinations; 409 `NOTHING_TO_REPLAY` when no stream has
/// rejected rows, and 409 `EXECUTION_CONFLICT` when a job of the pipeline
/// is active, as for syncs.
#[utoipa::path(post, path = "/pipelines/{pipeline_id}/rejected/replay", tag = "pipelines", params(("pipeline_id" = String, Path)), request_body(content = RunBody, content_type = "application/json"),
    responses((status = 201, body = Envelope<Job>), (status = 400, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody)))]
async fn replay_rejected(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(id): Path<String>,
    headers: HeaderMap,
    MaybeJson(body): MaybeJson<RunBody>,
) -> ApiResult<Executed> {
    let cmd = run_command(&state, &ws, id, &headers, body).await?;
    ops::submit(&state, &ws, &note, crate::ops::syncs::SyncOp::ReplayRejected(cmd)).await
}

/// Which stream's rejected rows to list.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct RejectedQuery {
    /// The stream (needed when the pipeline has more than one).
    pub stream: Option<String>,
}

/// Records a stream's contract kept aside, read from the stream's
/// rejected-rows table in the destination: each with the job and attempt
/// that read it, the cursor's value, the reason, the JSON pointer of the
/// field, the rule, and the record as read. Editors (the records are the
/// provider's data).
#[utoipa::path(get, path = "/pipelines/{pipeline_id}/rejected", tag = "pipelines",
    params(("pipeline_id" = String, Path), RejectedQuery, PageQuery),
    responses((status = 200, body = Envelope<Page<Value>>), (status = 400, body = crate::error::ErrorBody),
        (status = 404, body = crate::error::ErrorBody)))]
async fn list_rejected(
    State(state): State<AppState>,
    ws: Workspace,
    Path(id): Path<String>,
    ApiQuery(which): ApiQuery<RejectedQuery>,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> ApiResult<Envelope<Page<Value>>> {
    ws.require(crate::access::Role::Editor)?;
    let p = state.store.pipeline(&ws.workspace_id, &id).await?.ok_or_else(|| ApiError::not_found("pipeline"))?;
    let stream = match (which.stream, &p.streams[..]) {
        (Some(name), streams) if streams.iter().any(|s| s.name == name) => name,
        (Some(name), _) => {
            return Err(ApiError::invalid_field("stream", format!("the pipeline has no stream {name}")));
        }
        (None, [only]) => only.name.clone(),
        (None, _) => return Err(ApiError::invalid_field("stream", "the pipeline has several streams: name one")),
    };
    let limit = q.limit()?;
    let after = q.after()?.unwrap_or_default();
    let dest_id = p.destination_id.as_deref().ok_or_else(|| ApiError::not_found("destination"))?;
    let dest =
        state.store.destination(&ws.workspace_id, dest_id).await?.ok_or_else(|| ApiError::not_found("destination"))?;
    let table = crate::warehouse::contract::rejected_stream(&stream);
    let rows = state
        .warehouses
        .rows_after(
            &dest,
            (&p.pipeline_id, &table),
            &crate::warehouse::contract::REJECTED_COLUMNS,
            &after,
            limit as usize + 1,
        )
        .await
        .map_err(|e| e.refusal("cannot read the rejected rows"))?;
    let items: Vec<(String, Value)> = rows.into_iter().map(|(at, row)| (at, rejected_item(row))).collect();
    let page = q.page(items, limit, |(at, _)| at);
    Ok(ok(Page { items: page.items.into_iter().map(|(_, v)| v).collect(), next_cursor: page.next_cursor }))
}

/// A rejected row as the API shows it: the attempt a number, the record
/// the JSON it was (text only when it was not JSON).
fn rejected_item(mut row: serde_json::Map<String, Value>) -> Value {
    if let Some(Value::String(n)) = row.get("attempt")
        && let Ok(n) = n.parse::<u64>()
    {
        row.insert("attempt".into(), Value::from(n));
    }
    if let Some(Value::String(text)) = row.get("record")
        && let Ok(record) = serde_json::from_str::<Value>(text)
    {
        row.insert("record".into(), record);
    }
    Value::Object(row)
}
