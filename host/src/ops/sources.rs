//! Source operations: configuration is validated against the connector's
//! spec, credential handles must name credentials of the workspace, and a
//! source is deleted only once no pipeline uses it.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::act::{Act, Category, Ctx, Executed};
use super::text::check_name;
use crate::access::WorkspaceAccess;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;
use crate::store::credentials::CredentialHandle;
use crate::store::destinations::DeleteRefused;

/// Body of `POST /sources`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateSource {
    /// The connector; a legacy `source:<alias>` is accepted for old saved
    /// configurations and stored as the canonical id.
    pub connector_id: String,
    /// 1 to 200 characters, not only spaces.
    #[schema(min_length = 1, max_length = 200, pattern = r"\S")]
    pub name: String,
    /// Settings matching the connector's spec; credentials by handle only.
    #[schema(value_type = Object)]
    pub configuration: Value,
}

/// Body of `PATCH /sources/{source_id}`: top-level configuration keys are
/// merged (a `null` removes one).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpdateSource {
    /// Taken from the path.
    #[serde(default)]
    #[schema(ignore)]
    pub source_id: String,
    pub name: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub configuration: Option<Value>,
}

/// A schema error as a sentence, cut to a fit length: a value that must
/// be an https URL says so rather than quoting the pattern it failed.
fn schema_message(raw: &str) -> String {
    if raw.contains("does not match \"^https://") {
        return "must be an https:// URL (plain http is never used)".into();
    }
    raw.chars().take(200).collect()
}

/// Validates a configuration for a connector: its JSON Schema, its
/// credential handles, and connector-specific rules.
pub(super) async fn validate_configuration(
    state: &AppState,
    access: &WorkspaceAccess,
    connector_id: &str,
    config: &Value,
    saved: Option<&Value>,
) -> ApiResult<()> {
    match crate::connectors::rules(connector_id).and_then(|r| r.config_limits()) {
        Some(limits) => super::text::check_config_within("configuration", config, limits.bytes, limits.string_chars)?,
        None => super::text::check_config("configuration", config)?,
    }
    let plugin = state.plugins.available(connector_id).await?;
    let validator = jsonschema::validator_for(&plugin.info.config_schema).map_err(|e| {
        ApiError::internal(anyhow::anyhow!("connector {connector_id} has an invalid config schema: {e}"))
    })?;
    let errors: Vec<Value> = validator
        .iter_errors(config)
        .take(20)
        .map(|e| json!({ "path": e.instance_path().to_string(), "message": schema_message(&e.to_string()) }))
        .collect();
    if !errors.is_empty() {
        return Err(ApiError::bad_request(
            "CONFIGURATION_INVALID",
            "the configuration does not match the connector's spec",
        )
        .with_details(json!({ "field": "configuration", "errors": errors })));
    }
    for (key, handle) in CredentialHandle::in_configuration(config) {
        state
            .vault
            .require_handle(&access.workspace_id, &handle, None)
            .await
            .map_err(|e| e.at(&format!("configuration.{key}")))?;
    }
    if let Some(rules) = crate::connectors::rules(connector_id) {
        rules.validate_source(state, access, config, saved).await?;
    }
    Ok(())
}

pub(crate) async fn create(ctx: &Ctx<'_>, req: CreateSource) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    check_name("name", &req.name)?;
    let connector_id = state
        .plugins
        .canonical_id(&req.connector_id)
        .ok_or_else(|| ApiError::invalid_field("connector_id", "unknown connector"))?;
    validate_configuration(state, access, &connector_id, &req.configuration, None).await?;
    let source = state
        .store
        .create_source(
            &access.workspace_id,
            &connector_id,
            req.name.trim(),
            &req.configuration,
            &access.principal.user_id,
        )
        .await?;
    note.target("source", &source.source_id);
    Executed::created(source)
}

pub(crate) async fn update(ctx: &Ctx<'_>, req: UpdateSource) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    note.target("source", &req.source_id);
    let current =
        state.store.source(&access.workspace_id, &req.source_id).await?.ok_or_else(|| ApiError::not_found("source"))?;
    let name = req.name.unwrap_or(current.name);
    check_name("name", &name)?;
    let saved = current.configuration.clone();
    let configuration = super::patch::merge_configuration(current.configuration, req.configuration)?;
    validate_configuration(state, access, &current.connector_id, &configuration, Some(&saved)).await?;
    let source = state
        .store
        .update_source(&access.workspace_id, &req.source_id, name.trim(), &configuration)
        .await?
        .ok_or_else(|| ApiError::not_found("source"))?;
    Executed::ok(source)
}

pub(crate) async fn delete(ctx: &Ctx<'_>, source_id: &str) -> ApiResult<Executed> {
    let (state, access, note) = (ctx.state, ctx.access, ctx.note);
    note.target("source", source_id);
    match state.store.delete_source(&access.workspace_id, source_id).await? {
        Err(DeleteRefused::NotFound) => Err(ApiError::not_found("source")),
        Err(DeleteRefused::InUse { ids, .. }) => Err(ApiError::conflict(
            "SOURCE_IN_USE",
            "connections still use this source: delete them first (DELETE /v1/connections/{connection_id}), then delete the source",
        )
        .with_details(json!({ "connection_ids": ids }))),
        Ok(()) => {
            // Read back: the flag is true only if the source is really gone.
            let gone = state.store.source(&access.workspace_id, source_id).await?.is_none();
            Executed::ok(json!({ "source_id": source_id, "deleted": true, "deletion_verified": gone }))
        }
    }
}

/// Source operations.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "operation", rename_all = "snake_case")]
#[expect(
    clippy::enum_variant_names,
    reason = "the variants name the operations stored in proposals (`create_source`, ...)"
)]
pub(crate) enum SourceOp {
    /// Create a source.
    CreateSource(CreateSource),
    /// Change a source's name or configuration.
    UpdateSource(UpdateSource),
    /// Delete a source no pipeline uses.
    DeleteSource { source_id: String },
}

impl Act for SourceOp {
    fn action(&self) -> &'static str {
        match self {
            SourceOp::CreateSource(_) => "sources.create",
            SourceOp::UpdateSource(_) => "sources.update",
            SourceOp::DeleteSource { .. } => "sources.delete",
        }
    }

    fn category(&self) -> Category {
        Category::Sources
    }

    fn summary(&self) -> String {
        match self {
            SourceOp::CreateSource(s) => {
                format!("Create source \"{}\" with connector {}", s.name.trim(), s.connector_id)
            }
            SourceOp::UpdateSource(s) => format!("Update source {}", s.source_id),
            SourceOp::DeleteSource { source_id } => format!("Delete source {source_id}"),
        }
    }
}

impl SourceOp {
    pub(super) async fn run(self, ctx: &Ctx<'_>) -> ApiResult<Executed> {
        match self {
            SourceOp::CreateSource(req) => create(ctx, req).await,
            SourceOp::UpdateSource(req) => update(ctx, req).await,
            SourceOp::DeleteSource { source_id } => delete(ctx, &source_id).await,
        }
    }
}
