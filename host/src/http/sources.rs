//! Sources (spec section 4, "Sources").

use axum::Extension;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{ApiJson, ApiQuery, PageQuery, Workspace};
use super::{Envelope, Page, ok};
use crate::access::Role;
use crate::audit::AuditNote;
use crate::connectors::entities::{self, EntityOption};
use crate::error::{ApiError, ApiResult};
use crate::ops::sources::{CreateSource, UpdateSource};
use crate::ops::{self, Executed};
use crate::state::AppState;
use crate::store::credentials::CredentialHandle;
use crate::store::kinds::CredentialStatus;
use crate::store::sources::Source;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(create_source, list_sources)).routes(routes!(entity_options)).routes(routes!(
        get_source,
        update_source,
        delete_source
    ))
}

/// Body of `POST /sources/entities`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct EntitiesRequest {
    /// A connector that offers entity options (legacy aliases accepted).
    #[schema(min_length = 1, max_length = 200)]
    pub connector_id: String,
    /// The credential the options are read with (from the OAuth flow).
    pub credential_handle: CredentialHandle,
    /// The config field to list options for, for example `portal_id`,
    /// `brand_ids` or `channel_ids`.
    #[schema(min_length = 1, max_length = 100)]
    pub field: String,
    /// What the user chose so far (for example `portal_id` when asking
    /// for `brand_ids`, `brand_ids` when asking for `channel_ids`).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub configuration: Option<Value>,
}

/// The options of one field.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct EntityOptions {
    pub connector_id: String,
    pub credential_handle: CredentialHandle,
    pub field: String,
    /// The choices, in the provider's order.
    pub options: Vec<EntityOption>,
    /// Opaque; pass as `cursor` for the next page of options.
    pub next_cursor: Option<String>,
}

/// Provider-backed options for a connector's config field (after OAuth):
/// the portal, the brands of the chosen portal, the channels of the chosen
/// brands. Paged with `limit` and `cursor`. Creates nothing.
#[utoipa::path(post, path = "/sources/entities", tag = "sources", params(PageQuery), request_body = EntitiesRequest,
    responses((status = 200, body = Envelope<EntityOptions>), (status = 400, body = crate::error::ErrorBody), (status = 403, body = crate::error::ErrorBody),
        (status = 409, body = crate::error::ErrorBody), (status = 422, body = crate::error::ErrorBody), (status = 429, body = crate::error::ErrorBody),
        (status = 502, body = crate::error::ErrorBody)))]
async fn entity_options(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    ApiQuery(q): ApiQuery<PageQuery>,
    ApiJson(body): ApiJson<EntitiesRequest>,
) -> ApiResult<Envelope<EntityOptions>> {
    note.action("sources.entities");
    // The plugin runs with the workspace's credentials: editors only, as
    // for check and preview.
    ws.require(Role::Editor)?;
    let limit = q.limit()?;
    let after = q.after()?;
    let connector_id = state
        .plugins
        .canonical_id(&body.connector_id)
        .ok_or_else(|| ApiError::invalid_field("connector_id", "unknown connector"))?;
    let chosen = match body.configuration {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m,
        Some(_) => return Err(ApiError::invalid_field("configuration", "configuration must be an object")),
    };
    crate::ops::text::check_config("configuration", &Value::Object(chosen.clone()))?;
    let all = entities::options(&state, &ws, &connector_id, &body.credential_handle, &chosen, &body.field).await?;
    // Option values are the provider's and may hold any character: the
    // cursor is the position in the list instead.
    let start = match &after {
        None => 0,
        Some(a) => {
            a.parse::<usize>().map_err(|_| ApiError::invalid_field("cursor", "cursor is not one this server issued"))?
        }
    };
    let total = all.len();
    let options: Vec<EntityOption> = all.into_iter().skip(start).take(limit as usize).collect();
    let end = start.saturating_add(options.len());
    let next_cursor = (end < total).then(|| end.to_string());
    Ok(ok(EntityOptions {
        connector_id,
        credential_handle: body.credential_handle,
        field: body.field,
        options,
        next_cursor,
    }))
}

/// Create a source: configuration validated against the connector's spec;
/// credentials by `credential_handle` only.
#[utoipa::path(post, path = "/sources", tag = "sources", request_body = CreateSource,
    responses((status = 201, body = Envelope<Source>), (status = 400, body = crate::error::ErrorBody), (status = 409, body = crate::error::ErrorBody)))]
async fn create_source(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    ApiJson(body): ApiJson<CreateSource>,
) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, crate::ops::sources::SourceOp::CreateSource(body)).await
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct SourceFilter {
    /// Only sources of this connector (legacy aliases accepted).
    connector_id: Option<String>,
}

/// A source as it is read: the record, and what stands in its way.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SourceView {
    #[serde(flatten)]
    pub source: Source,
    /// Present when a credential the configuration names no longer works
    /// (revoked, or needing re-authorisation): one line per field.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub credential_warnings: Vec<String>,
}

/// Reads a source's credential fields against the vault.
async fn view(state: &AppState, workspace_id: &str, source: Source) -> ApiResult<SourceView> {
    let mut warnings = Vec::new();
    for (key, handle) in CredentialHandle::in_configuration(&source.configuration) {
        match state.store.credential_by_handle(workspace_id, handle.as_str()).await? {
            None => warnings.push(format!("{key}: the credential no longer exists")),
            Some(c) if c.record.status == CredentialStatus::Revoked => {
                let when = c.record.revoked_at.map(|t| t.to_rfc3339()).unwrap_or_default();
                warnings
                    .push(format!("{key}: the credential was revoked {when}; store a new one and update the source"));
            }
            Some(c) if c.record.status != CredentialStatus::Active => {
                warnings.push(format!("{key}: the credential is {}", c.record.status))
            }
            Some(_) => {}
        }
    }
    Ok(SourceView { source, credential_warnings: warnings })
}

/// Sources of the workspace.
#[utoipa::path(get, path = "/sources", tag = "sources", params(PageQuery, SourceFilter),
    responses((status = 200, body = Envelope<Page<SourceView>>)))]
async fn list_sources(
    State(state): State<AppState>,
    ws: Workspace,
    ApiQuery(q): ApiQuery<PageQuery>,
    ApiQuery(f): ApiQuery<SourceFilter>,
) -> ApiResult<Envelope<Page<SourceView>>> {
    let limit = q.limit()?;
    let connector = f.connector_id.map(|c| state.plugins.canonical_id(&c).unwrap_or(c));
    let items = state.store.sources(&ws.workspace_id, connector.as_deref(), q.after()?.as_deref(), limit + 1).await?;
    let page = q.page(items, limit, |s| &s.source_id);
    let mut items = Vec::with_capacity(page.items.len());
    for s in page.items {
        items.push(view(&state, &ws.workspace_id, s).await?);
    }
    Ok(ok(Page { items, next_cursor: page.next_cursor }))
}

/// One source; `credential_warnings` says when a credential it names no
/// longer works.
#[utoipa::path(get, path = "/sources/{source_id}", tag = "sources", params(("source_id" = String, Path)),
    responses((status = 200, body = Envelope<SourceView>), (status = 404, body = crate::error::ErrorBody)))]
async fn get_source(
    State(state): State<AppState>,
    ws: Workspace,
    Path(id): Path<String>,
) -> ApiResult<Envelope<SourceView>> {
    let source = state.store.source(&ws.workspace_id, &id).await?.ok_or_else(|| ApiError::not_found("source"))?;
    Ok(ok(view(&state, &ws.workspace_id, source).await?))
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
async fn delete_source(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(id): Path<String>,
) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, crate::ops::sources::SourceOp::DeleteSource { source_id: id }).await
}
