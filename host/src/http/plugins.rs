//! Plugin administration for installation operators: list, unload, load,
//! list a plugin's installed versions and make one current. (`service
//! plugins ...` does the same offline, against the database.)

use axum::Extension;
use axum::extract::{Path, State};
use serde::Deserialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{Caller, Workspace};
use super::{Envelope, Page, ok};
use crate::audit::AuditNote;
use crate::error::{ApiError, ApiResult};
use crate::ops::plugins::{Plugin, Version};
use crate::ops::{self, Executed};
use crate::state::AppState;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_plugins))
        .routes(routes!(unload_plugin))
        .routes(routes!(load_plugin))
        .routes(routes!(list_versions))
        .routes(routes!(use_version))
}

async fn operator(state: &AppState, user_id: &str) -> ApiResult<()> {
    if !state.store.is_operator(user_id).await? {
        return Err(ApiError::permission_denied("permission denied: only installation operators manage plugins"));
    }
    Ok(())
}

/// Every plugin of the installation (operators).
#[utoipa::path(get, path = "/admin/plugins", tag = "plugins",
    responses((status = 200, body = Envelope<Page<Plugin>>), (status = 403, body = crate::error::ErrorBody)))]
async fn list_plugins(State(state): State<AppState>, Caller(p): Caller) -> ApiResult<Envelope<Page<Plugin>>> {
    operator(&state, &p.user_id).await?;
    let items = state.plugins.list().await?.iter().map(Plugin::from).collect();
    Ok(ok(Page { items, next_cursor: None }))
}

/// Unload a plugin: its connector becomes unavailable everywhere; saved
/// sources keep their configuration (operators). A proposal where the
/// caller asks for one or is an MCP client.
#[utoipa::path(post, path = "/admin/plugins/{connector_id}/unload", tag = "plugins", params(("connector_id" = String, Path)),
    responses((status = 200, body = Envelope<Plugin>), (status = 202, body = Envelope<crate::ops::Proposed>), (status = 403, body = crate::error::ErrorBody)))]
async fn unload_plugin(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(id): Path<String>,
) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, crate::ops::plugins::PluginOp::UnloadPlugin { connector_id: id }).await
}

/// Load a plugin again: its connector is available again (operators).
#[utoipa::path(post, path = "/admin/plugins/{connector_id}/load", tag = "plugins", params(("connector_id" = String, Path)),
    responses((status = 200, body = Envelope<Plugin>), (status = 202, body = Envelope<crate::ops::Proposed>), (status = 403, body = crate::error::ErrorBody)))]
async fn load_plugin(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(id): Path<String>,
) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, crate::ops::plugins::PluginOp::LoadPlugin { connector_id: id }).await
}

/// A plugin's installed versions, oldest first; `current` marks the one
/// new jobs run (operators).
#[utoipa::path(get, path = "/admin/plugins/{connector_id}/versions", tag = "plugins", params(("connector_id" = String, Path)),
    responses((status = 200, body = Envelope<Page<Version>>), (status = 403, body = crate::error::ErrorBody), (status = 404, body = crate::error::ErrorBody)))]
async fn list_versions(
    State(state): State<AppState>,
    Caller(p): Caller,
    Path(id): Path<String>,
) -> ApiResult<Envelope<Page<Version>>> {
    operator(&state, &p.user_id).await?;
    let items = crate::ops::plugins::versions(&state, &id).await?;
    Ok(ok(Page { items, next_cursor: None }))
}

/// Which version to make current.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct UseVersion {
    /// A version the plugin declares, or a digest (at least 12 leading
    /// hex characters) where several components declare the same one.
    pub version: String,
}

/// Make an installed version current: new jobs run it, running jobs keep
/// theirs; rolling back is using the previous version (operators). The
/// proposal, where there is one, names the component and what it widens.
#[utoipa::path(post, path = "/admin/plugins/{connector_id}/use", tag = "plugins", params(("connector_id" = String, Path)),
    request_body = UseVersion,
    responses((status = 200, body = Envelope<Plugin>), (status = 202, body = Envelope<crate::ops::Proposed>), (status = 403, body = crate::error::ErrorBody), (status = 404, body = crate::error::ErrorBody)))]
async fn use_version(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(id): Path<String>,
    super::extract::ApiJson(body): super::extract::ApiJson<UseVersion>,
) -> ApiResult<Executed> {
    note.action("plugins.use");
    note.target("plugin", &id);
    operator(&state, &ws.principal.user_id).await?;
    let plan = state.plugins.plan_use(&id, &body.version).await?;
    ops::submit(&state, &ws, &note, crate::ops::plugins::PluginOp::UsePluginVersion(plan)).await
}
