//! Reverse ETL: models, destinations, activations and runs (spec section
//! 4, "Reverse ETL"), with the path parameters `modelId`,
//! `destinationId`, `activationId` and `runId` as the spec names them.

use axum::Extension;
use axum::extract::{Path, State};
use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{ApiJson, ApiQuery, MaybeJson, PageQuery, Workspace};
use super::{Envelope, Page, ok};
use crate::audit::AuditNote;
use crate::error::{ApiError, ApiResult};
use crate::ops::reverse_etl::{
    CreateActivation, CreateModel, CreateRetlDestination, PrepareModel, ReverseEtlOp, RunActivation, UpdateActivation,
    UpdateModel, UpdateRetlDestination,
};
use crate::ops::{self, Executed};
use crate::reverse_etl::preview::Preview;
use crate::state::AppState;
use crate::store::kinds::{JobKind, JobStatus, Trigger};
use crate::store::progress::JobProgress;
use crate::store::reverse_etl::{Activation, Model, RetlDestination};

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(prepare))
        .routes(routes!(list_models, create_model))
        .routes(routes!(update_model, delete_model))
        .routes(routes!(list_destinations, create_destination))
        .routes(routes!(update_destination, delete_destination))
        .routes(routes!(list_activations, create_activation))
        .routes(routes!(update_activation, delete_activation))
        .routes(routes!(run_activation))
        .routes(routes!(get_run))
}

/// Validate a model's query against its warehouse: the columns with their
/// types, up to 100 sample rows (values over the preview's cell size shown
/// by their size), a suggested primary key and, for a destination,
/// suggested mappings by name. Creates nothing; editors. It runs a query
/// with the workspace's credentials, so it follows the approval policy of
/// the reverse-ETL category like the writes: from an MCP client (or with
/// `X-Service-Execution-Mode: proposal`) it is a proposal by default.
#[utoipa::path(post, path = "/reverse-etl/prepare", tag = "reverse-etl", request_body = PrepareModel,
    responses((status = 200, body = Envelope<Preview>), (status = 202, body = Envelope<crate::ops::Proposed>), (status = 400, body = crate::error::ErrorBody),
        (status = 403, body = crate::error::ErrorBody), (status = 502, body = crate::error::ErrorBody)))]
async fn prepare(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    ApiJson(body): ApiJson<PrepareModel>,
) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, ReverseEtlOp::Prepare(body)).await
}

/// Models of the workspace.
#[utoipa::path(get, path = "/reverse-etl/models", tag = "reverse-etl", params(PageQuery), responses((status = 200, body = Envelope<Page<Model>>)))]
async fn list_models(
    State(state): State<AppState>,
    ws: Workspace,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> ApiResult<Envelope<Page<Model>>> {
    let limit = q.limit()?;
    let items = state.store.models(&ws.workspace_id, q.after()?.as_deref(), limit + 1).await?;
    Ok(ok(q.page(items, limit, |m| &m.model_id)))
}

/// Create a model: a name, one `SELECT` over an SQLite or PostgreSQL
/// destination of the workspace (run read-only to check it) and its
/// primary-key column.
#[utoipa::path(post, path = "/reverse-etl/models", tag = "reverse-etl", request_body = CreateModel,
    responses((status = 201, body = Envelope<Model>), (status = 400, body = crate::error::ErrorBody), (status = 502, body = crate::error::ErrorBody)))]
async fn create_model(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    ApiJson(body): ApiJson<CreateModel>,
) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, ReverseEtlOp::CreateModel(body)).await
}

/// Change a model.
#[utoipa::path(patch, path = "/reverse-etl/models/{modelId}", tag = "reverse-etl", params(("modelId" = String, Path)), request_body = UpdateModel,
    responses((status = 200, body = Envelope<Model>), (status = 400, body = crate::error::ErrorBody), (status = 404, body = crate::error::ErrorBody), (status = 502, body = crate::error::ErrorBody)))]
async fn update_model(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(id): Path<String>,
    ApiJson(mut body): ApiJson<UpdateModel>,
) -> ApiResult<Executed> {
    body.model_id = id;
    ops::submit(&state, &ws, &note, ReverseEtlOp::UpdateModel(body)).await
}

/// Delete a model. While activations use it: 409 `MODEL_IN_USE` with
/// their ids.
#[utoipa::path(delete, path = "/reverse-etl/models/{modelId}", tag = "reverse-etl", params(("modelId" = String, Path)),
    responses((status = 200, body = Envelope<Value>), (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody)))]
async fn delete_model(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(id): Path<String>,
) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, ReverseEtlOp::DeleteModel { model_id: id }).await
}

/// Reverse-ETL destinations of the workspace.
#[utoipa::path(get, path = "/reverse-etl/destinations", tag = "reverse-etl", params(PageQuery), responses((status = 200, body = Envelope<Page<RetlDestination>>)))]
async fn list_destinations(
    State(state): State<AppState>,
    ws: Workspace,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> ApiResult<Envelope<Page<RetlDestination>>> {
    let limit = q.limit()?;
    let items = state.store.retl_destinations(&ws.workspace_id, q.after()?.as_deref(), limit + 1).await?;
    Ok(ok(q.page(items, limit, |d| &d.destination_id)))
}

/// Create a reverse-ETL destination: a connector's writable object (its
/// writable fields and matching field come from the connector), or an
/// HTTPS webhook on a host the operator allows.
#[utoipa::path(post, path = "/reverse-etl/destinations", tag = "reverse-etl", request_body = CreateRetlDestination,
    responses((status = 201, body = Envelope<RetlDestination>), (status = 400, body = crate::error::ErrorBody), (status = 502, body = crate::error::ErrorBody), (status = 504, body = crate::error::ErrorBody)))]
async fn create_destination(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    ApiJson(body): ApiJson<CreateRetlDestination>,
) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, ReverseEtlOp::CreateRetlDestination(body)).await
}

/// Change a reverse-ETL destination: configuration keys are merged.
#[utoipa::path(patch, path = "/reverse-etl/destinations/{destinationId}", tag = "reverse-etl", params(("destinationId" = String, Path)), request_body = UpdateRetlDestination,
    responses((status = 200, body = Envelope<RetlDestination>), (status = 400, body = crate::error::ErrorBody), (status = 404, body = crate::error::ErrorBody), (status = 502, body = crate::error::ErrorBody), (status = 504, body = crate::error::ErrorBody)))]
async fn update_destination(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(id): Path<String>,
    ApiJson(mut body): ApiJson<UpdateRetlDestination>,
) -> ApiResult<Executed> {
    body.destination_id = id;
    ops::submit(&state, &ws, &note, ReverseEtlOp::UpdateRetlDestination(body)).await
}

/// Delete a reverse-ETL destination. While activations use it: 409
/// `DESTINATION_IN_USE` with their ids.
#[utoipa::path(delete, path = "/reverse-etl/destinations/{destinationId}", tag = "reverse-etl", params(("destinationId" = String, Path)),
    responses((status = 200, body = Envelope<Value>), (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody)))]
async fn delete_destination(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(id): Path<String>,
) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, ReverseEtlOp::DeleteRetlDestination { destination_id: id }).await
}

/// Activations of the workspace.
#[utoipa::path(get, path = "/reverse-etl/activations", tag = "reverse-etl", params(PageQuery), responses((status = 200, body = Envelope<Page<Activation>>)))]
async fn list_activations(
    State(state): State<AppState>,
    ws: Workspace,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> ApiResult<Envelope<Page<Activation>>> {
    let limit = q.limit()?;
    let items = state.store.activations(&ws.workspace_id, q.after()?.as_deref(), limit + 1).await?;
    Ok(ok(q.page(items, limit, |a| &a.activation_id)))
}

/// Create an activation: a model sent to a destination through a field
/// mapping, in `upsert`, `update_only`, `insert_only` or `mirror` mode, on
/// a schedule or by hand.
#[utoipa::path(post, path = "/reverse-etl/activations", tag = "reverse-etl", request_body = CreateActivation,
    responses((status = 201, body = Envelope<Activation>), (status = 400, body = crate::error::ErrorBody), (status = 502, body = crate::error::ErrorBody), (status = 504, body = crate::error::ErrorBody)))]
async fn create_activation(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    ApiJson(body): ApiJson<CreateActivation>,
) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, ReverseEtlOp::CreateActivation(body)).await
}

/// Change an activation (a changed mapping makes every row count as
/// changed on the next run).
#[utoipa::path(patch, path = "/reverse-etl/activations/{activationId}", tag = "reverse-etl", params(("activationId" = String, Path)), request_body = UpdateActivation,
    responses((status = 200, body = Envelope<Activation>), (status = 400, body = crate::error::ErrorBody), (status = 404, body = crate::error::ErrorBody), (status = 502, body = crate::error::ErrorBody), (status = 504, body = crate::error::ErrorBody)))]
async fn update_activation(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(id): Path<String>,
    ApiJson(mut body): ApiJson<UpdateActivation>,
) -> ApiResult<Executed> {
    body.activation_id = id;
    ops::submit(&state, &ws, &note, ReverseEtlOp::UpdateActivation(body)).await
}

/// Delete an activation with its diff state and runs; 409
/// `EXECUTION_CONFLICT` while a run is active.
#[utoipa::path(delete, path = "/reverse-etl/activations/{activationId}", tag = "reverse-etl", params(("activationId" = String, Path)),
    responses((status = 200, body = Envelope<Value>), (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody)))]
async fn delete_activation(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(id): Path<String>,
) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, ReverseEtlOp::DeleteActivation { activation_id: id }).await
}

/// Start a run (`full_resync` sends every row whatever the diff state).
/// One run is active per activation: another request gets 409
/// `EXECUTION_CONFLICT` with the active run in `details`.
#[utoipa::path(post, path = "/reverse-etl/activations/{activationId}/run", tag = "reverse-etl", params(("activationId" = String, Path)), request_body(content = RunActivation, content_type = "application/json"),
    responses((status = 201, body = Envelope<Value>), (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody)))]
async fn run_activation(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(id): Path<String>,
    MaybeJson(body): MaybeJson<RunActivation>,
) -> ApiResult<Executed> {
    let mut body = body.unwrap_or_default();
    body.activation_id = id;
    ops::submit(&state, &ws, &note, ReverseEtlOp::RunActivation(body)).await
}

/// A run as `GET /reverse-etl/runs/{runId}` shows it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RunView {
    pub run_id: String,
    pub activation_id: String,
    pub status: JobStatus,
    pub full_resync: bool,
    pub trigger: Trigger,
    pub attempts: i64,
    /// Its `phase`, `counts` (queried, added, changed, removed, unchanged,
    /// invalid, failed, skipped), `diff_ms`, and up to 100
    /// `failed_samples` and `invalid_samples` (`{key, reason}`); `{}`
    /// before it starts.
    pub progress: JobProgress,
    /// Sanitised reason of a failed run.
    pub error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// A run: status, timestamps, counts of rows queried, added, changed,
/// removed, unchanged, invalid and failed, with samples of failed and
/// invalid rows and why. Cancel one with `POST /jobs/{job_id}/cancel`.
#[utoipa::path(get, path = "/reverse-etl/runs/{runId}", tag = "reverse-etl", params(("runId" = String, Path)),
    responses((status = 200, body = Envelope<RunView>), (status = 404, body = crate::error::ErrorBody)))]
async fn get_run(State(state): State<AppState>, ws: Workspace, Path(id): Path<String>) -> ApiResult<Envelope<RunView>> {
    let job = state.store.run(&ws.workspace_id, &id).await?.ok_or_else(|| ApiError::not_found("run"))?;
    Ok(ok(RunView {
        run_id: job.job_id,
        activation_id: job.activation_id.unwrap_or_default(),
        status: job.status,
        full_resync: job.kind == JobKind::ActivationResync,
        trigger: job.trigger,
        attempts: job.attempts,
        progress: job.progress,
        error: job.error,
        created_at: job.created_at,
        started_at: job.started_at,
        finished_at: job.finished_at,
    }))
}
