//! Plugin administration for installation operators: list, unload, load.
//! (`service plugins ...` does the same offline, against the database.)

use axum::Extension;
use axum::extract::{Path, State};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{Caller, Workspace};
use super::{Envelope, Page, ok};
use crate::audit::AuditNote;
use crate::error::{ApiError, ApiResult};
use crate::ops::plugins::Plugin;
use crate::ops::{self, Executed};
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list_plugins)).routes(routes!(unload_plugin)).routes(routes!(load_plugin))
}

/// Every plugin of the installation (operators).
#[utoipa::path(get, path = "/admin/plugins", tag = "plugins",
    responses((status = 200, body = Envelope<Page<Plugin>>), (status = 403, body = crate::error::ErrorBody)))]
async fn list_plugins(State(state): State<AppState>, Caller(p): Caller) -> ApiResult<Envelope<Page<Plugin>>> {
    if !state.store.is_operator(&p.user_id).await? {
        return Err(ApiError::permission_denied("permission denied: only installation operators manage plugins"));
    }
    let items = state.plugins.list().await.iter().map(Plugin::from).collect();
    Ok(ok(Page { items, next_cursor: None }))
}

/// Unload a plugin: its connector becomes unavailable everywhere; saved
/// sources keep their configuration (operators). A proposal where the
/// caller asks for one or is an MCP client.
#[utoipa::path(post, path = "/admin/plugins/{connector_id}/unload", tag = "plugins", params(("connector_id" = String, Path)),
    responses((status = 200, body = Envelope<Plugin>), (status = 202, body = Envelope<serde_json::Value>), (status = 403, body = crate::error::ErrorBody)))]
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
    responses((status = 200, body = Envelope<Plugin>), (status = 202, body = Envelope<serde_json::Value>), (status = 403, body = crate::error::ErrorBody)))]
async fn load_plugin(
    State(state): State<AppState>,
    ws: Workspace,
    Extension(note): Extension<AuditNote>,
    Path(id): Path<String>,
) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, crate::ops::plugins::PluginOp::LoadPlugin { connector_id: id }).await
}
