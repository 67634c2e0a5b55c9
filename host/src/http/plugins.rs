//! Plugin administration for installation operators: list, unload, load.
//! (`service plugins ...` does the same offline, against the database.)

use axum::Extension;
use axum::extract::{Path, State};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::{Caller, Workspace};
use crate::audit::AuditNote;
use super::{Envelope, Page, ok};
use crate::error::{ApiError, ApiResult};
use crate::ops::{self, Executed};
use crate::plugin::registry::PluginSummary;
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list_plugins)).routes(routes!(unload_plugin)).routes(routes!(load_plugin))
}

/// A plugin as operators see it.
#[derive(Debug, Serialize, ToSchema)]
pub struct Plugin {
    pub connector_id: String,
    pub name: String,
    pub version: String,
    pub interface_version: &'static str,
    /// SHA-256 of the component.
    pub digest: String,
    /// `bundled:<name>` or `file:<name>`; absent when the file is gone.
    pub source: Option<String>,
    /// The operator's switch, shared by all replicas.
    pub enabled: bool,
    /// Loaded and enabled.
    pub available: bool,
    /// Hosts the connector declared.
    pub hosts: Vec<String>,
}

impl From<&PluginSummary> for Plugin {
    fn from(p: &PluginSummary) -> Self {
        Plugin {
            connector_id: p.info.id.clone(),
            name: p.info.name.clone(),
            version: p.info.version.clone(),
            interface_version: p.interface_version.as_str(),
            digest: p.digest.clone(),
            source: p.source.as_ref().map(ToString::to_string),
            enabled: p.enabled,
            available: p.available,
            hosts: p.info.hosts.iter().map(ToString::to_string).collect(),
        }
    }
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
async fn unload_plugin(State(state): State<AppState>, ws: Workspace, Extension(note): Extension<AuditNote>, Path(id): Path<String>) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, crate::ops::plugins::PluginOp::UnloadPlugin { connector_id: id }).await
}

/// Load a plugin again: its connector is available again (operators).
#[utoipa::path(post, path = "/admin/plugins/{connector_id}/load", tag = "plugins", params(("connector_id" = String, Path)),
    responses((status = 200, body = Envelope<Plugin>), (status = 202, body = Envelope<serde_json::Value>), (status = 403, body = crate::error::ErrorBody)))]
async fn load_plugin(State(state): State<AppState>, ws: Workspace, Extension(note): Extension<AuditNote>, Path(id): Path<String>) -> ApiResult<Executed> {
    ops::submit(&state, &ws, &note, crate::ops::plugins::PluginOp::LoadPlugin { connector_id: id }).await
}
