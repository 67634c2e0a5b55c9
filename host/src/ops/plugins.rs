//! Plugin operations: switching a connector off and on for the whole
//! installation, and making another installed version current (rolling
//! back is making the previous one current). They go through the same
//! door as every other write, so a proposal header or an MCP client gets a
//! proposal that an operator decides; a proposal to use another version
//! names the exact component and shows what it would widen.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::act::{Act, Category, Ctx, Executed};
use crate::error::{ApiError, ApiResult};
use crate::plugin::registry::{PlannedUse, PluginSummary};
use crate::state::AppState;
use crate::store::plugins::PluginVersion;

/// A plugin as operators see it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Plugin {
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
pub(crate) enum PluginOp {
    /// Disable a connector everywhere.
    UnloadPlugin { connector_id: String },
    /// Enable a connector again.
    LoadPlugin { connector_id: String },
    /// Make an installed version current, as planned when proposed.
    UsePluginVersion(PlannedUse),
}

impl Act for PluginOp {
    fn action(&self) -> &'static str {
        match self {
            PluginOp::UnloadPlugin { .. } => "plugins.unload",
            PluginOp::LoadPlugin { .. } => "plugins.load",
            PluginOp::UsePluginVersion(_) => "plugins.use",
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
            PluginOp::UsePluginVersion(plan) => {
                let now = plan.from.as_ref().map(|f| format!(" (now {})", f.version)).unwrap_or_default();
                let widens = if plan.widening.is_empty() {
                    "it asks for nothing the current version may not do".to_owned()
                } else {
                    format!("it widens what the plugin may do: {}", plan.widening.join("; "))
                };
                format!(
                    "Use version {} (sha256 {}) of plugin {}{now}; {widens}",
                    plan.to.version, plan.to.digest, plan.connector_id
                )
            }
        }
    }
}

impl PluginOp {
    pub(super) async fn run(self, ctx: &Ctx<'_>) -> ApiResult<Executed> {
        match self {
            PluginOp::UnloadPlugin { connector_id } => unload(ctx, &connector_id).await,
            PluginOp::LoadPlugin { connector_id } => load(ctx, &connector_id).await,
            PluginOp::UsePluginVersion(plan) => use_version(ctx, plan).await,
        }
    }
}

/// An installed version as operators see it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Version {
    pub version: String,
    pub digest: String,
    pub interface_version: String,
    /// The trusted publisher key that signed it, when it was installed.
    pub signer: Option<String>,
    /// `bundled:<name>`, `file:<name>` or the registry reference it was
    /// pulled from.
    pub origin: String,
    /// The one new jobs run.
    pub current: bool,
}

/// A connector's installed versions, oldest first.
pub(crate) async fn versions(state: &AppState, id: &str) -> ApiResult<Vec<Version>> {
    let (versions, current) = state.plugins.versions(id).await?;
    Ok(versions
        .into_iter()
        .map(|v: PluginVersion| Version {
            current: current.as_deref() == Some(v.digest.as_str()),
            version: v.version,
            digest: v.digest,
            interface_version: v.interface,
            signer: v.signer,
            origin: v.origin,
        })
        .collect())
}

/// What the audit record of a load or switch adds: the component's digest,
/// version and signer.
fn loaded_details(p: &PluginSummary) -> serde_json::Value {
    serde_json::json!({ "digest": p.digest, "version": p.info.version, "signer": p.signer })
}

async fn known(state: &AppState, id: &str) -> ApiResult<()> {
    match state.plugins.summary(id).await? {
        Some(_) => Ok(()),
        None => Err(ApiError::not_found("plugin")),
    }
}

pub(crate) async fn unload(ctx: &Ctx<'_>, id: &str) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    note.target("plugin", id);
    known(state, id).await?;
    let id = state.plugins.unload(id, Some(&access.principal.user_id)).await?;
    Executed::ok(Plugin::from(&state.plugins.summary(&id).await?.ok_or_else(|| ApiError::not_found("plugin"))?))
}

pub(crate) async fn load(ctx: &Ctx<'_>, id: &str) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    note.target("plugin", id);
    known(state, id).await?;
    let id = state.plugins.load(id, Some(&access.principal.user_id)).await?;
    let summary = state.plugins.summary(&id).await?.ok_or_else(|| ApiError::not_found("plugin"))?;
    note.details(loaded_details(&summary));
    Executed::ok(Plugin::from(&summary))
}

pub(crate) async fn use_version(ctx: &Ctx<'_>, plan: PlannedUse) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    note.target("plugin", &plan.connector_id);
    state.plugins.use_version(&plan.connector_id, &plan.to.digest, Some(&access.principal.user_id)).await?;
    let summary = state.plugins.summary(&plan.connector_id).await?.ok_or_else(|| ApiError::not_found("plugin"))?;
    let mut details = loaded_details(&summary);
    details["previous"] = serde_json::to_value(&plan.from).unwrap_or_default();
    note.details(details);
    Executed::ok(Plugin::from(&summary))
}
