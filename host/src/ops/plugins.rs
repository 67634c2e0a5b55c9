//! Plugin operations: switching a connector off and on for the whole
//! installation. They go through the same door as every other write, so a
//! proposal header or an MCP client gets a proposal that an operator
//! decides.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::act::{Act, Category, Ctx, Executed};
use crate::access::WorkspaceAccess;
use crate::audit::AuditNote;
use crate::error::{ApiError, ApiResult};
use crate::plugin::registry::PluginSummary;
use crate::state::AppState;

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
    /// The name of the trusted publisher key that signed the component;
    /// null for bundled plugins and unsigned files.
    pub signer: Option<String>,
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
            signer: p.signer.clone(),
            enabled: p.enabled,
            available: p.available,
            hosts: p.info.hosts.iter().map(ToString::to_string).collect(),
        }
    }
}

/// Plugin operations (installation operators).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "operation", rename_all = "snake_case")]
pub enum PluginOp {
    /// Disable a connector everywhere.
    UnloadPlugin { connector_id: String },
    /// Enable a connector again.
    LoadPlugin { connector_id: String },
}

impl Act for PluginOp {
    fn action(&self) -> &'static str {
        match self {
            PluginOp::UnloadPlugin { .. } => "plugins.unload",
            PluginOp::LoadPlugin { .. } => "plugins.load",
        }
    }

    fn category(&self) -> Category {
        Category::Plugins
    }

    fn summary(&self) -> String {
        match self {
            PluginOp::UnloadPlugin { connector_id } => {
                format!("Unload plugin {connector_id}: its connector becomes unavailable on every server")
            }
            PluginOp::LoadPlugin { connector_id } => format!("Load plugin {connector_id}"),
        }
    }
}

impl PluginOp {
    pub(super) async fn run(self, ctx: &Ctx<'_>) -> ApiResult<Executed> {
        match self {
            PluginOp::UnloadPlugin { connector_id } => unload(ctx.state, ctx.access, ctx.note, &connector_id).await,
            PluginOp::LoadPlugin { connector_id } => load(ctx.state, ctx.access, ctx.note, &connector_id).await,
        }
    }
}

async fn known(state: &AppState, id: &str) -> ApiResult<()> {
    match state.plugins.summary(id).await {
        Some(_) => Ok(()),
        None => Err(ApiError::not_found("plugin")),
    }
}

pub async fn unload(state: &AppState, access: &WorkspaceAccess, note: &AuditNote, id: &str) -> ApiResult<Executed> {
    note.target("plugin", id);
    known(state, id).await?;
    let id = state.plugins.unload(id, Some(&access.principal.user_id)).await?;
    Executed::ok(Plugin::from(&state.plugins.summary(&id).await.ok_or_else(|| ApiError::not_found("plugin"))?))
}

pub async fn load(state: &AppState, access: &WorkspaceAccess, note: &AuditNote, id: &str) -> ApiResult<Executed> {
    note.target("plugin", id);
    known(state, id).await?;
    let id = state.plugins.load(id, Some(&access.principal.user_id)).await?;
    Executed::ok(Plugin::from(&state.plugins.summary(&id).await.ok_or_else(|| ApiError::not_found("plugin"))?))
}
