//! Destinations (spec section 4, "Destinations").

use axum::Extension;
use axum::extract::{Path, State};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{ApiJson, ApiQuery, PageQuery, Workspace};
use super::{Envelope, Page, ok};
use crate::audit::AuditNote;
use crate::error::{ApiError, ApiResult};
use crate::ops::destinations::{CreateDestination, UpdateDestination};
use crate::ops::{self, Executed};
use crate::state::AppState;
use crate::store::destinations::Destination;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(create_destination, list_destinations)).routes(routes!(
        get_destination,
        update_destination,
        delete_destination
    ))
}

/// Create a destination: an SQLite file, a PostgreSQL database or a
/// directory of JSON-lines files (under the data directory).
#[utoipa::path(post, path = "/destinations", tag = "destinations", request_body = CreateDestination,
    responses((status = 201, body = Envelope<Destination>), (status = 400, body = crate::error::ErrorBody)))]
async fn create_destination(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    ApiJson(body): ApiJson<CreateDestination>,
) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, crate::ops::destinations::DestinationOp::CreateDestination(body)).await
}

/// Destinations of the workspace.
#[utoipa::path(get, path = "/destinations", tag = "destinations", params(PageQuery), responses((status = 200, body = Envelope<Page<Destination>>)))]
async fn list_destinations(
    State(state): State<AppState>,
    ws: Workspace,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> ApiResult<Envelope<Page<Destination>>> {
    let limit = q.limit()?;
    let items = state.store.destinations(&ws.workspace_id, q.after()?.as_deref(), limit + 1).await?;
    Ok(ok(q.page(items, limit, |d| &d.destination_id)))
}

/// One destination.
#[utoipa::path(get, path = "/destinations/{destination_id}", tag = "destinations", params(("destination_id" = String, Path)),
    responses((status = 200, body = Envelope<Destination>), (status = 404, body = crate::error::ErrorBody)))]
async fn get_destination(
    State(state): State<AppState>,
    ws: Workspace,
    Path(id): Path<String>,
) -> ApiResult<Envelope<Destination>> {
    Ok(ok(state.store.destination(&ws.workspace_id, &id).await?.ok_or_else(|| ApiError::not_found("destination"))?))
}

/// Change a destination's name or configuration: top-level configuration
/// keys are merged and a `null` removes one, as for sources.
#[utoipa::path(patch, path = "/destinations/{destination_id}", tag = "destinations", params(("destination_id" = String, Path)), request_body = UpdateDestination,
    responses((status = 200, body = Envelope<Destination>), (status = 400, body = crate::error::ErrorBody)))]
async fn update_destination(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(id): Path<String>,
    ApiJson(mut body): ApiJson<UpdateDestination>,
) -> ApiResult<Executed> {
    body.destination_id = id;
    ops::submit(&state, &ws, &note, crate::ops::destinations::DestinationOp::UpdateDestination(body)).await
}

/// Delete a destination. While pipelines write to it: 409
/// `DESTINATION_IN_USE` with their ids. The tables and files it wrote stay.
#[utoipa::path(delete, path = "/destinations/{destination_id}", tag = "destinations", params(("destination_id" = String, Path)),
    responses((status = 200, body = Envelope<serde_json::Value>), (status = 202, body = Envelope<crate::ops::Proposed>),
        (status = 403, body = crate::error::ErrorBody), (status = 404, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody)))]
async fn delete_destination(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(id): Path<String>,
) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, crate::ops::destinations::DestinationOp::DeleteDestination { destination_id: id })
        .await
}
