//! Sources (spec section 4, "Sources").

use axum::Extension;
use axum::extract::{Path, Query, State};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{ApiJson, PageQuery, Workspace};
use crate::audit::AuditNote;
use super::{Envelope, Page, ok};
use crate::error::{ApiError, ApiResult};
use crate::ops::sources::{CreateSource, UpdateSource};
use crate::ops::{self, Executed};
use crate::state::AppState;
use crate::store::sources::Source;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(create_source, list_sources)).routes(routes!(get_source, update_source, delete_source))
}

/// Create a source: configuration validated against the connector's spec;
/// credentials by `credential_handle` only.
#[utoipa::path(post, path = "/sources", tag = "sources", request_body = CreateSource,
    responses((status = 201, body = Envelope<Source>), (status = 400, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody)))]
async fn create_source(State(state): State<AppState>, ws: Workspace, Extension(note): Extension<AuditNote>, ApiJson(body): ApiJson<CreateSource>) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, crate::ops::sources::SourceOp::CreateSource(body)).await
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct SourceFilter {
    /// Only sources of this connector (legacy aliases accepted).
    connector_id: Option<String>,
}

/// Sources of the workspace.
#[utoipa::path(get, path = "/sources", tag = "sources", params(PageQuery, SourceFilter),
    responses((status = 200, body = Envelope<Page<Source>>)))]
async fn list_sources(State(state): State<AppState>, ws: Workspace, Query(q): Query<PageQuery>, Query(f): Query<SourceFilter>) -> ApiResult<Envelope<Page<Source>>> {
    let limit = q.limit()?;
    let connector = f.connector_id.map(|c| state.plugins.canonical_id(&c).unwrap_or(c));
    let items = state.store.sources(&ws.workspace_id, connector.as_deref(), q.after()?.as_deref(), limit + 1).await?;
    Ok(ok(q.page(items, limit, |s| &s.source_id)))
}

/// One source.
#[utoipa::path(get, path = "/sources/{source_id}", tag = "sources", params(("source_id" = String, Path)),
    responses((status = 200, body = Envelope<Source>), (status = 404, body = crate::error::ErrorBody)))]
async fn get_source(State(state): State<AppState>, ws: Workspace, Path(id): Path<String>) -> ApiResult<Envelope<Source>> {
    Ok(ok(state.store.source(&ws.workspace_id, &id).await?.ok_or_else(|| ApiError::not_found("source"))?))
}

/// Change a source's name or configuration (top-level keys merged).
#[utoipa::path(patch, path = "/sources/{source_id}", tag = "sources", params(("source_id" = String, Path)), request_body = UpdateSource,
    responses((status = 200, body = Envelope<Source>), (status = 400, body = crate::error::ErrorBody)))]
async fn update_source(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(id): Path<String>,
    ApiJson(mut body): ApiJson<UpdateSource>,
) -> ApiResult<Executed> {
    body.source_id = id;
    ops::submit(&state, &ws, &note, crate::ops::sources::SourceOp::UpdateSource(body)).await
}

/// Delete a source. While connections use it: 409 `SOURCE_IN_USE` with
/// their ids. The answer's `deletion_verified` is true only if the source
/// is gone when read back.
#[utoipa::path(delete, path = "/sources/{source_id}", tag = "sources", params(("source_id" = String, Path)),
    responses((status = 200, body = Envelope<serde_json::Value>), (status = 409, body = crate::error::ErrorBody)))]
async fn delete_source(State(state): State<AppState>, ws: Workspace, Extension(note): Extension<AuditNote>, Path(id): Path<String>) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, crate::ops::sources::SourceOp::DeleteSource { source_id: id }).await
}
